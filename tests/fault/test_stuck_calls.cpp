// A handler call that never returns cannot be interrupted, but it must be
// seen: the gauge of the oldest running call grows, and past
// max.poll.interval.ms an error line names its record and how long it has
// run, again every max.poll.interval.ms while it runs (not more often); stop()
// waits for it, and the lines go on meanwhile. Once it returns, everything
// settles exactly.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

constexpr auto max_poll = 6s; // the test brokers' session.timeout.ms: the least librdkafka takes

// The error lines about a stuck call, as the log sink saw them.
struct StuckLines {
    std::mutex mu;
    std::vector<LogRecord> lines;

    LogSink sink()
    {
        return [this, fallback = log_sink()](const LogRecord& r) {
            if (r.level == LogLevel::error && r.message.find("and not returned") != std::string::npos) {
                std::lock_guard<std::mutex> lock(mu);
                lines.push_back(r);
            }
            fallback(r);
        };
    }
    std::size_t count()
    {
        std::lock_guard<std::mutex> lock(mu);
        return lines.size();
    }
};

// The call on the record at offset 10 of partition 0 blocks until released
// (at most 90 s, so that a broken build fails instead of hanging).
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    std::atomic<bool> entered{false};

    void maybe_block(const Context& ctx)
    {
        if (ctx.partition() != 0 || ctx.offset() != 10 || entered.exchange(true))
            return;
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, 90s, [this] { return open; });
    }
    void release()
    {
        {
            std::lock_guard<std::mutex> lock(mu);
            open = true;
        }
        cv.notify_all();
    }
};

} // namespace

TEST_CASE("a handler call that does not return: a gauge, an error line naming the record every "
          "max.poll.interval.ms, stop() waits for it; exact once it returns",
          "[fault][stuck-call]")
{
    Fixture f(2);
    f.publish(100);
    StuckLines seen;
    Gate gate;
    auto cfg = f.config();
    cfg.workers = 2;
    cfg.max_batch = 20;
    cfg.shutdown_timeout = 1s; // the stop becomes forced: it still waits for the call
    cfg.kafka["max.poll.interval.ms"] = std::to_string(std::chrono::milliseconds(max_poll).count());
    cfg.log = seen.sink();
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        gate.maybe_block(ctx);
    });
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return gate.entered.load(); }, 60s));
    const auto entered = std::chrono::steady_clock::now();

    // Not before max.poll.interval.ms; then once, and again after as long.
    REQUIRE(wait_until([&] { return seen.count() >= 1; }, 30s));
    const auto first = std::chrono::steady_clock::now() - entered;
    const auto gauge = c.metrics().snapshot().oldest_call_seconds;
    REQUIRE(wait_until([&] { return seen.count() >= 2; }, 30s));
    const auto second = std::chrono::steady_clock::now() - entered;
    const auto m = c.metrics().snapshot();
    CHECK(first >= max_poll);
    CHECK(first < max_poll + 5s);
    CHECK(second >= 2 * max_poll);
    CHECK(seen.count() <= 2);
    CHECK(gauge >= 5.5);
    CHECK(m.oldest_call_seconds >= 11.5);
    CHECK(m.stuck_calls == 1);
    {
        std::lock_guard<std::mutex> lock(seen.mu);
        const auto& line = seen.lines.front();
        CHECK(line.field(log_field::topic) == std::optional<std::string_view>(f.topic));
        CHECK(line.field(log_field::partition) == std::optional<std::string_view>("0"));
        CHECK(line.field(log_field::offset) == std::optional<std::string_view>("10"));
        CHECK(line.field(log_field::event_id).has_value());
        CHECK(line.field("running_ms").has_value());
        CHECK(line.message.find(fmt::format("{}/0@10", f.topic)) != std::string::npos);
    }

    // stop(), forced after shutdown_timeout: run() waits for the call, and
    // says so again meanwhile.
    std::thread stopping([&] { run.join(); });
    const bool third = wait_until([&] { return seen.count() >= 3; }, 15s);
    const bool returned_early = run.finished();
    gate.release();
    stopping.join();
    fail_if_threw(run.error());
    CHECK(third);
    CHECK_FALSE(returned_early);
    CHECK(c.metrics().snapshot().stuck_calls == 1); // one call, however often it was said

    // The stuck call's batch rolled back with the forced stop; a successor
    // finishes, exactly.
    Consumer successor(f.config(), decode, event_id_of,
                       [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(successor, [&] {
        return f.rows() == 100 && f.committed_total(2) == 100 && successor.metrics().snapshot().lag == 0;
    });
    f.check_exact(100);
}
