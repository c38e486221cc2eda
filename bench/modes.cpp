// run_job (set-up, metering, verification common to every mode) and the
// PostgreSQL floors, which do the library's database work without Kafka.

#include "modes.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "pg/claims.hpp"
#include "pg/exec.hpp"
#include <idemkafka/store.hpp>

namespace idemkafka::bench {

namespace {

void verify_effects(const RunEnv& env, const RunState& st, Result& r)
{
    const auto c = count_rows(env.services.postgres, st.tables);
    const auto unique = static_cast<std::int64_t>(r.unique);
    if (c.distinct_effects < unique)
        r.errors.push_back(
            fmt::format("lost: {} of {} distinct events have no effect row", unique - c.distinct_effects, unique));
    if (c.effects != c.distinct_effects)
        r.errors.push_back(
            fmt::format("doubled: {} effect rows for {} distinct events", c.effects, c.distinct_effects));
    if (c.distinct_effects > unique)
        r.errors.push_back(fmt::format("{} effect rows for {} expected events", c.distinct_effects, unique));
    if (c.claims != unique)
        r.errors.push_back(fmt::format("{} claim rows for {} distinct events", c.claims, unique));
}

// The kill -9 run's verification: the charges doubled and missing, in the
// result and as a note. The hand-written pattern's are the finding, reported,
// not a failure of the bench; the library's break its contract: errors.
void verify_kill9(const RunEnv& env, const Job& job, const RunState& st, Result& r)
{
    Result found;
    found.unique = r.unique;
    verify_effects(env, st, found);
    const auto c = count_rows(env.services.postgres, st.tables);
    r.kill_doubled = c.effects - c.distinct_effects;
    r.kill_missing = std::max<std::int64_t>(0, static_cast<std::int64_t>(r.unique) - c.distinct_effects);
    for (const auto& e : found.errors)
        r.notes.push_back("kill -9: " + e);
    if (found.errors.empty())
        r.notes.push_back("kill -9: no charge doubled or missing");
    if (job.kind != Kind::spring)
        for (const auto& e : found.errors)
            r.errors.push_back("kill -9: " + e);
}

} // namespace

std::string group_of(const Job& job)
{
    return fmt::format("ikbench-run-{:05}", job.serial);
}

Result run_job(const RunEnv& env, const Job& job, const OnReady& on_ready)
{
    Result r;
    r.mode = job.mode;
    r.dup_percent = job.data->dup_percent();
    r.events = job.count;
    r.unique = job.data->unique_in(job.count);
    if (job.slow_every > 0) {
        for (std::size_t seq = 0; seq < job.count; seq += static_cast<std::size_t>(job.slow_every))
            r.slow_calls += job.data->at(seq).resend ? 0 : 1;
        r.slow_seconds = std::chrono::duration<double>(job.slow_for).count();
    }
    r.paced = job.paced;
    r.rate = job.rate;
    RunState st(r, on_ready);
    const auto wall_start = SteadyClock::now();
    std::int64_t start_us = -1;
    try {
        if (job.kind != Kind::kafka_raw) {
            ClaimsLayout layout;
            layout.mode = job.plain_claims ? RetentionMode::purge : RetentionMode::partitioned;
            if (job.prefilled) {
                if (env.prefill_table.empty())
                    throw std::logic_error(job.mode + ": no prefilled table (--prefill)");
                layout.prefilled_table = env.prefill_table;
                layout.run_ids_from = env.prefill_run_ids_from;
            }
            st.tables = prepare_tables(env.services.postgres, env.schema, job.mode, layout);
        }
        Meter::reset_peak();
        r.rss_start_mb = Meter::rss_mb();
        st.cpu_before = env.meter->sample();
        start_us = steady_us();
        switch (job.kind) {
        case Kind::kafka_raw:
            run_kafka_raw(env, job, st);
            break;
        case Kind::naive_listener:
            run_naive_listener(env, job, st);
            break;
        case Kind::pg_floor_per_event:
        case Kind::pg_floor_batch:
        case Kind::pg_floor_batch_rowwise:
            run_pg_floor(env, job, st);
            break;
        case Kind::idemkafka:
            run_idemkafka(env, job, st);
            break;
        case Kind::idemkafka_share:
            run_idemkafka_share(env, job, st);
            break;
        case Kind::spring:
            run_spring(env, job, st);
            break;
        }
        r.rss_peak_mb = st.child_rss_peak_mb >= 0 ? st.child_rss_peak_mb : Meter::peak_rss_mb();
        if (!st.cpu_taken)
            st.take_cpu_after(*env.meter);
        // CPU of a paced run would include the producer's: not reported.
        r.has_cpu = !job.paced && job.kills == 0; // a kill run: many JVMs, none measured
        r.cpu = Meter::split(st.cpu_before, st.cpu_after, job.count);
        if (st.child_cpu_seconds_run >= 0) {
            // The JVM's threads cannot be told apart here: all of it is "app",
            // its Kafka client included, none "rdkafka"; the bench's own CPU
            // (waiting for the child) is left out.
            r.cpu.process = st.child_cpu_seconds_run * 1e6 / static_cast<double>(job.count);
            r.cpu.app = r.cpu.process;
            r.cpu.rdkafka = 0;
        }
        if (st.first_taken_us >= 0)
            r.startup_seconds = static_cast<double>(st.first_taken_us - start_us) / 1e6;
        if (st.first_taken_us >= 0 && st.last_commit_us > st.first_taken_us) {
            r.seconds = static_cast<double>(st.last_commit_us - st.first_taken_us) / 1e6;
            r.events_per_s = static_cast<double>(job.count) / r.seconds;
        }
        r.end_to_end = st.latency.end_to_end();
        r.taken_to_commit = st.latency.taken_to_commit();
        if (job.kind != Kind::kafka_raw && r.errors.empty() && job.kills > 0) {
            verify_kill9(env, job, st, r);
        } else if (job.kind != Kind::kafka_raw && r.errors.empty()) {
            verify_effects(env, st, r);
        }
    } catch (const std::exception& e) {
        r.errors.push_back(e.what());
    }
    r.wall_seconds = seconds_between(wall_start, SteadyClock::now());
    return r;
}

// ---- PostgreSQL floors -----------------------------------------------------

namespace {

struct FloorItem {
    Dataset::Rec rec;
    std::int64_t produced_us;
};

// Hands out the records of a floor run: all at once for a drain, or as a
// generator thread releases them at the paced rate.
class FloorSource {
public:
    FloorSource(const Job& job, Counter processed) : job_(job), processed_(std::move(processed))
    {
        if (job.paced)
            generator_ = std::thread([this] { generate(); });
    }
    ~FloorSource()
    {
        stop_ = true;
        cv_.notify_all();
        if (generator_.joinable())
            generator_.join();
    }

    // Fills `out` with up to `n` records (the next of job.batches, when
    // given); false when the run is complete. Paced: waits for the first
    // record, then up to job.batch_wait for more, like the library's poll loop.
    bool next(std::size_t n, std::vector<FloorItem>& out)
    {
        out.clear();
        if (job_.batches && next_batch_ < job_.batches->size())
            n = (*job_.batches)[next_batch_++];
        if (!job_.paced) {
            const std::int64_t now = wall_us();
            for (; out.size() < n && next_seq_ < job_.count; ++next_seq_)
                out.push_back({job_.data->at(job_.order ? (*job_.order)[next_seq_] : next_seq_), now});
            return !out.empty();
        }
        std::unique_lock<std::mutex> lock(mu_);
        if (taken_ == job_.count)
            return false;
        cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
        const auto deadline = SteadyClock::now() + job_.batch_wait;
        while (queue_.size() < n && taken_ + queue_.size() < job_.count && !stop_ &&
               cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
        }
        while (out.size() < n && !queue_.empty()) {
            out.push_back(queue_.front());
            queue_.pop_front();
        }
        taken_ += out.size();
        return !out.empty();
    }

private:
    void generate()
    {
        name_thread("ik-generator");
        auto start = SteadyClock::now();
        std::size_t first = 0;
        for (std::size_t seq = 0; seq < job_.count && !stop_; ++seq) {
            if (seq == job_.warmup && seq > 0) {
                wait_processed(
                    seq, [this] { return processed_->load(); }, stop_);
                start = SteadyClock::now();
                first = seq;
            }
            std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<std::int64_t>(
                                                      static_cast<double>(seq - first) * 1e6 / job_.rate)));
            std::lock_guard<std::mutex> lock(mu_);
            queue_.push_back({job_.data->at(seq), wall_us()});
            cv_.notify_all();
        }
    }

    const Job& job_;
    Counter processed_;
    std::size_t next_seq_ = 0;
    std::size_t next_batch_ = 0;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<FloorItem> queue_;
    std::size_t taken_ = 0;
    std::atomic<bool> stop_{false};
    std::thread generator_;
};

} // namespace

void run_pg_floor(const RunEnv& env, const Job& job, RunState& st)
{
    const bool multi_row = job.kind == Kind::pg_floor_batch;
    const ProcessedEventStore store(st.tables.schema, st.tables.claims);
    const std::string group = group_of(job);

    pqxx::connection conn(env.services.postgres);
    // The library's claim statement, prepared as the library prepares it.
    conn.prepare("ikbench_claim", detail::pg::claim_sql(store));
    conn.prepare("ikbench_effect", st.tables.insert_effect);
    conn.prepare("ikbench_effects", st.tables.insert_effects_unnest);

    struct Row {
        EventId id;
        std::array<char, 37> id_text;
        std::string key;
        std::int64_t produced_us;
        std::size_t seq;
    };
    std::vector<FloorItem> items;
    std::vector<Row> rows;
    std::vector<EventId> ids;
    std::vector<std::size_t> first; // index of the first row of each distinct id
    std::unordered_map<EventId, std::size_t> seen;
    std::vector<const Row*> fresh;

    FloorSource source(job, st.processed);
    st.ready();
    while (source.next(job.batch, items)) {
        const std::int64_t taken = steady_us();
        if (st.first_taken_us < 0)
            st.first_taken_us = taken;
        // What the library does per record before its transaction: build the
        // row, drop ids repeated inside the batch.
        rows.clear();
        ids.clear();
        first.clear();
        seen.clear();
        for (const auto& it : items) {
            Row row;
            row.id = job.data->id_of(it.rec.event);
            row.id.format_to(row.id_text.data());
            row.id_text[36] = '\0';
            row.key = job.data->key_of(it.rec.event);
            row.produced_us = it.produced_us;
            row.seq = it.rec.seq;
            rows.push_back(std::move(row));
            if (seen.emplace(rows.back().id, rows.size() - 1).second) {
                ids.push_back(rows.back().id);
                first.push_back(rows.size() - 1);
            }
        }

        pqxx::work tx(conn);
        const detail::pg::ClaimedIds claimed(detail::pg::claimed_ids(
            detail::pg::exec_prepared(tx, "ikbench_claim", detail::pg::uuid_array(ids), group)));
        fresh.clear();
        for (std::size_t i : first)
            if (claimed.contains(rows[i].id))
                fresh.push_back(&rows[i]);
        if (!multi_row) {
            for (const Row* row : fresh)
                detail::pg::exec_prepared(tx, "ikbench_effect", row->id_text.data(), row->key, amount_of(row->id),
                                          row->produced_us);
        } else if (!fresh.empty()) {
            detail::pg::exec_prepared(
                tx, "ikbench_effects",
                array_literal(fresh.begin(), fresh.end(), [](const Row* r) { return std::string(r->id_text.data()); }),
                array_literal(fresh.begin(), fresh.end(), [](const Row* r) { return r->key; }),
                array_literal(fresh.begin(), fresh.end(),
                              [](const Row* r) { return std::to_string(amount_of(r->id)); }),
                array_literal(fresh.begin(), fresh.end(), [](const Row* r) { return std::to_string(r->produced_us); }));
        }
        tx.commit();
        ++st.result.transactions;
        const std::int64_t now_w = wall_us();
        const std::int64_t now_s = steady_us();
        st.last_commit_us = now_s;
        for (const Row* row : fresh)
            if (st.measured(static_cast<std::int64_t>(row->seq), job))
                st.latency.record(row->produced_us, taken, now_w, now_s);
        st.effects_reported += fresh.size();
        *st.processed += items.size();
    }
    st.take_cpu_after(*env.meter);
    if (st.effects_reported != st.result.unique)
        st.result.errors.push_back(
            fmt::format("claimed {} events, expected {}", st.effects_reported, st.result.unique));
}

} // namespace idemkafka::bench
