#pragma once
// Building blocks of idemkafka-bench: clocks, a fixed-size latency histogram,
// CPU and memory meters, the deterministic data set, payload codec, and the
// PostgreSQL and Kafka set-up every mode shares.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include <idemkafka/config.hpp>
#include <idemkafka/event_id.hpp>

namespace idemkafka::bench {

using SteadyClock = std::chrono::steady_clock;

/// Microseconds since the Unix epoch: the produce timestamp in payloads. The
/// producer and the consumers live in this one process, so one clock serves both.
std::int64_t wall_us() noexcept;
/// Microseconds on the steady clock, for intervals measured inside the process.
std::int64_t steady_us() noexcept;
double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) noexcept;

/// Log-linear histogram of microsecond values: 64 sub-buckets per power of two
/// (under 1.6% error), fixed size, so recording a million samples costs no
/// memory that would show up in the RSS comparison between 10k and 1M runs.
class Histogram {
public:
    void record(std::int64_t us) noexcept;
    void merge(const Histogram& other) noexcept;
    std::uint64_t count() const noexcept { return count_; }
    /// Value at percentile `p` (0..100) in milliseconds; 0 when empty.
    double percentile_ms(double p) const noexcept;
    double max_ms() const noexcept { return static_cast<double>(max_) / 1000.0; }

private:
    static constexpr int sub_bits = 6;
    static constexpr std::size_t sub = std::size_t{1} << sub_bits;
    static constexpr std::size_t buckets = sub + (64 - sub_bits) * sub;
    static std::size_t index_of(std::uint64_t v) noexcept;
    static std::uint64_t value_of(std::size_t index) noexcept;
    std::array<std::uint64_t, buckets> counts_{};
    std::uint64_t count_ = 0;
    std::int64_t max_ = 0;
};

/// Latencies of committed effects, recorded from any thread.
class LatencyRecorder {
public:
    /// `produced_us` is a wall_us() stamp, `taken_us` a steady_us() stamp (or -1).
    void record(std::int64_t produced_us, std::int64_t taken_us, std::int64_t now_wall, std::int64_t now_steady);
    Histogram end_to_end() const;
    Histogram taken_to_commit() const;
    std::uint64_t count() const;

private:
    mutable std::mutex mu_;
    Histogram e2e_;
    Histogram taken_;
};

/// CPU seconds of this process and of its threads, PostgreSQL's server
/// processes and the mock broker, at one instant.
struct CpuSample {
    double process = 0;                                    // getrusage: user + sys, all threads
    std::map<int, std::pair<std::string, double>> threads; // tid -> (name, seconds on CPU)
    double postgres = -1;                                  // -1: not measurable (remote server)
    double broker = -1;
    double machine_busy = 0; // all CPUs, /proc/stat (non-idle time)
    SteadyClock::time_point at = SteadyClock::now();
};

/// CPU per event of a run, split by where it was spent, in microseconds.
struct CpuSplit {
    double process = 0; ///< whole bench process
    double rdkafka = 0; ///< librdkafka's own threads (named rdk:*)
    double app = 0;     ///< every other thread: consumer loop, library, libpq client, handler
    double postgres = -1;
    double broker = -1;
    /// CPU cores kept busy by everything else on the machine during the run
    /// (not per event): other work on a shared machine skews the numbers.
    double other_cores = 0;
};

/// Finds the PostgreSQL and mock broker processes (when they run on this
/// machine) and samples CPU and memory.
class Meter {
public:
    /// `pg_backend_pid`: pid of any backend of the server (its parent is the
    /// postmaster); `broker_control`: the mock broker's control FIFO path, found in
    /// its command line. Either may be unknown (0 / empty).
    Meter(int pg_backend_pid, const std::string& broker_control);
    CpuSample sample() const;
    static CpuSplit split(const CpuSample& a, const CpuSample& b, std::size_t events);
    /// Returns freed heap to the system and resets the kernel's peak-RSS mark, so
    /// the next peak_rss_mb() is the peak of the run that follows.
    static void reset_peak();
    static double rss_mb();
    static double peak_rss_mb();
    bool has_postgres() const noexcept { return postmaster_ > 0; }
    bool has_broker() const noexcept { return broker_ > 0; }

private:
    double postgres_cpu() const;
    int postmaster_ = 0;
    int broker_ = 0;
};

/// The records of the benchmark data, computed rather than stored (a stored
/// million-record set would skew the RSS of the run consuming it). Record
/// `seq` is a function of (seq, duplicate percentage, seed) only, so a
/// 10k-record topic holds exactly the first 10k records of the 1M-record one:
/// every mode and every size sees the same data.
class Dataset {
public:
    Dataset(int dup_percent, std::uint64_t seed);

    struct Rec {
        std::size_t seq;   ///< position in the stream: unique per record
        std::size_t event; ///< index of the event: a re-send repeats an earlier one
        bool resend;
    };

    int dup_percent() const noexcept { return dup_percent_; }
    /// Distinct events among the first `count` records.
    std::size_t unique_in(std::size_t count) const noexcept { return count - dups_before(count); }
    Rec at(std::size_t seq) const noexcept;
    /// UUIDv7 of event `event`, increasing with the index like ids minted live.
    EventId id_of(std::size_t event) const noexcept;
    /// Message key (the entity): keeps a re-send in the partition of its original.
    std::string key_of(std::size_t event) const;

private:
    std::size_t dups_before(std::size_t seq) const noexcept
    {
        return seq * static_cast<std::size_t>(dup_percent_) / 100;
    }
    int dup_percent_;
    std::uint64_t seed_;
    std::uint64_t base_ms_;
};

/// Business amount of an event: derived from its id so every mode computes the
/// same value without it travelling in the payload.
std::int64_t amount_of(const EventId& id) noexcept;

/// Payload: "<event id>,<seq>,<produced wall_us>". Small on purpose: the mock
/// broker keeps at most ~5 MiB per partition.
std::string encode_payload(const EventId& id, std::size_t seq, std::int64_t produced_us);

struct Decoded {
    EventId id;
    std::array<char, 37> id_text{}; // NUL-terminated canonical text, passed to libpqxx as is
    std::int64_t seq = 0;
    std::int64_t produced_us = 0;
};
/// Throws idemkafka::DecodeError / InvalidEventId for a malformed payload.
Decoded decode_payload(std::string_view payload);

/// A set of bits, one per record sequence number: proves each record was seen.
class SeenSet {
public:
    explicit SeenSet(std::size_t n) : bits_((n + 63) / 64, 0), n_(n) {}
    /// Returns true the first time `seq` is marked; false for a repeat or out of range.
    bool mark(std::int64_t seq) noexcept;
    std::size_t distinct() const noexcept { return distinct_; }

private:
    std::vector<std::uint64_t> bits_;
    std::size_t n_;
    std::size_t distinct_ = 0;
};

// ---- PostgreSQL ------------------------------------------------------------

/// The two tables of one mode: claims (idemkafka's processed_event shape) and
/// the business effect, one row per claimed event. The effect table has no
/// index: the floor then is the cheapest one-durable-row-per-event shape.
struct Tables {
    std::string schema;                // unquoted
    std::string claims;                // unquoted table name
    std::string effect;                // unquoted table name
    std::string claims_q;              // "schema"."claims"
    std::string effect_q;              // "schema"."effect"
    std::string insert_effect;         // INSERT ... VALUES ($1::uuid, $2, $3, $4)
    std::string insert_effects_unnest; // INSERT ... SELECT unnest(...) x4
    /// SQL condition selecting the claims of this run (prefilled table: the
    /// ids above the prefill), or empty: every row of the claims table.
    std::string claims_of_run;
};

/// Where a mode's claims go.
struct ClaimsLayout {
    /// The table's layout, created by migrate_schema() as a consumer with that
    /// RetentionConfig::mode creates it: partitioned (the default) or plain.
    RetentionMode mode = RetentionMode::partitioned;
    /// Non-empty: claim into this prefilled table (see prefill_claims())
    /// instead of one of the mode's own; its rows below `run_ids_from` are the
    /// prefill and stay, the rest (earlier runs' claims) is deleted first.
    std::string prefilled_table;
    EventId run_ids_from;
};

/// The names and statements of the tables of `mode` (what prepare_tables()
/// returns), without touching the database: for a child process running the
/// consumer of a run whose tables the bench prepared.
Tables table_names(const std::string& schema, const std::string& mode, const ClaimsLayout& layout);

/// Creates (if missing) and empties the tables of `mode`, then checkpoints, so
/// every run starts from empty tables (or from the prefill alone) and no
/// checkpoint of an earlier run's WAL lands inside it.
Tables prepare_tables(const std::string& conninfo, const std::string& schema, const std::string& mode,
                      const ClaimsLayout& layout);

/// Creates claims table `schema`.`table` in `mode` with migrate_schema(), as
/// a consumer configured with that mode does at start-up (partitioned: with
/// the partitions of the retention window and those ahead). A no-op for a table
/// that exists.
void create_claims_table(pqxx::connection& conn, const std::string& schema, const std::string& table,
                         RetentionMode mode);

/// Effect rows, distinct event ids among them, and claim rows.
struct DbCounts {
    std::int64_t effects = 0;
    std::int64_t distinct_effects = 0;
    std::int64_t claims = 0;
};
DbCounts count_rows(const std::string& conninfo, const Tables& t);

/// Prepares `name` as `sql` once per connection; later calls are no-ops. For
/// statements prepared from inside a handler, which cannot know whether its
/// transaction's connection has seen them.
void prepare_once(pqxx::connection_base& conn, const std::string& name, const std::string& sql);

/// Array literal `{a,b,c}` of plain tokens (no quoting needed: ids, keys, numbers).
template <class It, class Fn> std::string array_literal(It first, It last, Fn&& token)
{
    std::string out = "{";
    for (It it = first; it != last; ++it) {
        if (out.size() > 1)
            out.push_back(',');
        out += token(*it);
    }
    out.push_back('}');
    return out;
}

// ---- Kafka -----------------------------------------------------------------

/// Where the bench finds its services.
struct Services {
    std::string brokers;
    std::string postgres;
    std::string mock_control; // empty: a real cluster, topics via the admin API
};

/// Consumer properties shared by every Kafka mode (the library sets its own
/// commit properties on top; the plain modes set theirs).
std::map<std::string, std::string> common_consumer_props();

/// Creates `name` with `partitions` partitions and waits until the metadata shows them.
void create_topic(const Services& s, const std::string& name, int partitions);

/// Sum of high watermarks and the lowest low watermark over the partitions of `topic`.
struct Watermarks {
    std::int64_t high_sum = 0;
    std::int64_t low_min = 0;
    int partitions = 0;
};
Watermarks watermarks(const Services& s, const std::string& topic);
/// Sum over the partitions of `topic` of `group`'s committed offsets (0 where
/// it has none).
std::int64_t committed_sum(const Services& s, const std::string& topic, const std::string& group);

/// Publishes records [0, count) of `data` to `topic` as fast as the producer
/// goes, and waits for every acknowledgement.
void produce_all(const Services& s, const std::string& topic, const Dataset& data, std::size_t count,
                 std::size_t batch_messages = 10000);

/// Publishes records [0, count) of `data` at `rate` per second (payload
/// timestamps taken when each is sent), waits for acknowledgements. After the
/// first `warmup` records it waits until `processed()` reaches `warmup`, then
/// goes on at the same rate. Stops early when `abort` becomes true.
void produce_paced(const Services& s, const std::string& topic, const Dataset& data, std::size_t count, double rate,
                   std::size_t warmup, const std::function<std::size_t()>& processed, const std::atomic<bool>& abort);

/// Waits until `processed()` reaches `n`, `abort` is set or 60 s pass.
void wait_processed(std::size_t n, const std::function<std::size_t()>& processed, const std::atomic<bool>& abort);

/// Names the calling thread (visible in /proc and perf as the thread's comm).
void name_thread(const char* name) noexcept;

/// A consumer's run() on a thread of its own ("ik-run"), stopped and joined
/// when the scope ends, whatever happens in it.
template <class Consumer> class ConsumerThread {
public:
    explicit ConsumerThread(Consumer& consumer) : consumer_(consumer), thread_([this] { run(); }) {}
    ~ConsumerThread() { stop(); }
    ConsumerThread(const ConsumerThread&) = delete;
    ConsumerThread& operator=(const ConsumerThread&) = delete;

    /// run() returned (it threw, or the consumer stopped).
    bool finished() const noexcept { return finished_.load(); }

    /// Stops the consumer and waits for run(); what run() threw, or "".
    std::string stop()
    {
        if (thread_.joinable()) {
            consumer_.stop();
            thread_.join();
        }
        if (!failure_)
            return {};
        try {
            std::rethrow_exception(failure_);
        } catch (const std::exception& e) {
            return e.what();
        } catch (...) {
            return "non-standard exception";
        }
    }

private:
    void run()
    {
        name_thread("ik-run");
        try {
            consumer_.run();
        } catch (...) {
            failure_ = std::current_exception();
        }
        finished_ = true;
    }

    Consumer& consumer_;
    std::exception_ptr failure_;
    std::atomic<bool> finished_{false};
    std::thread thread_; // last: it starts once the rest is built
};

} // namespace idemkafka::bench
