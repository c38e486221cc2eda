#pragma once
// The benchmark modes. Each run consumes `count` records of one data set (from
// a Kafka topic, or generated in process for the PostgreSQL floors), writes
// into its own freshly emptied tables, and verifies what it wrote.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <idemkafka/config.hpp>

#include "bench_util.hpp"

namespace idemkafka::bench {

/// True when ConsumerConfig has a `workers` member (parallel PostgreSQL
/// workers): the idemkafka_batch_wN rows exist only then.
template <class T, class = void> struct HasWorkers : std::false_type {
};
template <class T> struct HasWorkers<T, std::void_t<decltype(std::declval<T&>().workers)>> : std::true_type {
};
inline constexpr bool library_has_workers = HasWorkers<ConsumerConfig>::value;

/// Sets `cfg.workers` when the member exists; a no-op otherwise.
template <class Config> void set_workers(Config& cfg, int workers)
{
    if constexpr (HasWorkers<Config>::value) {
        using W = std::decay_t<decltype(cfg.workers)>;
        cfg.workers = static_cast<W>(workers);
    } else {
        (void)cfg;
        (void)workers;
    }
}

enum class Kind {
    kafka_raw,
    pg_floor_per_event,
    pg_floor_batch,
    pg_floor_batch_rowwise,
    idemkafka,
    idemkafka_share, ///< IdempotentShareConsumer (only with the share consumer)
    naive_listener,
    spring, ///< the Spring Kafka peer, a child JVM (bench/peers/spring)
};

/// The order an idemkafka_batch run took its records in: their sequence
/// numbers as the consumer decoded them, and the records of each transaction
/// it committed, in turn. pg_floor_batch_library_order replays it.
struct LibraryOrder {
    std::vector<std::uint32_t> seqs;
    std::vector<std::uint32_t> batches;
};

struct Job {
    std::string mode; ///< row name, e.g. "idemkafka_batch_w4"
    Kind kind = Kind::kafka_raw;
    const Dataset* data = nullptr;
    std::size_t count = 0; ///< records to consume
    std::string topic;     ///< Kafka modes: the topic, holding exactly `count` records
    /// Floors: the records' sequence numbers in the order they are taken; null:
    /// production order. pg_floor_batch_fetch_order takes them in the order a
    /// plain consumer of `topic` received them (read_fetch_order()).
    const std::vector<std::uint32_t>* order = nullptr;
    /// Floors: the records of each transaction, in turn (the library's own
    /// with pg_floor_batch_library_order); null, or once used up: `batch`.
    const std::vector<std::uint32_t>* batches = nullptr;
    /// idemkafka: where to note the order the consumer took the records in;
    /// null: not noted.
    LibraryOrder* note_order = nullptr;
    bool paced = false; ///< records are produced during the run at `rate`
    double rate = 0;
    /// Paced: records [0, warmup) are produced first; the rest follows once the
    /// consumer has processed them, and only the rest counts for latency (the
    /// first records of a run meet connection set-up and first fetches).
    std::size_t warmup = 0;
    std::size_t batch = 1;                   ///< floors: records per transaction; idemkafka: max_batch
    bool per_record_tx = false;              ///< idemkafka: ConsumerConfig::transaction_per_record
    std::chrono::milliseconds batch_wait{0}; ///< floors, paced: longest wait to fill a batch
    int workers = 0;                         ///< idemkafka: 0 leaves the library's default
    int share_members = 0;                   ///< idemkafka_share: ShareConsumerConfig::members
    bool batch_handler = false;              ///< idemkafka: one multi-row insert per transaction
    /// idemkafka, mixed workload: every `slow_every`-th record (by sequence
    /// number) holds its handler call for `slow_for`; 0: none.
    int slow_every = 0;
    std::chrono::milliseconds slow_for{0};
    bool key_ordering = false; ///< idemkafka: Ordering::key (else partition)
    bool fingerprint = false;  ///< idemkafka: ConsumerConfig::payload_fingerprint
    /// Claims in a plain table, RetentionConfig::mode = purge for the library;
    /// otherwise partitioned, the consumer's default.
    bool plain_claims = false;
    /// Claims into the prefilled table (RunEnv::prefill_table).
    bool prefilled = false;
    int serial = 0; ///< unique per run: names groups and statements
    /// spring: the peer's listener ("per_record" or "batch"), its container's
    /// AckMode ("MANUAL_IMMEDIATE" or "MANUAL") and its container concurrency.
    std::string spring_mode;
    std::string spring_ack_mode;
    int spring_concurrency = 1;
    /// The kill -9 run (spring, idemkafka): SIGKILL the consumer's process (the
    /// peer's JVM, or a child running the library's consumer) this many times
    /// at random moments, restarting it each time, then run it until idle;
    /// 0: one clean run in the usual way.
    int kills = 0;
    std::uint64_t kill_seed = 1;
};

struct Result {
    std::string mode;
    int round = 1; ///< --rounds: which pass over the modes (1 when there is one)
    int dup_percent = 0;
    std::size_t events = 0; ///< records consumed
    std::size_t unique = 0; ///< distinct events among them (effects expected)
    /// Mixed workload: handler calls held `slow_for`, the records whose sequence
    /// number is a multiple of `slow_every` and that are not re-sends (a re-send
    /// is skipped as a duplicate, its handler never called).
    std::size_t slow_calls = 0;
    double slow_seconds = 0; ///< Job::slow_for of those calls
    bool paced = false;
    double rate = 0;
    double seconds = 0;         ///< first record taken -> last effect committed
    double startup_seconds = 0; ///< run start -> first record taken (group join, first fetch)
    double wall_seconds = 0;    ///< the whole run, set-up and verification included
    double events_per_s = 0;
    std::uint64_t transactions = 0;
    Histogram end_to_end;      ///< produce timestamp -> effect committed (meaningful when paced)
    Histogram taken_to_commit; ///< record reached the consumer -> effect committed
    bool has_cpu = false;
    CpuSplit cpu;
    double rss_start_mb = 0;
    double rss_peak_mb = 0;
    /// idemkafka: largest minus smallest per-partition lag (records), sampled
    /// every 200 ms while the backlog drains: its maximum and its mean.
    /// -1 when not sampled.
    double lag_spread_max = -1;
    double lag_spread_mean = -1;
    std::size_t lag_spread_samples = 0;
    std::size_t partitions = 0; ///< partitions of the topic drained (Kafka modes)
    /// The kill -9 run (Job::kills): effect rows beyond one per event, and
    /// events without one, counted after the last incarnation; -1 otherwise.
    std::int64_t kill_doubled = -1;
    std::int64_t kill_missing = -1;
    std::vector<std::string> notes;  ///< measurement caveats (not failures)
    std::vector<std::string> errors; ///< lost or doubled records, failures
    bool ok() const { return errors.empty(); }
};

/// How to start the Spring Kafka peer (--spring-jar).
struct SpringPeer {
    std::string jar;       ///< runnable jar (scripts/spring-peer.sh); empty: no Spring modes
    std::string java_opts; ///< JVM options, space-separated
    std::string jdbc_url;  ///< the bench's PostgreSQL as a JDBC URL
    std::string work_dir;  ///< where the peer's logs and latency files go
};

struct RunEnv {
    Services services;
    std::string schema; ///< PostgreSQL schema of the bench tables
    const Meter* meter = nullptr;
    bool verbose = false;
    /// Extra consumer properties for every Kafka mode (--consumer-prop), over
    /// common_consumer_props(): for what-if runs such as a smaller prefetch.
    std::map<std::string, std::string> consumer_props;
    /// ConsumerConfig::pipeline of the library modes (--no-pipeline: false).
    bool pipeline = true;
    /// ConsumerConfig::batches_per_unit of the library modes (--batches-per-unit).
    std::size_t batches_per_unit = 1;
    /// ConsumerConfig::optimistic_claims of the library modes (--no-optimistic-claims: false).
    bool optimistic_claims = true;
    /// --prefill: the prefilled claims table, and the lowest id a run claims in it.
    std::string prefill_table;
    EventId prefill_run_ids_from;
    SpringPeer spring;
};

/// Called once the consumer can receive records (assigned, or at once for the
/// floors) with the run's count of processed records; paced runs start
/// producing then. Shared: a producer thread may outlive the run by a moment.
using Counter = std::shared_ptr<const std::atomic<std::size_t>>;
using OnReady = std::function<void(Counter processed)>;

/// Runs one job. Never throws: failures end up in Result::errors.
Result run_job(const RunEnv& env, const Job& job, const OnReady& on_ready);

/// The consumer group of a run: "ikbench-run-" and the run's serial, the
/// same length for every mode, since every claim row and primary-key entry
/// carries it (the floors' too) and its length is part of their cost.
std::string group_of(const Job& job);

// The modes, called by run_job after the tables are prepared.
struct RunState;
void run_kafka_raw(const RunEnv& env, const Job& job, RunState& st);
/// The sequence numbers of `job.topic`'s records in the order a plain
/// consumer (the Kafka modes' properties, a new group) receives them: untimed,
/// before a floor runs in that order. Throws when the topic cannot be read.
std::vector<std::uint32_t> read_fetch_order(const RunEnv& env, const Job& job);
void run_naive_listener(const RunEnv& env, const Job& job, RunState& st);
void run_pg_floor(const RunEnv& env, const Job& job, RunState& st);
void run_idemkafka(const RunEnv& env, const Job& job, RunState& st);
void run_idemkafka_share(const RunEnv& env, const Job& job, RunState& st);
void run_spring(const RunEnv& env, const Job& job, RunState& st);
/// The library's kill -9 run: run_child_consumer in a child process,
/// SIGKILLed job.kills times and restarted (run_kill9).
void run_idemkafka_kill9(const RunEnv& env, const Job& job, RunState& st);
/// `idemkafka-bench --child-consumer ...` (argv after that flag): runs the
/// consumer of one idemkafka mode until killed or idle, printing ASSIGNED and
/// PROGRESS lines on stdout; the process's exit status.
int run_child_consumer(int argc, char** argv);

/// What a mode hands back to run_job; shared so the modes stay short.
struct RunState {
    Tables tables;
    Result& result;
    const OnReady& on_ready;
    LatencyRecorder latency;
    CpuSample cpu_before;
    CpuSample cpu_after; ///< taken by the mode when the last record is committed
    bool cpu_taken = false;
    std::int64_t first_taken_us = -1; ///< steady_us() of the first record
    std::int64_t last_commit_us = -1; ///< steady_us() of the last commit
    std::size_t effects_reported = 0; ///< effects the mode itself counted as committed
    /// A mode run in a child process (spring): its CPU seconds from the first
    /// record taken to the last commit, over its whole life, and its peak RSS.
    /// -1: not a child process.
    double child_cpu_seconds_run = -1;
    double child_cpu_seconds_total = -1;
    double child_rss_peak_mb = -1;
    /// Records processed so far (any thread may read it): paces the warm-up.
    std::shared_ptr<std::atomic<std::size_t>> processed = std::make_shared<std::atomic<std::size_t>>(0);

    RunState(Result& r, const OnReady& ready) : result(r), on_ready(ready) {}
    /// The mode is ready for records: the first call runs on_ready (which may
    /// start the paced producer), later ones (the Spring peer's ASSIGNED
    /// after a rebalance) do nothing.
    void ready()
    {
        if (readied_)
            return;
        readied_ = true;
        on_ready(processed);
    }
    void set_processed(std::size_t n) noexcept { processed->store(n); }
    /// Whether the record with sequence number `seq` counts for latency.
    bool measured(std::int64_t seq, const Job& job) const noexcept
    {
        return seq >= static_cast<std::int64_t>(job.warmup);
    }
    void take_cpu_after(const Meter& m)
    {
        cpu_after = m.sample();
        cpu_taken = true;
    }

private:
    bool readied_ = false;
};

/// How long a run may go without progress before it is declared stuck (and
/// its missing records reported as lost).
inline constexpr std::chrono::seconds stall_timeout{30};
/// Before the first record: group join and first fetch on a loaded machine.
inline constexpr std::chrono::seconds first_record_timeout{90};

} // namespace idemkafka::bench
