// Rebalances under either group protocol (IDEMKAFKA_TEST_GROUP_PROTOCOL): an
// assignment lost to a fenced membership, then exact counts. The scaling and
// fenced-zombie tests carry the [rebalance] tag too.

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

TEST_CASE("an assignment lost to a fenced membership commits nothing for it; the member rejoins, counts stay exact",
          "[fault][rebalance][mock]")
{
    Fixture f(2);
    f.publish(600);
    auto cfg = f.config();
    cfg.max_batch = 20;
    std::atomic<int> lost_lines{0};
    cfg.log = [&, fallback = log_sink()](const LogRecord& r) {
        if (r.message.find("lost; committing nothing") != std::string::npos)
            ++lost_lines;
        fallback(r);
    };
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
        std::this_thread::sleep_for(2ms); // records still in flight when the fence comes
    });
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return calls >= 100; }, 60s));
    // The coordinator no longer knows this member: classic answers its next
    // Heartbeat with UNKNOWN_MEMBER_ID, the consumer protocol its next
    // ConsumerGroupHeartbeat with FENCED_MEMBER_EPOCH. Either way the
    // assignment is lost, not revoked, and the member joins again.
    mock_control(consumer_protocol() ? "push-errors ConsumerGroupHeartbeat FENCED_MEMBER_EPOCH"
                                     : "push-errors Heartbeat UNKNOWN_MEMBER_ID");
    REQUIRE(wait_until([&] { return lost_lines > 0; }, 60s));
    REQUIRE(wait_until([&] { return f.rows() == 600 && c.metrics().snapshot().lag == 0; }, 120s));
    run.join();
    REQUIRE_FALSE(run.error());
    CHECK(c.metrics().snapshot().rebalances >= 3); // assign, lost, assign again
    f.check_exact(600);
}

TEST_CASE("the group coordinator unreachable: records are still processed, stop() is not held by the commit, "
          "a successor redelivers nothing twice",
          "[fault][rebalance][mock]")
{
    Fixture f(2);
    f.publish(300);
    std::atomic<int> calls{0};
    auto handler = [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
        std::this_thread::sleep_for(1ms);
    };
    auto cfg = f.config();
    cfg.shutdown_timeout = 5s;
    auto c = std::make_unique<Consumer>(cfg, decode, event_id_of, handler);
    auto run = std::make_unique<Runner<Consumer>>(*c);
    REQUIRE(wait_until([&] { return calls >= 20; }, 60s));
    // Cleared on the way out, also when a REQUIRE fails: the errors are cluster-wide.
    struct ClearOnExit {
        ~ClearOnExit()
        {
            for (const char* api : {"OffsetCommit", "FindCoordinator"})
                try {
                    mock_control(std::string("clear-errors ") + api);
                } catch (const std::exception&) {
                }
        }
    } clear_on_exit;
    // The coordinator answers no commit and cannot be found again: the client
    // knows no coordinator from here on.
    std::string not_available;
    for (int i = 0; i < 120; ++i) // about a lookup a second: longer than the test
        not_available += " COORDINATOR_NOT_AVAILABLE";
    mock_control("push-errors FindCoordinator" + not_available);
    mock_control("push-errors OffsetCommit NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR");
    // The member keeps its partitions and goes on (the consumer protocol
    // fetches on; the classic one until its session would expire).
    REQUIRE(wait_until([&] { return f.rows() == 300; }, 90s));
    // Records processed right before the stop leave a commit waiting for the
    // coordinator, which librdkafka keeps the handle for (up to
    // session.timeout.ms: 45 s under the consumer protocol).
    f.publish(20, "late");
    REQUIRE(wait_until([&] { return f.rows() == 320; }, 60s));
    const auto stopping = std::chrono::steady_clock::now();
    run->join();
    const auto stop_took = std::chrono::steady_clock::now() - stopping;
    REQUIRE_FALSE(run->error());
    CAPTURE(std::chrono::duration_cast<std::chrono::milliseconds>(stop_took).count());
    // The last commit, the group leave and the handle's destruction each wait
    // at most shutdown_timeout, not as long as the coordinator stays away (two
    // minutes and more before) nor for the commit librdkafka holds.
    CHECK(stop_took < 3 * cfg.shutdown_timeout);
    run.reset();
    c.reset();

    mock_control("clear-errors FindCoordinator");
    mock_control("clear-errors OffsetCommit");
    std::atomic<int> again{0};
    Consumer successor(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++again;
    });
    run_until(successor, [&] {
        const auto m = successor.metrics().snapshot();
        return m.assigned_partitions == 2 && m.lag == 0;
    });
    CHECK(again == 0); // whatever was not committed in Kafka came again as a duplicate
    f.check_exact(320);
}

// A member frozen inside its transaction (its handler and its poll thread stand still: SIGSTOP,
// a paused VM) keeps the row locks of the claims it took. Kafka drops it after
// max.poll.interval.ms and gives its partition to the successor, whose claims of the same ids
// wait on those locks: without help, for as long as the frozen process lives.
TEST_CASE("a member frozen inside its transaction does not stall its successor: its session is ended, every "
          "record is processed once while it stays frozen",
          "[fault]")
{
    Fixture f(1);
    f.publish(200);
    auto zcfg = f.config();
    zcfg.max_batch = 100;
    zcfg.pipeline = true;
    zcfg.kafka["max.poll.interval.ms"] = "7000"; // the frozen member leaves the group after 7 s
    std::atomic<bool> frozen{false}, handler_frozen{false}, release{false};
    auto freeze = [&] {
        while (!release)
            std::this_thread::sleep_for(10ms);
    };
    Consumer zombie(
        zcfg,
        [&](std::string_view payload) {
            auto e = decode(payload);
            // The second batch (amounts 100 on) is decoded while the first runs:
            // the poll thread stands still here once the handler does.
            if (e.amount >= 100 && !frozen.exchange(true)) {
                wait_until([&] { return handler_frozen.load(); }, 30s);
                freeze();
            }
            return e;
        },
        event_id_of,
        [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            f.insert(tx, e, ctx, "zombie");
            if (!handler_frozen.exchange(true))
                freeze(); // inside the transaction that holds the claims of the first batch
        });
    Runner<Consumer> zr(zombie);
    struct ReleaseOnExit {
        std::atomic<bool>& flag;
        ~ReleaseOnExit() { flag = true; }
    } release_on_exit{release};
    REQUIRE(wait_until([&] { return frozen.load(); }, 60s));

    auto scfg = f.config();
    scfg.kafka["max.poll.interval.ms"] = "7000";
    scfg.lock_timeout = 2s;
    std::atomic<int> calls{0};
    Consumer successor(scfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx, "successor");
        ++calls;
    });
    Runner<Consumer> sr(successor);
    ReleaseOnExit release_before_joins{release}; // a failed REQUIRE releases the zombie before sr joins
    // Everything processed while the zombie is still frozen.
    REQUIRE(wait_until([&] { return f.rows() == 200 && successor.metrics().snapshot().lag == 0; }, 90s));
    CHECK_FALSE(release.load());
    const auto m = successor.metrics().snapshot();
    CHECK(m.frozen_members_ended == 1);
    CHECK(m.lock_timeouts >= 1);
    CHECK(calls == 200);

    release = true;
    zr.join();
    sr.join();
    fail_if_threw(sr.error(), "successor");
    // The zombie's transaction was rolled back on the server: nothing of it committed, and
    // when it woke it found its session gone (whatever it did next was a duplicate).
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE member = 'zombie'", f.effects)) == 0);
    f.check_exact(200);
}
