// idemkafka itself: IdempotentConsumer with a batch handler that writes the
// business rows of a transaction with one multi-row statement, as
// pg_floor_batch does (idemkafka_batch, _wN), or with a per-record handler
// that writes one row per call (idemkafka_batch_rowwise, idemkafka_per_event).

#include <algorithm>
#include <atomic>
#include <climits>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

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

} // namespace

void run_idemkafka(const RunEnv& env, const Job& job, RunState& st)
{
    const std::string effect_statement = fmt::format("ikbench_effect_{}", job.serial);
    const std::string effects_statement = fmt::format("ikbench_effects_{}", job.serial);
    std::atomic<std::int64_t> first_taken{-1};
    std::atomic<std::int64_t> last_commit{-1};
    std::atomic<std::uint64_t> stamped{0};
    std::atomic<std::uint64_t> unmatched_batches{0};

    ConsumerConfig cfg;
    cfg.brokers = env.services.brokers;
    cfg.group_id = fmt::format("ikbench-{}-{}", job.mode, job.serial);
    cfg.topics = {job.topic};
    cfg.postgres = env.services.postgres;
    cfg.schema = st.tables.schema;
    cfg.table = st.tables.claims;
    cfg.max_batch = job.batch;
    cfg.pipeline = env.pipeline;
    auto props = common_consumer_props();
    for (const auto& [k, v] : env.consumer_props)
        props[k] = v;
    for (const auto& [k, v] : props)
        if (k != "enable.partition.eof") // the library sets it itself
            cfg.kafka[k] = v;
    if (!env.verbose)
        cfg.kafka["log_level"] = std::string("3"); // not "3": g++ 12 -Wrestrict false positive in C++20 (GCC PR 105651)
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
    LatencyRecorder& latency = st.latency;
    std::mutex pending_mu;
    std::vector<Pending> pending;
    cfg.hooks.after_db_commit = [&](const BatchInfo& info) {
        const std::int64_t now_w = wall_us();
        const std::int64_t now_s = steady_us();
        std::vector<Pending> committed;
        {
            std::lock_guard<std::mutex> lock(pending_mu);
            committed.swap(pending);
        }
        for (const auto& p : committed)
            if (p.measured)
                latency.record(p.produced_us, p.taken_us, now_w, now_s);
        if (committed.size() != info.claimed)
            unmatched_batches.fetch_add(1);
        stamped.fetch_add(committed.size());
        atomic_max(last_commit, now_s);
    };

    auto decode = [&first_taken](std::string_view payload) {
        BenchEvent e;
        e.d = decode_payload(payload);
        e.taken_us = steady_us();
        std::int64_t unset = -1;
        first_taken.compare_exchange_strong(unset, e.taken_us);
        return e;
    };
    auto keep_pending = [&](const BenchEvent& e) {
        pending.push_back({e.d.produced_us, e.taken_us, st.measured(e.d.seq, job)});
    };
    auto handler = [&](pqxx::work& tx, const BenchEvent& e, const Context& ctx) {
        prepare_once(tx.conn(), effect_statement, st.tables.insert_effect);
        const auto key = ctx.key() ? std::string(*ctx.key()) : std::string();
        detail::pg::exec_prepared(tx, effect_statement, e.d.id_text.data(), key, amount_of(e.d.id), e.d.produced_us);
        if (job.slow_every > 0 && e.d.seq % job.slow_every == 0)
            std::this_thread::sleep_for(job.slow_for); // a slow downstream call
        std::lock_guard<std::mutex> lock(pending_mu);
        keep_pending(e);
    };
    auto batch_handler = [&](pqxx::work& tx, const Batch<BenchEvent>& batch) {
        prepare_once(tx.conn(), effects_statement, st.tables.insert_effects_unnest);
        using Entry = Batch<BenchEvent>::Entry;
        detail::pg::exec_prepared(tx, effects_statement,
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
        std::lock_guard<std::mutex> lock(pending_mu);
        for (const auto& r : batch)
            keep_pending(r.event);
    };

    auto event_id = [](const BenchEvent& e) { return e.d.id; };
    std::optional<IdempotentConsumer<BenchEvent>> holder;
    if (job.batch_handler)
        holder.emplace(cfg, decode, event_id, batch_handler);
    else
        holder.emplace(cfg, decode, event_id, handler);
    auto& consumer = *holder;

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

} // namespace idemkafka::bench
