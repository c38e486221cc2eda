// idemkafka_share_handler5ms: IdempotentShareConsumer, Job::share_members
// members of one share group on the data topic, a per-record handler that
// writes one row and then takes 5 ms (as idemkafka_handler5ms_partition's):
// what members beyond the partition count buy when handlers are slow. Built
// only with a librdkafka that has the share consumer (2.15 or later).

#include "modes.hpp"

#include <idemkafka/features.hpp>

#if IDEMKAFKA_HAS_SHARE_CONSUMER

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <exception>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/share_consumer.hpp>

#include "pg/exec.hpp"

namespace idemkafka::bench {

namespace {

struct ShareEvent {
    Decoded d;
    std::int64_t taken_us = 0;
};

struct Pending {
    std::int64_t produced_us;
    std::int64_t taken_us;
    bool measured;
};

// Handled count of the mock broker's control FIFO: "<count> ok|error: ..." in PATH.ack.
long ack_count(const std::string& ack, std::string* text)
{
    std::ifstream in(ack);
    std::string line;
    if (!std::getline(in, line))
        return 0;
    if (text)
        *text = line;
    return std::strtol(line.c_str(), nullptr, 10);
}

// One control command; true when the mock broker answered ok.
bool mock_command(const Services& s, const std::string& command, std::string& answer)
{
    const std::string ack = s.mock_control + ".ack";
    const long before = ack_count(ack, nullptr);
    {
        std::FILE* f = std::fopen(s.mock_control.c_str(), "w");
        if (!f)
            throw std::runtime_error("cannot open mock broker control FIFO " + s.mock_control);
        const std::string line = command + "\n";
        const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
        std::fclose(f);
        if (!ok)
            throw std::runtime_error("cannot write to mock broker control FIFO " + s.mock_control);
    }
    const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
    while (ack_count(ack, &answer) <= before) {
        if (SteadyClock::now() >= deadline)
            throw std::runtime_error("mock broker did not answer: " + command);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return answer.find(" ok") != std::string::npos;
}

void atomic_max(std::atomic<std::int64_t>& a, std::int64_t v) noexcept
{
    std::int64_t cur = a.load();
    while (cur < v && !a.compare_exchange_weak(cur, v)) {
    }
}

} // namespace

void run_idemkafka_share(const RunEnv& env, const Job& job, RunState& st)
{
    const std::string effect_statement = fmt::format("ikbench_effect_{}", job.serial);
    const bool mock = !env.services.mock_control.empty();
    const int members = std::max(1, job.share_members);
    std::string answer;
    if (mock) {
        // Share groups start at the end of a partition unless told otherwise;
        // the heartbeat brings the manual assignment below sooner (5 s by default).
        for (const char* setting : {"share-group auto-offset-reset earliest", "share-group heartbeat-interval-ms 500"})
            if (!mock_command(env.services, setting, answer))
                throw std::runtime_error(fmt::format("{}: {}", setting, answer));
    } else {
        st.result.notes.push_back("external broker: its share group must start at the earliest offset "
                                  "(share.auto.offset.reset)");
    }

    std::atomic<std::int64_t> first_taken{-1};
    std::atomic<std::int64_t> last_commit{-1};
    ShareConsumerConfig cfg;
    cfg.consumer.brokers = env.services.brokers;
    cfg.consumer.group_id = group_of(job);
    cfg.consumer.topics = {job.topic};
    cfg.consumer.postgres = env.services.postgres;
    cfg.consumer.schema = st.tables.schema;
    cfg.consumer.table = st.tables.claims;
    cfg.consumer.max_batch = job.batch;
    if (!env.verbose)
        cfg.consumer.kafka["log_level"] = std::string("3");
    cfg.consumer.log = stderr_sink(env.verbose ? LogLevel::info : LogLevel::warning);
    cfg.members = static_cast<std::size_t>(members);
    LatencyRecorder& latency = st.latency;
    std::mutex pending_mu;
    std::vector<Pending> pending;
    cfg.consumer.hooks.after_db_commit = [&](const BatchInfo&) {
        const std::int64_t now_w = wall_us();
        const std::int64_t now_s = steady_us();
        std::vector<Pending> committed;
        {
            // Members commit side by side: a hook may stamp another member's
            // effects a moment early, as with workers in idemkafka_handler5ms_*.
            std::lock_guard<std::mutex> lock(pending_mu);
            committed.swap(pending);
        }
        for (const auto& p : committed)
            if (p.measured)
                latency.record(p.produced_us, p.taken_us, now_w, now_s);
        atomic_max(last_commit, now_s);
    };
    auto decode = [&first_taken](std::string_view payload) {
        ShareEvent e;
        e.d = decode_payload(payload);
        e.taken_us = steady_us();
        std::int64_t unset = -1;
        first_taken.compare_exchange_strong(unset, e.taken_us);
        return e;
    };
    auto handler = [&](pqxx::work& tx, const ShareEvent& e, const Context& ctx) {
        prepare_once(tx.conn(), effect_statement, st.tables.insert_effect);
        const auto key = ctx.key() ? std::string(*ctx.key()) : std::string();
        detail::pg::exec_prepared(tx, effect_statement, e.d.id_text.data(), key, amount_of(e.d.id), e.d.produced_us);
        if (job.slow_every > 0 && e.d.seq % job.slow_every == 0)
            std::this_thread::sleep_for(job.slow_for); // a slow downstream call
        std::lock_guard<std::mutex> lock(pending_mu);
        pending.push_back({e.d.produced_us, e.taken_us, st.measured(e.d.seq, job)});
    };
    IdempotentShareConsumer<ShareEvent> consumer(
        cfg, decode, [](const ShareEvent& e) { return e.d.id; }, handler);

    ConsumerThread<IdempotentShareConsumer<ShareEvent>> runner(consumer);
    st.ready();

    // The mock's own assignor gives each partition to one member (a real
    // broker's shares them): once every member joined, every partition goes
    // to every member. Records flow under the mock's assignment until then.
    if (mock) {
        const std::string assign = fmt::format("share-assign {} {} {}", cfg.consumer.group_id, members, job.topic);
        const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
        while (!mock_command(env.services, assign, answer)) {
            if (runner.finished() || SteadyClock::now() >= deadline) {
                st.result.errors.push_back(fmt::format("{}: {}", assign, answer));
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    // Until every event's effect committed and every record was taken (a
    // redelivery after a refused acknowledgement counts again, as a duplicate).
    const auto expected = static_cast<std::uint64_t>(job.count);
    const auto unique = static_cast<std::uint64_t>(st.result.unique);
    std::uint64_t last_processed = 0;
    auto last_progress = SteadyClock::now();
    MetricsSnapshot m;
    while (st.result.errors.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        m = consumer.metrics().snapshot();
        const std::uint64_t processed = m.claimed + m.duplicates;
        st.set_processed(static_cast<std::size_t>(std::min(processed, expected)));
        if (m.claimed >= unique && processed >= expected)
            break;
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
    if (const auto failure = runner.stop(); !failure.empty())
        st.result.errors.push_back("consumer failed: " + failure);

    m = consumer.metrics().snapshot();
    const auto& s = consumer.share_metrics();
    st.first_taken_us = first_taken.load();
    st.last_commit_us = last_commit.load();
    st.result.transactions = m.db_commits;
    st.effects_reported = static_cast<std::size_t>(m.claimed);
    if (st.result.errors.empty()) {
        if (m.claimed != unique)
            st.result.errors.push_back(fmt::format("claimed {} events, expected {}", m.claimed, unique));
        if (m.duplicates < expected - unique)
            st.result.errors.push_back(
                fmt::format("{} duplicates skipped, expected at least {}", m.duplicates, expected - unique));
        if (s.released.get() + s.rejected.get() > 0)
            st.result.errors.push_back(
                fmt::format("{} records released, {} rejected", s.released.get(), s.rejected.get()));
    }
    if (m.consumed > expected)
        st.result.notes.push_back(fmt::format("{} records delivered again ({} acknowledgements refused)",
                                              m.consumed - expected, s.acks_refused.get()));
    st.result.notes.push_back(fmt::format("{} share members, max_batch {}", members, job.batch));
}

} // namespace idemkafka::bench

#else

namespace idemkafka::bench {

void run_idemkafka_share(const RunEnv&, const Job& job, RunState& st)
{
    st.result.errors.push_back(job.mode + ": this librdkafka has no share consumer (2.15 or later)");
}

} // namespace idemkafka::bench

#endif
