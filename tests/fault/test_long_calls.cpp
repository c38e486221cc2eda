// A handler call longer than max.poll.interval.ms: the member stays in the
// group (its poll thread polls with the assignment paused while the call
// runs), a rebalance during the call loses and doubles nothing, and a stop
// during the call ends with exact counts.

#include <atomic>
#include <memory>
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

namespace {

constexpr auto max_poll = 7s;
constexpr auto long_call = 2 * max_poll;

// Counts the log lines that show a member dropped from the group: librdkafka's
// "maximum poll interval exceeded" and a lost assignment. A loss right after
// the coordinator refused an offset commit's generation is counted apart: a
// commit that crossed a rebalance makes librdkafka give the assignment up
// whatever the handler does (the protocol's race, not a drop for a long call;
// the counts stay exact either way, which every test checks).
struct DropWatch {
    std::atomic<int> max_poll_exceeded{0};
    std::atomic<int> lost{0};
    std::atomic<int> lost_to_commit_race{0};
    std::atomic<bool> generation_refused{false};

    LogSink sink()
    {
        return [this, fallback = log_sink()](const LogRecord& r) {
            if (r.message.find("maximum poll interval") != std::string::npos)
                ++max_poll_exceeded;
            if (r.message.find("offset commit failed") != std::string::npos &&
                r.message.find("generation id is not valid") != std::string::npos)
                generation_refused = true;
            if (r.message.find("lost; committing nothing") != std::string::npos)
                ++(generation_refused.exchange(false) ? lost_to_commit_race : lost);
            fallback(r);
        };
    }
    void check_not_dropped() const
    {
        CHECK(max_poll_exceeded == 0);
        CHECK(lost == 0);
        if (lost_to_commit_race > 0)
            WARN(lost_to_commit_race << " assignment(s) lost after a commit crossed a rebalance");
    }
};

// One call of `long_call` on the first record at offset 20 of partition 0
// (the first such call only: a redelivery of that record runs at once).
struct LongCall {
    std::atomic<bool> started{false};
    std::atomic<bool> finished{false};

    void maybe_run(const Context& ctx)
    {
        if (ctx.partition() != 0 || ctx.offset() != 20 || started.exchange(true))
            return;
        std::this_thread::sleep_for(long_call); // the slow work itself, not a wait for anything
        finished = true;
    }
};

ConsumerConfig long_call_config(const Fixture& f, const std::string& strategy, DropWatch& watch)
{
    auto cfg = f.config();
    cfg.max_batch = 50;
    cfg.kafka["max.poll.interval.ms"] = std::to_string(std::chrono::milliseconds(max_poll).count());
    set_assignment_strategy(cfg, strategy);
    cfg.log = watch.sink();
    return cfg;
}

} // namespace

TEST_CASE("a handler call of twice max.poll.interval.ms keeps the member in the group; counts stay exact",
          "[fault][long-call][rebalance]")
{
    const std::string strategy = GENERATE(as<std::string>{}, "range", "cooperative-sticky");
    INFO("assignment strategy " << strategy);
    Fixture f(2);
    f.publish(200);
    DropWatch watch;
    LongCall slow;
    Consumer c(long_call_config(f, strategy, watch), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                   f.insert(tx, e, ctx);
                   slow.maybe_run(ctx);
               });
    run_until(
        c, [&] { return slow.finished && f.rows() == 200 && c.metrics().snapshot().lag == 0; }, 120s);
    const auto m = c.metrics().snapshot();
    watch.check_not_dropped();
    CHECK(m.long_call_waits >= 1);
    CHECK(m.revoke_abandons == 0);
    CHECK(m.assigned_partitions == 2);
    f.check_exact(200);
}

TEST_CASE("a second member joins during a handler call of twice max.poll.interval.ms: nobody is dropped, nothing "
          "is doubled or lost",
          "[fault][long-call][rebalance]")
{
    const std::string strategy = GENERATE(as<std::string>{}, "range", "cooperative-sticky");
    INFO("assignment strategy " << strategy);
    Fixture f(2);
    f.publish(200);
    DropWatch watch_a, watch_b;
    LongCall slow;
    auto handler = [&](const char* member) {
        return [&, member](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            f.insert(tx, e, ctx, member);
            slow.maybe_run(ctx);
        };
    };
    Consumer a(long_call_config(f, strategy, watch_a), decode, event_id_of, handler("a"));
    Runner<Consumer> ra(a);
    REQUIRE(wait_until([&] { return slow.started.load(); }, 60s));

    Consumer b(long_call_config(f, strategy, watch_b), decode, event_id_of, handler("b"));
    Runner<Consumer> rb(b);
    REQUIRE(wait_until(
        [&] {
            const auto ma = a.metrics().snapshot();
            const auto mb = b.metrics().snapshot();
            return slow.finished && f.rows() == 200 && ma.assigned_partitions == 1 && mb.assigned_partitions == 1 &&
                   ma.lag == 0 && mb.lag == 0;
        },
        120s));
    ra.join();
    rb.join();
    fail_if_threw(ra.error(), "member a");
    fail_if_threw(rb.error(), "member b");
    watch_a.check_not_dropped();
    watch_b.check_not_dropped();
    const auto ma = a.metrics().snapshot();
    CHECK(ma.long_call_waits >= 1);
    CHECK(ma.revoke_abandons <= 1);
    // The record of the long call has one effect, whoever committed it: the
    // first member if it kept the partition, else the new owner after the
    // first member's transaction was rolled back.
    f.check_exact(200);
}

TEST_CASE("stop() during a handler call of twice max.poll.interval.ms: the member stays in the group until the "
          "call returns, its transaction rolls back past shutdown_timeout, a successor finishes exactly",
          "[fault][long-call]")
{
    Fixture f(2);
    f.publish(200);
    DropWatch watch;
    LongCall slow;
    auto cfg = long_call_config(f, "range", watch);
    cfg.shutdown_timeout = 2s;
    auto c = std::make_unique<Consumer>(cfg, decode, event_id_of,
                                        [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                                            f.insert(tx, e, ctx, "first");
                                            slow.maybe_run(ctx);
                                        });
    auto run = std::make_unique<Runner<Consumer>>(*c);
    REQUIRE(wait_until([&] { return slow.started.load(); }, 60s));
    const auto stopping = std::chrono::steady_clock::now();
    run->join(); // stop(), then wait for run() to return
    const auto stop_took = std::chrono::steady_clock::now() - stopping;
    fail_if_threw(run->error());
    CHECK(slow.finished); // run() returned only after the call
    CHECK(stop_took < long_call + 10s);
    watch.check_not_dropped();
    // The call's transaction was abandoned at the forced stop: none of its
    // batch committed (the record at offset 20 and its batch neighbours).
    CHECK(f.rows() < 200);
    run.reset();
    c.reset();

    std::atomic<int> again{0};
    Consumer successor(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx, "successor");
        ++again;
    });
    run_until(successor, [&] { return f.rows() == 200 && successor.metrics().snapshot().lag == 0; });
    CHECK(again >= 1);
    f.check_exact(200);
}
