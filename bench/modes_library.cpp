// idemkafka itself: IdempotentConsumer with a batch handler that writes the
// business rows of a transaction with one multi-row statement, as
// pg_floor_batch does (idemkafka_batch, _wN), or with a per-record handler
// that writes one row per call (idemkafka_batch_rowwise, idemkafka_per_event).

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "child.hpp"
#include "modes.hpp"
#include "pg/exec.hpp"

namespace idemkafka::bench {

namespace {

struct BenchEvent {
    Decoded d;
    std::int64_t taken_us = 0; // steady_us() when the record reached the decoder
};

// Effects written by handlers since the last commit. The after-commit hook
// stamps them all: it runs after the transaction(s) holding them committed.
// Shared rather than per thread: with workers the hook may run on another
// thread than the handlers.
struct Pending {
    std::int64_t produced_us;
    std::int64_t taken_us;
    bool measured;
};

void atomic_max(std::atomic<std::int64_t>& a, std::int64_t v) noexcept
{
    std::int64_t cur = a.load();
    while (cur < v && !a.compare_exchange_weak(cur, v)) {
    }
}

// The consumer of the idemkafka modes: its configuration, decoder, handlers
// and after-commit hook. run_idemkafka runs it in process; the kill -9 modes
// run it in a child process (run_child_consumer). It is not copied or moved:
// the handlers point into it.
class LibraryConsumer {
public:
    using Consumer = IdempotentConsumer<BenchEvent>;

    LibraryConsumer(const RunEnv& env, const Job& job, RunState& st) : job_(job), st_(st)
    {
        effect_statement_ = fmt::format("ikbench_effect_{}", job.serial);
        effects_statement_ = fmt::format("ikbench_effects_{}", job.serial);
        ConsumerConfig cfg = config(env, job, st.tables);
        cfg.hooks.after_db_commit = [this](const BatchInfo& info) { after_commit(info); };
        auto decode = [this](std::string_view payload) { return decode_event(payload); };
        auto event_id = [](const BenchEvent& e) { return e.d.id; };
        if (job.batch_handler)
            holder_.emplace(cfg, decode, event_id,
                            [this](pqxx::work& tx, const Batch<BenchEvent>& batch) { handle_batch(tx, batch); });
        else
            holder_.emplace(cfg, decode, event_id,
                            [this](pqxx::work& tx, const BenchEvent& e, const Context& ctx) { handle(tx, e, ctx); });
    }
    LibraryConsumer(const LibraryConsumer&) = delete;
    LibraryConsumer& operator=(const LibraryConsumer&) = delete;

    Consumer& consumer() { return *holder_; }

    std::atomic<std::int64_t> first_taken{-1}; ///< steady_us() of the first record decoded
    std::atomic<std::int64_t> last_commit{-1}; ///< steady_us() of the last commit
    std::atomic<std::uint64_t> stamped{0};     ///< effects the after-commit hook stamped
    std::atomic<std::uint64_t> unmatched_batches{0};

private:
    static ConsumerConfig config(const RunEnv& env, const Job& job, const Tables& tables)
    {
        ConsumerConfig cfg;
        cfg.brokers = env.services.brokers;
        cfg.group_id = group_of(job);
        cfg.topics = {job.topic};
        cfg.postgres = env.services.postgres;
        cfg.schema = tables.schema;
        cfg.table = tables.claims;
        cfg.max_batch = job.batch;
        cfg.transaction_per_record = job.per_record_tx;
        cfg.batches_per_unit = env.batches_per_unit;
        cfg.optimistic_claims = env.optimistic_claims;
        cfg.pipeline = env.pipeline;
        auto props = common_consumer_props();
        for (const auto& [k, v] : env.consumer_props)
            props[k] = v;
        for (const auto& [k, v] : props)
            if (k != "enable.partition.eof") // the library sets it itself
                cfg.kafka[k] = v;
        if (!env.verbose)
            cfg.kafka["log_level"] = std::string("3"); // not "3": g++ 12 -Wrestrict false positive (GCC PR 105651)
        cfg.log = stderr_sink(env.verbose ? LogLevel::info : LogLevel::warning);
        if (job.workers > 0)
            set_workers(cfg, job.workers);
        if (job.key_ordering)
            cfg.ordering = Ordering::key;
        cfg.payload_fingerprint = job.fingerprint;
        // The layout prepare_tables() created: the consumer finds what it is
        // configured for, as a user's does.
        if (job.plain_claims)
            cfg.retention.mode = RetentionMode::purge;
        return cfg;
    }

    void after_commit(const BatchInfo& info)
    {
        const std::int64_t now_w = wall_us();
        const std::int64_t now_s = steady_us();
        if (job_.note_order && info.records > 0) {
            std::lock_guard<std::mutex> lock(order_mu_);
            job_.note_order->batches.push_back(static_cast<std::uint32_t>(info.records));
        }
        // The transaction's effects, the oldest pending: with a transaction
        // per record the hook runs once per transaction, when the unit of
        // several has committed them all.
        std::vector<Pending> committed;
        {
            std::lock_guard<std::mutex> lock(pending_mu_);
            const auto n = static_cast<std::ptrdiff_t>(std::min(info.claimed, pending_.size()));
            committed.assign(pending_.begin(), pending_.begin() + n);
            pending_.erase(pending_.begin(), pending_.begin() + n);
        }
        for (const auto& p : committed)
            if (p.measured)
                st_.latency.record(p.produced_us, p.taken_us, now_w, now_s);
        if (committed.size() != info.claimed)
            unmatched_batches.fetch_add(1);
        stamped.fetch_add(committed.size());
        atomic_max(last_commit, now_s);
    }

    BenchEvent decode_event(std::string_view payload)
    {
        BenchEvent e;
        e.d = decode_payload(payload);
        e.taken_us = steady_us();
        if (job_.note_order) {
            std::lock_guard<std::mutex> lock(order_mu_);
            job_.note_order->seqs.push_back(static_cast<std::uint32_t>(e.d.seq));
        }
        std::int64_t unset = -1;
        first_taken.compare_exchange_strong(unset, e.taken_us);
        return e;
    }

    // Under pending_mu_.
    void keep_pending(const BenchEvent& e)
    {
        pending_.push_back({e.d.produced_us, e.taken_us, st_.measured(e.d.seq, job_)});
    }

    void handle(pqxx::work& tx, const BenchEvent& e, const Context& ctx)
    {
        prepare_once(tx.conn(), effect_statement_, st_.tables.insert_effect);
        const auto key = ctx.key() ? std::string(*ctx.key()) : std::string();
        detail::pg::exec_prepared(tx, effect_statement_, e.d.id_text.data(), key, amount_of(e.d.id), e.d.produced_us);
        if (job_.slow_every > 0 && e.d.seq % job_.slow_every == 0)
            std::this_thread::sleep_for(job_.slow_for); // a slow downstream call
        std::lock_guard<std::mutex> lock(pending_mu_);
        keep_pending(e);
    }

    void handle_batch(pqxx::work& tx, const Batch<BenchEvent>& batch)
    {
        prepare_once(tx.conn(), effects_statement_, st_.tables.insert_effects_unnest);
        using Entry = Batch<BenchEvent>::Entry;
        detail::pg::exec_prepared(tx, effects_statement_,
                                  array_literal(batch.begin(), batch.end(),
                                                [](const Entry& r) { return std::string(r.event.d.id_text.data()); }),
                                  array_literal(batch.begin(), batch.end(),
                                                [](const Entry& r) {
                                                    return r.context.key() ? std::string(*r.context.key())
                                                                           : std::string();
                                                }),
                                  array_literal(batch.begin(), batch.end(),
                                                [](const Entry& r) { return std::to_string(amount_of(r.event.d.id)); }),
                                  array_literal(batch.begin(), batch.end(),
                                                [](const Entry& r) { return std::to_string(r.event.d.produced_us); }));
        std::lock_guard<std::mutex> lock(pending_mu_);
        for (const auto& r : batch)
            keep_pending(r.event);
    }

    const Job& job_;
    RunState& st_;
    std::string effect_statement_;
    std::string effects_statement_;
    std::mutex pending_mu_;
    std::deque<Pending> pending_;
    // Job::note_order's: not pending_mu_, which a batch handler holds for its
    // whole batch while the poll thread decodes the next records.
    std::mutex order_mu_;
    std::optional<Consumer> holder_;
};

} // namespace

void run_idemkafka(const RunEnv& env, const Job& job, RunState& st)
{
    if (job.kills > 0) {
        run_idemkafka_kill9(env, job, st);
        return;
    }
    LibraryConsumer lib(env, job, st);
    auto& first_taken = lib.first_taken;
    auto& last_commit = lib.last_commit;
    auto& stamped = lib.stamped;
    auto& unmatched_batches = lib.unmatched_batches;
    auto& consumer = lib.consumer();

    ConsumerThread<IdempotentConsumer<BenchEvent>> runner(consumer);

    // Watch the counters until every record is accounted for: claimed (effect
    // committed) or skipped as a duplicate or as poison.
    const auto expected = static_cast<std::uint64_t>(job.count);
    bool ready = false;
    std::uint64_t last_processed = 0;
    auto last_progress = SteadyClock::now();
    MetricsSnapshot m;
    // Per-partition lag spread while the backlog drains (the library updates
    // the lags every 200 ms): how far one partition runs ahead of another.
    auto next_lag_sample = SteadyClock::now();
    double spread_sum = 0;
    auto sample_lag_spread = [&](const MetricsSnapshot& s) {
        if (s.partitions.empty() || first_taken.load() < 0)
            return;
        std::int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (const auto& p : s.partitions) {
            if (p.lag < 0)
                return; // not all known yet
            lo = std::min(lo, p.lag);
            hi = std::max(hi, p.lag);
        }
        const auto spread = static_cast<double>(hi - lo);
        st.result.partitions = s.partitions.size();
        st.result.lag_spread_max = std::max(st.result.lag_spread_max, spread);
        spread_sum += spread;
        st.result.lag_spread_samples += 1;
        st.result.lag_spread_mean = spread_sum / static_cast<double>(st.result.lag_spread_samples);
    };
    for (;;) {
        // Coarse polling is enough: the throughput window ends at the last
        // commit's own timestamp, not when this loop notices it.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        m = consumer.metrics().snapshot();
        if (!ready && m.assigned_partitions > 0) {
            ready = true;
            st.ready();
        }
        const std::uint64_t processed = m.claimed + m.duplicates + m.decode_errors + m.invalid_event_ids;
        st.set_processed(static_cast<std::size_t>(processed));
        if (processed >= expected)
            break;
        if (!job.paced && SteadyClock::now() >= next_lag_sample) {
            sample_lag_spread(m);
            next_lag_sample = SteadyClock::now() + std::chrono::milliseconds(200);
        }
        if (runner.finished()) {
            st.result.errors.push_back(fmt::format("consumer stopped after {} of {} records", processed, expected));
            break;
        }
        const auto now = SteadyClock::now();
        if (processed != last_processed) {
            last_processed = processed;
            last_progress = now;
        } else if (now - last_progress >
                   (processed ? std::chrono::seconds(stall_timeout) : std::chrono::seconds(first_record_timeout))) {
            st.result.errors.push_back(
                fmt::format("lost: only {} of {} records processed (no progress for {} s)", processed, expected,
                            std::chrono::duration_cast<std::chrono::seconds>(now - last_progress).count()));
            break;
        }
    }
    st.take_cpu_after(*env.meter);
    // The counters move just before the after-commit hook runs: give the last
    // hook a moment before stopping.
    const auto hook_deadline = SteadyClock::now() + std::chrono::seconds(2);
    while (stamped.load() < m.claimed && SteadyClock::now() < hook_deadline && !runner.finished())
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (const auto failure = runner.stop(); !failure.empty())
        st.result.errors.push_back("consumer failed: " + failure);

    m = consumer.metrics().snapshot();
    st.first_taken_us = first_taken.load();
    st.last_commit_us = last_commit.load();
    st.result.transactions = m.db_commits;
    st.effects_reported = static_cast<std::size_t>(m.claimed);
    if (st.result.errors.empty()) {
        if (m.claimed != st.result.unique)
            st.result.errors.push_back(fmt::format("claimed {} events, expected {}", m.claimed, st.result.unique));
        if (m.duplicates != job.count - st.result.unique)
            st.result.errors.push_back(
                fmt::format("{} duplicates skipped, expected {}", m.duplicates, job.count - st.result.unique));
        if (m.decode_errors + m.invalid_event_ids)
            st.result.errors.push_back(
                fmt::format("{} records rejected as poison", m.decode_errors + m.invalid_event_ids));
    }
    if (m.consumed > expected)
        st.result.notes.push_back(fmt::format("{} records fetched again (rewind or rebalance)", m.consumed - expected));
    // With several workers a hook also takes effects of transactions still
    // running on other workers (stamped a little early): expected there.
    if (unmatched_batches.load() && job.workers <= 1)
        st.result.notes.push_back(fmt::format("{} commit(s) stamped a different number of effects than they claimed",
                                              unmatched_batches.load()));
}

// ---- kill -9: the consumer in a child process ------------------------------

namespace {

// The arguments of `idemkafka-bench --child-consumer`, key=value each: what
// the child needs to run the consumer of `job` as run_idemkafka would.
std::vector<std::string> child_args(const RunEnv& env, const Job& job, std::chrono::milliseconds idle_exit)
{
    std::vector<std::string> args = {"/proc/self/exe",
                                     "--child-consumer",
                                     "brokers=" + env.services.brokers,
                                     "postgres=" + env.services.postgres,
                                     "schema=" + env.schema,
                                     "mode=" + job.mode,
                                     "topic=" + job.topic,
                                     fmt::format("serial={}", job.serial),
                                     fmt::format("batch={}", job.batch),
                                     fmt::format("per-record-tx={}", job.per_record_tx ? 1 : 0),
                                     fmt::format("workers={}", job.workers),
                                     fmt::format("batch-handler={}", job.batch_handler ? 1 : 0),
                                     fmt::format("pipeline={}", env.pipeline ? 1 : 0),
                                     fmt::format("batches-per-unit={}", env.batches_per_unit),
                                     fmt::format("optimistic-claims={}", env.optimistic_claims ? 1 : 0),
                                     fmt::format("verbose={}", env.verbose ? 1 : 0),
                                     fmt::format("idle-exit-ms={}", idle_exit.count())};
    for (const auto& [k, v] : env.consumer_props)
        args.push_back("prop=" + k + "=" + v);
    return args;
}

struct ChildSetup {
    RunEnv env;
    Job job;
    std::chrono::milliseconds idle_exit{0};
};

ChildSetup parse_child_args(int argc, char** argv)
{
    ChildSetup c;
    for (int i = 0; i < argc; ++i) {
        const std::string arg = argv[i];
        const auto eq = arg.find('=');
        if (eq == std::string::npos)
            throw std::invalid_argument("--child-consumer: '" + arg + "' is not key=value");
        const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
        const std::map<std::string, std::string*> text = {{"brokers", &c.env.services.brokers},
                                                          {"postgres", &c.env.services.postgres},
                                                          {"schema", &c.env.schema},
                                                          {"mode", &c.job.mode},
                                                          {"topic", &c.job.topic}};
        if (auto t = text.find(key); t != text.end())
            *t->second = value;
        else if (key == "serial")
            c.job.serial = std::stoi(value);
        else if (key == "batch")
            c.job.batch = std::stoul(value);
        else if (key == "workers")
            c.job.workers = std::stoi(value);
        else if (key == "per-record-tx")
            c.job.per_record_tx = value == "1";
        else if (key == "batch-handler")
            c.job.batch_handler = value == "1";
        else if (key == "pipeline")
            c.env.pipeline = value == "1";
        else if (key == "batches-per-unit")
            c.env.batches_per_unit = std::stoul(value);
        else if (key == "optimistic-claims")
            c.env.optimistic_claims = value == "1";
        else if (key == "verbose")
            c.env.verbose = value == "1";
        else if (key == "idle-exit-ms")
            c.idle_exit = std::chrono::milliseconds(std::stoll(value));
        else if (key == "prop" && value.find('=') != std::string::npos)
            c.env.consumer_props[value.substr(0, value.find('='))] = value.substr(value.find('=') + 1);
        else
            throw std::invalid_argument("--child-consumer: unknown argument '" + arg + "'");
    }
    if (c.env.services.brokers.empty() || c.env.services.postgres.empty() || c.job.mode.empty() || c.job.topic.empty())
        throw std::invalid_argument("--child-consumer: brokers, postgres, mode and topic are required");
    c.job.kind = Kind::idemkafka;
    return c;
}

// Prints ASSIGNED once the consumer has partitions and PROGRESS <records
// processed> whenever that count moves; returns when the consumer stopped or,
// with `idle_exit`, after that long without a new record once assigned.
void report_progress(const IdempotentConsumer<BenchEvent>& consumer,
                     const ConsumerThread<IdempotentConsumer<BenchEvent>>& runner, std::chrono::milliseconds idle_exit)
{
    bool assigned = false;
    std::uint64_t last = 0;
    auto last_change = SteadyClock::now();
    while (!runner.finished()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        const auto m = consumer.metrics().snapshot();
        const auto now = SteadyClock::now();
        if (!assigned && m.assigned_partitions > 0) {
            assigned = true;
            last_change = now;
            std::printf("ASSIGNED\n");
            std::fflush(stdout);
        }
        const std::uint64_t processed = m.claimed + m.duplicates + m.decode_errors + m.invalid_event_ids;
        if (processed != last) {
            last = processed;
            last_change = now;
            std::printf("PROGRESS %llu\n", static_cast<unsigned long long>(processed));
            std::fflush(stdout);
        }
        if (idle_exit.count() > 0 && assigned && now - last_change > idle_exit)
            return;
    }
}

} // namespace

int run_child_consumer(int argc, char** argv)
{
    ChildSetup c = parse_child_args(argc, argv);
    Result result;
    const OnReady none = [](const Counter&) {};
    RunState st(result, none);
    st.tables = table_names(c.env.schema, c.job.mode, ClaimsLayout{});
    LibraryConsumer lib(c.env, c.job, st);
    ConsumerThread<IdempotentConsumer<BenchEvent>> runner(lib.consumer());
    report_progress(lib.consumer(), runner, c.idle_exit);
    if (const auto failure = runner.stop(); !failure.empty()) {
        std::fprintf(stderr, "idemkafka-bench --child-consumer: the consumer failed: %s\n", failure.c_str());
        return 1;
    }
    return 0;
}

void run_idemkafka_kill9(const RunEnv& env, const Job& job, RunState& st)
{
    const std::string group = group_of(job);
    const std::string dir =
        env.spring.work_dir.empty() ? std::filesystem::temp_directory_path().string() : env.spring.work_dir;
    const std::string log = fmt::format("{}/{}-{}-{}.log", dir, job.mode, job.serial, getpid());
    run_kill9(env, job, st, "the library's consumer", group, log,
              [&](std::chrono::milliseconds idle_exit) { return spawn_child(child_args(env, job, idle_exit), log); });
}

} // namespace idemkafka::bench
