// idemkafka-bench: measures idemkafka against the raw limits of its parts
// (Kafka consumption alone, PostgreSQL's own rate for the same rows) and
// against a hand-written listener, in one process, on the same data, the same
// PostgreSQL and the same broker. scripts/bench.sh provides the services.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include <sys/utsname.h>
#include <unistd.h>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <pqxx/pqxx>

#include <idemkafka/features.hpp>
#include <idemkafka/store.hpp>

#include "modes.hpp"
#include "prefill.hpp"
#include "report.hpp"

#ifndef IDEMKAFKA_BENCH_VERSION
#define IDEMKAFKA_BENCH_VERSION "unknown"
#endif
#ifndef IDEMKAFKA_BENCH_BUILD_TYPE
#define IDEMKAFKA_BENCH_BUILD_TYPE "unknown"
#endif

namespace ik = idemkafka;
using namespace idemkafka::bench;

namespace {

const char* const usage = R"(usage: idemkafka-bench [options]

Runs every mode on the same data against one PostgreSQL and one Kafka broker,
prints tables and writes a JSON report. scripts/bench.sh starts throwaway
services and runs this; by hand, point it at your own:

  --brokers HOST:PORT    bootstrap servers (default $IDEMKAFKA_TEST_BROKERS)
  --postgres CONNINFO    libpq connection string (default $IDEMKAFKA_TEST_PG)
  --control FIFO         mock broker control FIFO, to create topics on the mock
                         cluster (default $IDEMKAFKA_MOCK_CONTROL; unset: topics
                         are created with the admin API)
  --events LIST          record counts, comma-separated (default 10000,100000,1000000)
  --dups LIST            duplicate shares in percent (default 0,30)
  --modes LIST           modes to run (default: all of the first group), from
                         kafka_raw, pg_floor_per_event, pg_floor_batch,
                         pg_floor_batch_fetch_order (pg_floor_batch with the
                         records in the order a plain consumer of the topic
                         receives them, read untimed first: a partition at a
                         time, where pg_floor_batch claims in production order),
                         pg_floor_batch_library_order (pg_floor_batch with the
                         records and transactions of the round's, or the last
                         round's, idemkafka_batch run, which it needs),
                         pg_floor_batch_rowwise, idemkafka_per_event (one
                         transaction per record: transaction_per_record),
                         idemkafka_per_event_max_batch1 (the same with
                         max_batch = 1 instead), idemkafka_batch,
                         idemkafka_batch_plain, idemkafka_batch_rowwise,
                         idemkafka_batch_wN, idemkafka_per_event_wN (only when
                         named: idemkafka_per_event on N workers),
                         naive_listener; and, only when named (or with --mixed,
                         --full, --prefill): idemkafka_batch_fingerprint
                         (idemkafka_batch with ConsumerConfig::payload_fingerprint;
                         at 0% re-sends only, as the bench's re-sends are not
                         byte for byte their originals),
                         idemkafka_mixed_partition, idemkafka_mixed_key,
                         idemkafka_mixed_fast, idemkafka_handler5ms_partition,
                         idemkafka_handler5ms_key, idemkafka_share_handler5ms
                         (built with a librdkafka that has the share consumer,
                         2.15 or later: scripts/bench.sh --lane modern),
                         idemkafka_batch_prefilled, idemkafka_per_event_prefilled.
                         Claims tables are partitioned, as the consumer's default
                         configuration creates them; idemkafka_batch_plain is
                         idemkafka_batch on a plain table (RetentionMode::purge)
  --full                 every mode: the default ones, idemkafka_batch_fingerprint,
                         the mixed and the 5 ms handler modes (at most
                         --mixed-max records each, no paced runs) and, with
                         --prefill, the prefilled ones
  --rounds N             run every drain N times (default 1), the modes in
                         reverse order every other round; each ratio is then
                         the median of the rounds' ratios, with their range
                         (paced runs: once)
  --prefill ROWS         steady state: before the runs, fill one claims table
                         (partitioned, as by default) with ROWS claims whose ids
                         spread over the retention window (7 days) up to now,
                         then VACUUM ANALYZE; idemkafka_batch_prefilled and
                         idemkafka_per_event_prefilled claim into it (rows of
                         earlier runs deleted first), next to idemkafka_batch and
                         idemkafka_per_event on empty tables (default 0: off;
                         50,000,000 rows take about 7 GB)
  --slow-max N           per-record modes (pg_floor_per_event, idemkafka_per_event,
                         naive_listener) run at most N records (default 10000);
                         the count actually run is reported, never extrapolated
  --rowwise-max N        one-statement-per-row batch modes (pg_floor_batch_rowwise,
                         idemkafka_batch_rowwise) run at most N records
                         (default 100000)
  --workers LIST         worker counts of the idemkafka_batch_wN rows (default 2:
                         the cores of the reference machine; only when the
                         library has ConsumerConfig::workers)
  --partitions N         partitions of the data topics (default 32; raised when a
                         count would not fit the mock broker's ~5 MiB per partition)
  --latency-rate R       events/s of the paced latency runs (default 200: well
                         below what the per-record modes sustain, so the figure
                         is latency, not queueing)
  --latency-seconds S    length of each paced run (default 3; 0 skips them)
  --consumer-prop K=V    extra librdkafka consumer property for every Kafka mode,
                         repeatable (what-if runs, e.g. queued.max.messages.kbytes=8192)
  --no-pipeline          library modes with ConsumerConfig::pipeline = false
                         (batches polled and processed one after the other)
  --batches-per-unit N   library modes with ConsumerConfig::batches_per_unit = N
                         (default 1, the library's default)
  --no-optimistic-claims library modes with ConsumerConfig::optimistic_claims =
                         false (every claim with ON CONFLICT DO NOTHING)
  --quick                smoke run: 10k records, per-record modes at 2000,
                         1 s paced runs at the first --dups share only
  --mixed                mixed workload: 1% of records (every 100th) hold their
                         handler call 200 ms; idemkafka_mixed_partition and
                         idemkafka_mixed_key (per-record handler, --mixed-workers
                         workers, Ordering::partition / Ordering::key) side by
                         side on 20k records, 0% re-sends, no paced runs
                         (--events/--dups given after --mixed still apply);
                         idemkafka_mixed_fast runs the same records with no
                         slow call: its time is the fast path of the ideal
                         each mixed row is compared with; and the 5 ms
                         handler modes (--handler-workers)
  --mixed-max N          mixed and 5 ms handler modes run at most N records
                         (default 20000)
  --producer-batch N     records per producer batch of the data topics
                         (batch.num.messages, default 10000: about 5,000 per
                         partition batch at 1M; a consumer reads a partition in
                         runs of whole batches)
  --mixed-workers N      workers of the mixed modes (default 4)
  --handler-workers N    workers of idemkafka_handler5ms_partition and
                         idemkafka_handler5ms_key (default 64), whose handler
                         takes 5 ms on every record (the workload Confluent's
                         Parallel Consumer is compared on); each is reported
                         against records x 5 ms / workers (/ partitions, for
                         Ordering::partition, when fewer)
  --share-members N      members of idemkafka_share_handler5ms (default 8): a
                         share group (IdempotentShareConsumer) whose handler
                         takes 5 ms on every record, as the 5 ms handler modes';
                         members share the partitions, so more of them than
                         partitions all work (on the mock broker, through its
                         share-assign command once all joined); reported against
                         records x 5 ms / members
  --share-batch N        max_batch of idemkafka_share_handler5ms (default 50): a
                         member works through its batch one call after the
                         other, under the records' locks; 50 x 5 ms = 250 ms
  --spring-jar JAR       the Spring Kafka peer (bench/peers/spring, built by
                         scripts/spring-peer.sh): adds spring_per_record (a
                         @KafkaListener with @Transactional, one transaction per
                         record, AckMode.MANUAL_IMMEDIATE), spring_per_record_manual
                         (the same with AckMode.MANUAL) and spring_batch (a batch
                         listener, one transaction per poll) to the default modes,
                         each a child JVM on the run's topic and tables; they need
                         a real Kafka broker (skipped on the mock cluster)
  --spring-java-opts S   JVM options of the peer (default "-Xms256m -Xmx512m
                         -XX:+UseG1GC")
  --spring-concurrency N listener containers of the peer (default: the topic's
                         partitions)
  --kill N               kill -9 run (joining the default modes):
                         idemkafka_per_event_kill9 and idemkafka_batch_kill9 (the
                         library's consumer in a child process) and, with the
                         Spring peer, spring_per_record_kill9,
                         spring_per_record_manual_kill9 and spring_batch_kill9;
                         the consumer's process SIGKILLed N times at random
                         moments and restarted, then run until idle; reports
                         doubled and missing charges (for the peer not a failure:
                         what the pattern gives; for the library a failure)
  --spring-kill N        the same as --kill N
  --out PATH             JSON report (default bench/results/latest.json)
  --keep                 keep the bench schema in PostgreSQL afterwards
  --verbose              library and librdkafka info logs on stderr
  --plot-data JSON       print gnuplot data from a report and exit
  --help

Exit status: 0 when every run verified its counts, 1 when a run lost or
doubled records or failed, 2 for bad usage.
)";

struct Options {
    Services services;
    std::vector<std::size_t> events = {10000, 100000, 1000000};
    std::vector<int> dups = {0, 30};
    std::set<std::string> modes;
    std::size_t slow_max = 10000;
    std::size_t rowwise_max = 100000;
    std::size_t mixed_max = 20000;
    std::size_t producer_batch = 10000;
    int mixed_workers = 4;
    int handler_workers = 64;
    int share_members = 8;
    std::size_t share_batch = 50;
    std::uint64_t prefill = 0;
    int rounds = 1;
    bool full = false;
    std::vector<int> workers = {2};
    int partitions = 32;
    double latency_rate = 200;
    double latency_seconds = 3;
    std::string out = "bench/results/latest.json";
    std::string plot_data;
    std::string schema = "idemkafka_bench";
    std::map<std::string, std::string> consumer_props;
    bool keep = false;
    bool verbose = false;
    bool pipeline = true;
    std::size_t batches_per_unit = 1;
    bool optimistic_claims = true;
    /// Paced runs at every --dups share; --quick: at the first only (the
    /// drains already check each mode's re-send handling).
    bool paced_every_dup = true;
    std::string spring_jar;
    std::string spring_java_opts = "-Xms256m -Xmx512m -XX:+UseG1GC";
    int spring_concurrency = 0;
    int kills = 0; ///< --kill / --spring-kill
};

[[noreturn]] void fail_usage(const std::string& why)
{
    std::fprintf(stderr, "idemkafka-bench: %s\n(try --help)\n", why.c_str());
    std::exit(2);
}

template <class T> std::vector<T> parse_list(const std::string& flag, const std::string& text)
{
    std::vector<T> out;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
        if (item.empty())
            continue;
        char* end = nullptr;
        const double v = std::strtod(item.c_str(), &end);
        if (!end || *end || v < 0 || v != std::floor(v))
            fail_usage(fmt::format("{}: '{}' is not a non-negative whole number", flag, item));
        out.push_back(static_cast<T>(v));
    }
    if (out.empty())
        fail_usage(flag + ": empty list");
    return out;
}

std::string env_or(const char* name)
{
    const char* v = std::getenv(name);
    return v ? v : "";
}

Options parse_options(int argc, char** argv)
{
    Options o;
    o.services.brokers = env_or("IDEMKAFKA_TEST_BROKERS");
    o.services.postgres = env_or("IDEMKAFKA_TEST_PG");
    o.services.mock_control = env_or("IDEMKAFKA_MOCK_CONTROL");
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc)
                fail_usage(arg + " needs a value");
            return argv[++i];
        };
        if (arg == "--help" || arg == "-h") {
            std::fputs(usage, stdout);
            std::exit(0);
        } else if (arg == "--brokers") {
            o.services.brokers = value();
        } else if (arg == "--postgres") {
            o.services.postgres = value();
        } else if (arg == "--control") {
            o.services.mock_control = value();
        } else if (arg == "--events") {
            o.events = parse_list<std::size_t>(arg, value());
        } else if (arg == "--dups") {
            o.dups = parse_list<int>(arg, value());
            for (int d : o.dups)
                if (d > 90)
                    fail_usage("--dups: at most 90 percent");
        } else if (arg == "--modes") {
            std::stringstream in(value());
            for (std::string m; std::getline(in, m, ',');)
                if (!m.empty())
                    o.modes.insert(m);
        } else if (arg == "--slow-max") {
            o.slow_max = parse_list<std::size_t>(arg, value()).front();
        } else if (arg == "--rowwise-max") {
            o.rowwise_max = parse_list<std::size_t>(arg, value()).front();
        } else if (arg == "--workers") {
            o.workers = parse_list<int>(arg, value());
        } else if (arg == "--partitions") {
            o.partitions = std::max(1, parse_list<int>(arg, value()).front());
        } else if (arg == "--latency-rate") {
            o.latency_rate = static_cast<double>(parse_list<std::size_t>(arg, value()).front());
        } else if (arg == "--latency-seconds") {
            o.latency_seconds = static_cast<double>(parse_list<std::size_t>(arg, value()).front());
        } else if (arg == "--consumer-prop") {
            const std::string kv = value();
            const auto eq = kv.find('=');
            if (eq == std::string::npos || eq == 0)
                fail_usage("--consumer-prop: expected KEY=VALUE, got '" + kv + "'");
            o.consumer_props[kv.substr(0, eq)] = kv.substr(eq + 1);
        } else if (arg == "--no-pipeline") {
            o.pipeline = false;
        } else if (arg == "--no-optimistic-claims") {
            o.optimistic_claims = false;
        } else if (arg == "--batches-per-unit") {
            o.batches_per_unit = parse_list<std::size_t>(arg, value()).front();
            if (o.batches_per_unit < 1 || o.batches_per_unit > 64)
                fail_usage("--batches-per-unit: expected 1 to 64");
        } else if (arg == "--quick") {
            quick = true;
        } else if (arg == "--mixed") {
            o.modes = {"idemkafka_mixed_partition", "idemkafka_mixed_key", "idemkafka_mixed_fast",
                       "idemkafka_handler5ms_partition", "idemkafka_handler5ms_key"};
            o.events = {20000};
            o.dups = {0};
            o.latency_seconds = 0;
        } else if (arg == "--full") {
            o.full = true;
        } else if (arg == "--rounds") {
            o.rounds = std::atoi(value().c_str());
            if (o.rounds < 1 || o.rounds > 20)
                fail_usage("--rounds: 1 to 20");
        } else if (arg == "--prefill") {
            o.prefill = parse_list<std::uint64_t>(arg, value()).front();
        } else if (arg == "--handler-workers") {
            o.handler_workers = parse_list<int>(arg, value()).front();
            if (o.handler_workers < 1)
                fail_usage("--handler-workers: at least 1");
        } else if (arg == "--share-members") {
            o.share_members = parse_list<int>(arg, value()).front();
            if (o.share_members < 1)
                fail_usage("--share-members: at least 1");
        } else if (arg == "--share-batch") {
            o.share_batch = parse_list<std::size_t>(arg, value()).front();
            if (o.share_batch < 1)
                fail_usage("--share-batch: at least 1");
        } else if (arg == "--producer-batch") {
            o.producer_batch = parse_list<std::size_t>(arg, value()).front();
            if (o.producer_batch < 1)
                fail_usage("--producer-batch: at least 1");
        } else if (arg == "--mixed-max") {
            o.mixed_max = parse_list<std::size_t>(arg, value()).front();
        } else if (arg == "--mixed-workers") {
            o.mixed_workers = parse_list<int>(arg, value()).front();
            if (o.mixed_workers < 1)
                fail_usage("--mixed-workers: at least 1");
        } else if (arg == "--spring-jar") {
            o.spring_jar = value();
        } else if (arg == "--spring-java-opts") {
            o.spring_java_opts = value();
        } else if (arg == "--spring-concurrency") {
            o.spring_concurrency = parse_list<int>(arg, value()).front();
        } else if (arg == "--kill" || arg == "--spring-kill") {
            o.kills = parse_list<int>(arg, value()).front();
            if (o.kills < 0)
                fail_usage(arg + ": at least 0");
        } else if (arg == "--out") {
            o.out = value();
        } else if (arg == "--plot-data") {
            o.plot_data = value();
        } else if (arg == "--keep") {
            o.keep = true;
        } else if (arg == "--verbose") {
            o.verbose = true;
        } else {
            fail_usage("unknown argument '" + arg + "'");
        }
    }
    if (quick) {
        o.events = {10000};
        o.slow_max = 2000;
        o.latency_seconds = 1;
        o.paced_every_dup = false;
    }
    for (auto& e : o.events)
        if (e == 0)
            fail_usage("--events: counts must be positive");
    std::sort(o.events.begin(), o.events.end());
    o.events.erase(std::unique(o.events.begin(), o.events.end()), o.events.end());
    if (o.latency_rate <= 0)
        o.latency_rate = 200;
    return o;
}

struct ModeSpec {
    std::string name;
    Kind kind;
    bool slow; // one transaction per record: run on at most --slow-max records
    std::size_t batch;
    int workers;
    bool batch_handler; // idemkafka: one handler call per transaction
    // idemkafka, handler-time workloads (capped at --mixed-max, no paced runs):
    // every `slow_every`-th record's handler call takes `slow_ms`.
    bool mixed = false;
    bool key_ordering = false;
    bool fingerprint = false; // idemkafka: ConsumerConfig::payload_fingerprint
    int slow_every = 0;
    int slow_ms = 0;
    bool plain = false;         // claims in a plain table (RetentionMode::purge)
    bool prefilled = false;     // claims into the --prefill table
    bool fetch_order = false;   // floors: records in the order a consumer receives them
    bool library_order = false; // floors: the records and transactions of idemkafka_batch
    std::string spring_mode{};  // spring: the peer's listener
    std::string spring_ack{};   // spring: the container's AckMode
    bool kill9 = false;         // the kill -9 run (--kill)
    bool named_only = false;    // runs only when named in --modes
    bool per_record_tx = false; // idemkafka: ConsumerConfig::transaction_per_record
};

// Whether the Spring peer can run: it needs its jar and a real broker. Says
// why not, once per mode, when it was asked for by name.
bool spring_runs_here(const Options& o, const ModeSpec& m)
{
    std::string why;
    if (o.spring_jar.empty())
        why = "no Spring peer (--spring-jar; scripts/bench.sh builds it when Java 17 and Maven are there)";
    else if (!o.services.mock_control.empty())
        why = "the Spring peer needs a real Kafka broker (scripts/bench.sh --kafka real)";
    if (why.empty())
        return true;
    if (o.modes.count(m.name) > 0)
        std::fprintf(stderr, "note: %s skipped: %s\n", m.name.c_str(), why.c_str());
    return false;
}

// The modes a run without --modes has; the rest run when named, with --mixed
// or --full (the prefilled ones with --prefill).
bool in_default_set(const ModeSpec& s)
{
    return !s.mixed && !s.fingerprint && !s.prefilled && !s.named_only;
}

// `batch`: the library's default max_batch, which the batch floors use too.
// Modes of one family stay next to each other: their runs follow one another,
// so the ratios between them meet the same load on a shared machine.
std::vector<ModeSpec> mode_specs(const Options& o, std::size_t batch)
{
    std::vector<ModeSpec> all = {
        {"kafka_raw", Kind::kafka_raw, false, 0, 0, false},
        {"pg_floor_per_event", Kind::pg_floor_per_event, true, 1, 0, false},
        {"pg_floor_batch", Kind::pg_floor_batch, false, batch, 0, false},
        {"pg_floor_batch_fetch_order", Kind::pg_floor_batch, false, batch, 0, false},
        {"pg_floor_batch_rowwise", Kind::pg_floor_batch_rowwise, false, batch, 0, false},
        {"idemkafka_per_event", Kind::idemkafka, true, 1, 0, false},
    };
    // The floor in the order a consumer receives the records: a partition at
    // a time, in runs of a producer batch, where pg_floor_batch claims in
    // production order (ids ascending, always at the right edge of the index).
    all[3].fetch_order = true;
    // One transaction per record as the library runs it: records taken and
    // merged `batch` at a time, each committed on its own; the same with
    // max_batch = 1 next to it.
    all[5].batch = batch;
    all[5].per_record_tx = true;
    all.push_back({"idemkafka_per_event_max_batch1", Kind::idemkafka, true, 1, 0, false});
    auto spring_mode = [&](std::string name, bool slow, const char* listener, const char* ack) {
        ModeSpec m{std::move(name), Kind::spring, slow, 0, 0, false};
        m.spring_mode = listener;
        m.spring_ack = ack;
        return m;
    };
    // The Spring peer next to the library's mode it is compared with, so the
    // two meet the same load on a shared machine.
    const ModeSpec spring_per_record = spring_mode("spring_per_record", true, "per_record", "MANUAL_IMMEDIATE");
    all.push_back(spring_per_record);
    const ModeSpec spring_per_record_manual = spring_mode("spring_per_record_manual", true, "per_record", "MANUAL");
    all.push_back(spring_per_record_manual);
    ModeSpec per_event_prefilled = all[5];
    per_event_prefilled.name = "idemkafka_per_event_prefilled";
    per_event_prefilled.prefilled = true;
    all.push_back(per_event_prefilled);
    const ModeSpec library_batch{"idemkafka_batch", Kind::idemkafka, false, batch, 0, true};
    all.push_back(library_batch);
    // The floor with the very claims of idemkafka_batch: its records, in the
    // order it took them, in its transactions. Right after it, so that in a
    // round in order it replays that round's run (in a reversed round, the
    // last round's).
    ModeSpec library_order_floor{"pg_floor_batch_library_order", Kind::pg_floor_batch, false, batch, 0, false};
    library_order_floor.library_order = true;
    all.push_back(library_order_floor);
    const ModeSpec spring_batch = spring_mode("spring_batch", false, "batch", "MANUAL");
    all.push_back(spring_batch);
    // The kill -9 run (--kill): the library's consumer in a child process,
    // beside the peer's listeners under the same kill loop.
    ModeSpec per_event_killed = all[5];
    per_event_killed.name += "_kill9";
    per_event_killed.kill9 = true;
    per_event_killed.slow = false;
    all.push_back(per_event_killed);
    ModeSpec batch_killed = library_batch;
    batch_killed.name += "_kill9";
    batch_killed.kill9 = true;
    all.push_back(batch_killed);
    for (ModeSpec killed : {spring_per_record, spring_per_record_manual, spring_batch}) {
        killed.name += "_kill9";
        killed.kill9 = true;
        killed.slow = false;
        all.push_back(killed);
    }
    ModeSpec batch_prefilled = library_batch;
    batch_prefilled.name = "idemkafka_batch_prefilled";
    batch_prefilled.prefilled = true;
    all.push_back(batch_prefilled);
    ModeSpec batch_plain = library_batch;
    batch_plain.name = "idemkafka_batch_plain";
    batch_plain.plain = true;
    all.push_back(batch_plain);
    // What the payload fingerprint costs: idemkafka_batch with it on.
    ModeSpec batch_fingerprint = library_batch;
    batch_fingerprint.name = "idemkafka_batch_fingerprint";
    batch_fingerprint.fingerprint = true;
    all.push_back(batch_fingerprint);
    all.push_back({"idemkafka_batch_rowwise", Kind::idemkafka, false, batch, 0, false});
    if constexpr (library_has_workers) {
        for (int w : o.workers)
            if (w > 0)
                all.push_back({fmt::format("idemkafka_batch_w{}", w), Kind::idemkafka, false, batch, w, true});
        // One record per transaction on w workers at once, the library's peer
        // of spring_per_record at concurrency w.
        for (int w : o.workers) {
            if (w <= 1)
                continue;
            ModeSpec m{fmt::format("idemkafka_per_event_w{}", w), Kind::idemkafka, true, batch, w, false};
            m.per_record_tx = true;
            m.named_only = true;
            all.push_back(m);
        }
    }
    all.push_back({"naive_listener", Kind::naive_listener, true, 1, 0, false});
    // Handler-time workloads: they measure how much handler time the workers
    // hide, not the library's cost per event. Mixed: every 100th call takes
    // 200 ms; mixed_fast is the same records and workers with no slow call
    // (the fast path of the ideal).
    auto handler_mode = [&](std::string name, int workers, bool key, int every, int ms) {
        ModeSpec m{std::move(name), Kind::idemkafka, false, batch, workers, false};
        m.mixed = true;
        m.key_ordering = key;
        m.slow_every = every;
        m.slow_ms = ms;
        all.push_back(std::move(m));
    };
    handler_mode("idemkafka_mixed_partition", o.mixed_workers, false, 100, 200);
    handler_mode("idemkafka_mixed_key", o.mixed_workers, true, 100, 200);
    handler_mode("idemkafka_mixed_fast", o.mixed_workers, true, 0, 0);
    // Every call takes 5 ms, on many workers: the workload Confluent's
    // Parallel Consumer is usually shown with.
    handler_mode("idemkafka_handler5ms_partition", o.handler_workers, false, 1, 5);
    handler_mode("idemkafka_handler5ms_key", o.handler_workers, true, 1, 5);
#if IDEMKAFKA_HAS_SHARE_CONSUMER
    // The same handler in a share group: members, not partitions, bound the
    // calls at once.
    handler_mode("idemkafka_share_handler5ms", o.share_members, false, 1, 5);
    all.back().kind = Kind::idemkafka_share;
    all.back().batch = o.share_batch;
#endif

    std::vector<ModeSpec> out;
    for (const auto& m : all) {
        bool wanted = false;
        if (!o.modes.empty())
            wanted = o.modes.count(m.name) > 0;
        else if (m.prefilled)
            wanted = o.prefill > 0;
        else if (m.kill9)
            wanted = o.kills > 0;
        else
            wanted = o.full || in_default_set(m);
        if (wanted && m.kind == Kind::spring && !spring_runs_here(o, m))
            wanted = false;
        if (wanted)
            out.push_back(m);
    }
    for (const auto& m : o.modes) {
        const bool known = std::any_of(all.begin(), all.end(), [&](const ModeSpec& s) { return s.name == m; });
        if (!known) {
            if (m.rfind("idemkafka_batch_w", 0) == 0 && !library_has_workers)
                std::fprintf(stderr, "note: %s skipped: this idemkafka has no ConsumerConfig::workers yet\n",
                             m.c_str());
            else if (m == "idemkafka_share_handler5ms")
                std::fprintf(stderr,
                             "note: %s skipped: built with a librdkafka without the share consumer "
                             "(2.15 or later: scripts/bench.sh --lane modern)\n",
                             m.c_str());
            else
                fail_usage("--modes: unknown mode '" + m + "'");
        }
    }
    if (std::any_of(out.begin(), out.end(), [](const ModeSpec& s) { return s.fingerprint; }) &&
        std::any_of(o.dups.begin(), o.dups.end(), [](int d) { return d > 0; }))
        std::fprintf(stderr, "note: idemkafka_batch_fingerprint runs at 0%% re-sends only: the bench's re-sends "
                             "differ from their originals (sequence number, timestamp)\n");
    const auto runs_mode = [&](const char* name) {
        return std::any_of(out.begin(), out.end(), [&](const ModeSpec& s) { return s.name == name; });
    };
    if (runs_mode("pg_floor_batch_library_order") && !runs_mode("idemkafka_batch")) {
        std::fprintf(stderr, "note: pg_floor_batch_library_order skipped: it replays idemkafka_batch's claims, "
                             "which does not run (--modes ...,idemkafka_batch)\n");
        out.erase(std::remove_if(out.begin(), out.end(), [](const ModeSpec& s) { return s.library_order; }), out.end());
    }
    const bool any_prefilled = std::any_of(out.begin(), out.end(), [](const ModeSpec& s) { return s.prefilled; });
    if (any_prefilled && o.prefill == 0)
        fail_usage("the _prefilled modes need --prefill ROWS");
    return out;
}

// How many of `events` records mode `s` runs: per-record modes stop at
// --slow-max, one-statement-per-row batch modes at --rowwise-max.
std::size_t cap_of(const ModeSpec& s, const Options& o, std::size_t events)
{
    if (s.slow)
        return std::min(events, o.slow_max);
    if (s.name.find("rowwise") != std::string::npos)
        return std::min(events, o.rowwise_max);
    if (s.mixed)
        return std::min(events, o.mixed_max);
    return events;
}

// The bench's re-sends are not byte for byte their originals (a new sequence
// number and produce timestamp), so with the payload fingerprint on they are
// dead-lettered as event_id_reused, as the option is meant to: the
// fingerprint mode runs without re-sends only.
bool runs_at(const ModeSpec& s, int dup_percent)
{
    return !s.fingerprint || dup_percent == 0;
}

void set_mode(Job& job, const ModeSpec& s)
{
    job.mode = s.name;
    job.kind = s.kind;
    job.batch = s.batch;
    job.per_record_tx = s.per_record_tx;
    job.workers = s.kind == Kind::idemkafka_share ? 0 : s.workers;
    job.share_members = s.kind == Kind::idemkafka_share ? s.workers : 0;
    job.batch_handler = s.batch_handler;
    job.fingerprint = s.fingerprint;
    job.key_ordering = s.key_ordering;
    job.slow_every = s.slow_every;
    job.slow_for = std::chrono::milliseconds(s.slow_ms);
    job.plain_claims = s.plain;
    job.prefilled = s.prefilled;
    job.spring_mode = s.spring_mode;
    job.spring_ack_mode = s.spring_ack;
}

// For a kill -9 mode, the kills; for the Spring peer, its containers
// (default: one per partition of the topic).
void set_spring(Job& job, const ModeSpec& s, const Options& o, int partitions)
{
    job.kills = s.kill9 ? o.kills : 0;
    job.kill_seed = static_cast<std::uint64_t>(job.serial) * 7919 + 17;
    if (s.kind != Kind::spring)
        return;
    job.spring_concurrency = o.spring_concurrency > 0 ? o.spring_concurrency : partitions;
}

// Keeps the order idemkafka_batch took `job.topic`'s records in, for
// pg_floor_batch_library_order, when it is whole: every record once, every
// one in a committed transaction. A run with retries (records decoded twice)
// or errors leaves the last whole one in place.
void keep_library_order(LibraryOrder noted, const Job& job, Result& r, std::map<std::string, LibraryOrder>& orders)
{
    if (!r.errors.empty())
        return;
    std::uint64_t in_transactions = 0;
    for (auto n : noted.batches)
        in_transactions += n;
    if (noted.seqs.size() != job.count || in_transactions != job.count) {
        r.notes.push_back(fmt::format("its order is not kept for pg_floor_batch_library_order: {} records decoded and "
                                      "{} in committed transactions, for {}",
                                      noted.seqs.size(), in_transactions, job.count));
        return;
    }
    orders[job.topic] = std::move(noted);
}

// A mode that needs the run's topic: the Kafka modes, and the floors that
// take the records in the order a consumer of that topic receives them.
bool needs_topic(const ModeSpec& s)
{
    return s.fetch_order || s.library_order || s.kind == Kind::kafka_raw || s.kind == Kind::idemkafka ||
           s.kind == Kind::idemkafka_share || s.kind == Kind::naive_listener || s.kind == Kind::spring;
}

// The peer's JVM, its JDBC URL (the same server, over TCP: JDBC has no Unix
// sockets) and its working directory; stated in the report's meta.
SpringPeer spring_peer(const Options& o, Report& report)
{
    SpringPeer p;
    p.jar = o.spring_jar;
    p.java_opts = o.spring_java_opts;
    pqxx::connection c(o.services.postgres);
    std::string host = c.hostname() ? c.hostname() : "";
    if (host.empty() || host.front() == '/')
        host = "127.0.0.1";
    p.jdbc_url = fmt::format("jdbc:postgresql://{}:{}/{}?user={}&reWriteBatchedInserts=true", host, c.port(),
                             c.dbname(), c.username());
    p.work_dir = (std::filesystem::temp_directory_path() / fmt::format("ikbench-spring-{}", getpid())).string();
    std::filesystem::create_directories(p.work_dir);
    std::string java = "unknown";
    if (FILE* f = popen("java -version 2>&1 | head -n 1", "r")) {
        char buf[256] = {};
        if (std::fgets(buf, sizeof buf, f))
            java = buf;
        pclose(f);
        while (!java.empty() && (java.back() == '\n' || java.back() == '\r'))
            java.pop_back();
    }
    report.meta["spring_peer"] = {{"jar", p.jar},
                                  {"java", java},
                                  {"java_opts", p.java_opts},
                                  {"jdbc_url", p.jdbc_url},
                                  {"concurrency", o.spring_concurrency > 0 ? fmt::format("{}", o.spring_concurrency)
                                                                           : std::string("partitions of the topic")},
                                  {"kills", o.kills}};
    return p;
}

std::string iso_now()
{
    const std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

std::string progress_line(const Result& r)
{
    std::string s =
        fmt::format("{}{} dup={}% events={}{}: ", r.mode, r.round > 1 ? fmt::format(" round {}", r.round) : "",
                    r.dup_percent, r.events, r.paced ? fmt::format(" paced@{:.0f}/s", r.rate) : "");
    if (r.paced)
        s += fmt::format("p50 {:.2f} ms p99 {:.2f} ms", r.end_to_end.percentile_ms(50), r.end_to_end.percentile_ms(99));
    else
        s += fmt::format("{:.0f} events/s in {:.2f} s", r.events_per_s, r.seconds);
    s += fmt::format(" (startup {:.2f} s, wall {:.1f} s)", r.startup_seconds, r.wall_seconds);
    s += r.ok() ? " ok" : " ERROR: " + r.errors.front();
    for (const auto& n : r.notes)
        s += " (" + n + ")";
    return s;
}

// Mock partitions keep ~5 MiB; 90 bytes per record is the payload plus record
// and batch overhead with margin, 4 MiB the budget per partition.
int partitions_for(std::size_t count, int minimum)
{
    const auto needed = static_cast<int>((count * 90 + (4u << 20) - 1) / (4u << 20));
    return std::max(minimum, needed);
}

int run(const Options& o)
{
    if (o.services.brokers.empty() || o.services.postgres.empty())
        fail_usage("--brokers and --postgres (or IDEMKAFKA_TEST_BROKERS / IDEMKAFKA_TEST_PG) are required; "
                   "scripts/bench.sh starts both");
    const ik::ConsumerConfig defaults;
    const auto specs = mode_specs(o, defaults.max_batch);
    const std::string run_tag = fmt::format("{}-{}", getpid(), std::time(nullptr) % 1000000);

    Report report;
    int backend_pid = 0;
    {
        pqxx::connection c(o.services.postgres);
        backend_pid = c.backendpid();
        pqxx::nontransaction tx(c);
        report.meta["postgres"] = {
            {"version", tx.exec("SHOW server_version")[0][0].c_str()},
            {"fsync", tx.exec("SHOW fsync")[0][0].c_str()},
            {"synchronous_commit", tx.exec("SHOW synchronous_commit")[0][0].c_str()},
            {"shared_buffers", tx.exec("SHOW shared_buffers")[0][0].c_str()},
        };
        // A fresh schema: tables of an earlier, interrupted run must not count.
        tx.exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", ik::quote_identifier(o.schema)));
    }
    const Meter meter(backend_pid, o.services.mock_control);
    RunEnv env{o.services,          o.schema, &meter, o.verbose, o.consumer_props, o.pipeline, o.batches_per_unit,
               o.optimistic_claims, {},       {},     {}};
    if (!o.spring_jar.empty())
        env.spring = spring_peer(o, report);

    utsname un{};
    uname(&un);
    report.meta["generated_at"] = iso_now();
    report.meta["machine"] = {{"cpus", std::thread::hardware_concurrency()},
                              {"kernel", std::string(un.sysname) + " " + un.release}};
    report.meta["versions"] = {{"idemkafka", IDEMKAFKA_BENCH_VERSION},
                               {"build_type", IDEMKAFKA_BENCH_BUILD_TYPE},
                               {"librdkafka", rd_kafka_version_str()},
                               {"libpqxx", PQXX_VERSION}};
    report.meta["config"] = {
        {"events", o.events},
        {"dup_percent", o.dups},
        {"slow_max", o.slow_max},
        {"rowwise_max", o.rowwise_max},
        {"mixed_max", o.mixed_max},
        {"producer_batch", o.producer_batch},
        {"mixed_workers", o.mixed_workers},
        {"mixed_slow", "every 100th record's handler call takes 200 ms"},
        {"handler_workers", o.handler_workers},
        {"share_members", o.share_members},
        {"share_batch", o.share_batch},
        {"handler5ms", "every record's handler call takes 5 ms"},
        {"claims_layout", "partitioned (the default configuration); _plain modes: plain (RetentionMode::purge)"},
        {"prefill_rows", o.prefill},
        {"rounds", o.rounds},
        {"max_batch", defaults.max_batch},
        {"max_batch_wait_ms", defaults.max_batch_wait.count()},
        {"partitions_min", o.partitions},
        {"latency_rate", o.latency_rate},
        {"latency_seconds", o.latency_seconds},
        {"library_has_workers", library_has_workers},
        {"workers", library_has_workers ? nlohmann::ordered_json(o.workers) : nlohmann::ordered_json::array()},
        {"broker", o.services.mock_control.empty() ? "external" : "idemkafka-mock-broker"},
        {"consumer_props", o.consumer_props},
        {"pipeline", o.pipeline},
        {"batches_per_unit", o.batches_per_unit},
        {"optimistic_claims", o.optimistic_claims},
        {"cpu_postgres_measured", meter.has_postgres()},
        {"cpu_broker_measured", meter.has_broker()},
    };
    if (std::string(IDEMKAFKA_BENCH_BUILD_TYPE) != "Release")
        std::fprintf(stderr, "note: built as %s, not Release: numbers are not representative\n",
                     IDEMKAFKA_BENCH_BUILD_TYPE);

    // Before the data sets: their ids, minted from now on, sort above every
    // prefilled one.
    if (std::any_of(specs.begin(), specs.end(), [](const ModeSpec& s) { return s.prefilled; })) {
        try {
            const Prefill p = prefill_claims(o.services.postgres, o.schema, "steady_claims", "ikbench-steady-state",
                                             o.prefill, defaults.retention);
            env.prefill_table = p.table;
            env.prefill_run_ids_from = p.run_ids_from;
            report.meta["prefill"] = {{"table", p.table},
                                      {"rows", p.rows},
                                      {"window_hours", static_cast<double>(p.window_ms) / 3.6e6},
                                      {"range_partitions", p.partitions},
                                      {"fill_seconds", std::round(p.fill_seconds * 10) / 10},
                                      {"vacuum_analyze_seconds", std::round(p.vacuum_seconds * 10) / 10},
                                      {"heap_bytes", p.heap_bytes},
                                      {"total_bytes", p.total_bytes}};
        } catch (const std::exception& e) {
            report.errors.push_back(fmt::format("prefill: {}", e.what()));
        }
    }

    bool any_kafka = false;
    for (const auto& s : specs)
        any_kafka = any_kafka || s.kind == Kind::kafka_raw || s.kind == Kind::idemkafka ||
                    s.kind == Kind::idemkafka_share || s.kind == Kind::naive_listener || s.kind == Kind::spring;
    std::set<std::size_t> sizes;
    for (auto e : o.events)
        for (const auto& s : specs)
            sizes.insert(cap_of(s, o, e));
    const std::uint64_t seed = 0x1DE3CAFCAULL;
    std::vector<Dataset> datasets;
    for (int d : o.dups)
        datasets.emplace_back(d, seed);

    // Every data topic is produced before the first timed run: the producer's
    // buffers and CPU stay out of the measurements.
    std::map<std::pair<int, std::size_t>, std::string> topics;
    if (any_kafka) {
        for (const auto& data : datasets) {
            for (std::size_t n : sizes) {
                const std::string topic = fmt::format("ikbench-{}-d{}-n{}", run_tag, data.dup_percent(), n);
                const int parts = partitions_for(n, o.partitions);
                const auto t0 = SteadyClock::now();
                try {
                    create_topic(o.services, topic, parts);
                    produce_all(o.services, topic, data, n, o.producer_batch);
                    const auto w = watermarks(o.services, topic);
                    if (w.low_min > 0 || w.high_sum != static_cast<std::int64_t>(n)) {
                        report.errors.push_back(fmt::format(
                            "topic {}: the broker holds {} of {} records (lowest start offset {}); the mock keeps "
                            "~5 MiB per partition: raise --partitions",
                            topic, w.high_sum - w.low_min * w.partitions, n, w.low_min));
                        continue;
                    }
                    topics[{data.dup_percent(), n}] = topic;
                    std::fprintf(stderr, "produced %zu records (%d%% re-sends) into %s, %d partitions, in %.1f s\n", n,
                                 data.dup_percent(), topic.c_str(), parts, seconds_between(t0, SteadyClock::now()));
                } catch (const std::exception& e) {
                    report.errors.push_back(fmt::format("producing {}: {}", topic, e.what()));
                }
            }
        }
    }

    int serial = 0;
    // Per topic: the order a plain consumer receives its records in, read once.
    std::map<std::string, std::vector<std::uint32_t>> fetch_orders;
    // Per topic: the order and transactions of its last idemkafka_batch run.
    std::map<std::string, LibraryOrder> library_orders;
    const OnReady no_op = [](const Counter&) {};
    // --rounds: every drain again, the modes in reverse order every other
    // round, so that a ratio pairs runs a few seconds apart (see summarise()).
    for (int round = 1; round <= o.rounds; ++round)
        for (const auto& data : datasets) {
            for (std::size_t n : sizes) {
                for (std::size_t k = 0; k < specs.size(); ++k) {
                    const auto& s = specs[round % 2 ? k : specs.size() - 1 - k];
                    const bool runs_here = std::any_of(o.events.begin(), o.events.end(),
                                                       [&](std::size_t e) { return cap_of(s, o, e) == n; });
                    if (!runs_here || !runs_at(s, data.dup_percent()))
                        continue;
                    Job job;
                    set_mode(job, s);
                    job.data = &data;
                    job.count = n;
                    job.serial = ++serial;
                    if (needs_topic(s)) {
                        auto t = topics.find({data.dup_percent(), n});
                        if (t == topics.end())
                            continue; // its production failed, already reported
                        job.topic = t->second;
                    }
                    set_spring(job, s, o, partitions_for(n, o.partitions));
                    if (s.fetch_order) {
                        auto& order = fetch_orders[job.topic];
                        if (order.empty()) {
                            try {
                                order = read_fetch_order(env, job);
                            } catch (const std::exception& e) {
                                Result failed;
                                failed.mode = job.mode;
                                failed.dup_percent = data.dup_percent();
                                failed.events = n;
                                failed.errors.push_back(
                                    fmt::format("reading the fetch order of {}: {}", job.topic, e.what()));
                                std::fprintf(stderr, "%s\n", progress_line(failed).c_str());
                                report.runs.push_back(std::move(failed));
                                continue;
                            }
                        }
                        job.order = &order;
                    }
                    if (s.library_order) {
                        const auto library_order = library_orders.find(job.topic);
                        if (library_order == library_orders.end()) {
                            std::fprintf(stderr,
                                         "note: %s skipped at %zu records, %d%% re-sends: no whole order of "
                                         "idemkafka_batch on this topic to replay\n",
                                         s.name.c_str(), n, data.dup_percent());
                            continue;
                        }
                        job.order = &library_order->second.seqs;
                        job.batches = &library_order->second.batches;
                    }
                    LibraryOrder noted;
                    if (s.name == "idemkafka_batch")
                        job.note_order = &noted;
                    Result r = run_job(env, job, no_op);
                    r.round = round;
                    if (job.note_order)
                        keep_library_order(std::move(noted), job, r, library_orders);
                    std::fprintf(stderr, "%s\n", progress_line(r).c_str());
                    report.runs.push_back(std::move(r));
                }
            }
        }

    // Latency: a backlog drain measures queueing, not latency, so each mode
    // also runs with records produced while it consumes, at a rate every mode
    // sustains.
    if (o.latency_seconds > 0) {
        // Half a second of warm-up records, produced and consumed before the
        // measured ones (see Job::warmup).
        const auto warmup = static_cast<std::size_t>(std::max(20.0, o.latency_rate / 2));
        const auto count = warmup + static_cast<std::size_t>(o.latency_rate * o.latency_seconds);
        for (const auto& data : datasets) {
            if (!o.paced_every_dup && &data != &datasets.front())
                break;
            for (const auto& s : specs) {
                // mixed: their latency is the handler's time; the fetch order
                // is a drain's; a kill -9 run measures no latency.
                if (s.mixed || s.fetch_order || s.library_order || s.kill9 || !runs_at(s, data.dup_percent()))
                    continue;
                Job job;
                set_mode(job, s);
                job.data = &data;
                job.count = count;
                job.paced = true;
                job.rate = o.latency_rate;
                job.warmup = warmup;
                job.batch_wait = s.batch > 1 ? defaults.max_batch_wait : std::chrono::milliseconds(0);
                job.serial = ++serial;
                std::atomic<bool> abort{false};
                std::thread producer;
                std::string producer_error;
                OnReady on_ready = no_op;
                if (needs_topic(s)) {
                    job.topic = fmt::format("ikbench-{}-paced-{}-d{}", run_tag, s.name, data.dup_percent());
                    set_spring(job, s, o, 8);
                    try {
                        create_topic(o.services, job.topic, 8);
                    } catch (const std::exception& e) {
                        report.errors.push_back(fmt::format("creating {}: {}", job.topic, e.what()));
                        continue;
                    }
                    on_ready = [&](Counter processed) {
                        producer = std::thread([&, processed] {
                            name_thread("ik-producer");
                            try {
                                produce_paced(
                                    o.services, job.topic, data, count, o.latency_rate, warmup,
                                    [processed] { return processed->load(); }, abort);
                            } catch (const std::exception& e) {
                                producer_error = e.what();
                            }
                        });
                    };
                }
                Result r = run_job(env, job, on_ready);
                abort = true;
                if (producer.joinable())
                    producer.join();
                if (!producer_error.empty())
                    r.errors.push_back("producer: " + producer_error);
                std::fprintf(stderr, "%s\n", progress_line(r).c_str());
                report.paced.push_back(std::move(r));
            }
        }
    }

    if (!env.spring.work_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove(env.spring.work_dir, ec); // only when empty: logs of failed runs stay
    }
    const auto summary = summarise(report);
    print_tables(std::cout, report, summary);
    auto json = to_json(report);
    const std::filesystem::path out(o.out);
    if (out.has_parent_path())
        std::filesystem::create_directories(out.parent_path());
    std::ofstream(out) << json.dump(2) << "\n";
    std::cout << "\nreport: " << out.string() << "\n";

    if (!o.keep) {
        try {
            pqxx::connection c(o.services.postgres);
            pqxx::nontransaction tx(c);
            tx.exec(fmt::format("DROP SCHEMA IF EXISTS {} CASCADE", ik::quote_identifier(o.schema)));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "note: could not drop schema %s: %s\n", o.schema.c_str(), e.what());
        }
    }
    if (!json["ok"].get<bool>()) {
        std::fprintf(stderr, "idemkafka-bench: FAILED: %zu error(s), see above and in %s\n", json["errors"].size(),
                     out.string().c_str());
        return 1;
    }
    return 0;
}

} // namespace

int main(int argc, char** argv)
try {
    if (argc > 1 && std::string(argv[1]) == "--child-consumer")
        return ik::bench::run_child_consumer(argc - 2, argv + 2);
    const Options o = parse_options(argc, argv);
    if (!o.plot_data.empty()) {
        write_plot_data(std::cout, o.plot_data);
        return 0;
    }
    return run(o);
} catch (const std::exception& e) {
    std::fprintf(stderr, "idemkafka-bench: %s\n", e.what());
    return 1;
}
