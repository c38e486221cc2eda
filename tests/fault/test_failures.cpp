// Failure paths against a real PostgreSQL and the mock broker: retries, dead
// letters, broker and database faults, rebalances and shutdown. Every test
// ends by counting effects: nothing lost, nothing doubled.

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

TEST_CASE("retries exhausted: dead letter with handler_failed, the partition moves on", "[fault]")
{
    Fixture f(1);
    f.publish(30);
    const EventId bad = f.events[10].id;
    std::atomic<int> bad_attempts{0};
    auto cfg = f.config();
    cfg.max_attempts = 3;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (e.id == bad) {
            ++bad_attempts;
            throw std::runtime_error("card declined by a bug");
        }
    });
    run_until(c, [&] { return f.rows() == 29 && c.metrics().snapshot().dead_lettered_total() == 1; });
    const auto m = c.metrics().snapshot();
    CHECK(bad_attempts == 3);
    CHECK(m.handler_failures == 3);
    CHECK(m.retries == 2);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
    f.check_exact(29);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE event_id = '{}'", bad.to_string())) == 0);
    const auto dlq = read_topic(f.group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() == 1);
    CHECK(dlq[0].header("idemkafka.reason") == "handler_failed");
    CHECK(dlq[0].header("idemkafka.attempts") == "3");
    CHECK(dlq[0].header("idemkafka.event_id") == bad.to_string());
    CHECK(dlq[0].header("idemkafka.error") == "card declined by a bug");
    CHECK(dlq[0].value == std::optional<std::string>(encode(f.events[10])));
    CHECK(committed_offset(f.group, f.topic, 0) == 30);
}

TEST_CASE("non-retryable failures go to the dead letter on the first failure", "[fault]")
{
    Fixture f(2);
    f.publish(40);
    const EventId by_type = f.events[5].id;
    const EventId by_predicate = f.events[20].id;
    std::atomic<int> calls_by_type{0}, calls_by_predicate{0};
    struct Rejected : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    auto cfg = f.config();
    cfg.is_retryable = [](const std::exception& e) { return dynamic_cast<const Rejected*>(&e) == nullptr; };
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.id == by_type) {
            ++calls_by_type;
            throw NonRetryableError("order was cancelled");
        }
        if (e.id == by_predicate) {
            ++calls_by_predicate;
            throw Rejected("amount over limit");
        }
        f.insert(tx, e, ctx);
    });
    run_until(c, [&] { return f.rows() == 38 && c.metrics().snapshot().dead_lettered_total() == 2; });
    const auto m = c.metrics().snapshot();
    CHECK(calls_by_type == 1);
    CHECK(calls_by_predicate == 1);
    CHECK(m.retries == 0);
    CHECK(m.dead_lettered_for(DeadLetterReason::non_retryable) == 2);
    f.check_exact(38);
    const auto dlq = read_topic(f.group + ".dlq", 2, 30s);
    REQUIRE(dlq.size() == 2);
    std::set<std::string> ids;
    for (const auto& r : dlq) {
        CHECK(r.header("idemkafka.reason") == "non_retryable");
        CHECK(r.header("idemkafka.attempts") == "1");
        ids.insert(r.header("idemkafka.event_id"));
    }
    CHECK(ids == std::set<std::string>{by_type.to_string(), by_predicate.to_string()});
}

TEST_CASE("dead-letter topic unavailable: the offset does not move until the dead letter is acknowledged",
          "[fault][mock]")
{
    Fixture f(1);
    f.publish(5);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(f.topic, "k", "garbage");
    }
    f.publish(5);
    // The next Produce requests fail: the dead-letter producer's first tries.
    mock_control("push-errors Produce MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE");

    std::mutex mu;
    std::vector<std::int64_t> committed_while_failing;
    auto cfg = f.config();
    cfg.log = [&](LogLevel, std::string_view msg) {
        if (msg.find("not acknowledged") != std::string_view::npos) {
            std::lock_guard<std::mutex> lock(mu);
            committed_while_failing.push_back(committed_offset(f.group, f.topic, 0));
        }
    };
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(c, [&] { return f.rows() == 10 && c.metrics().snapshot().dead_lettered_total() == 1; });
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_letter_failures >= 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 1);
    {
        std::lock_guard<std::mutex> lock(mu);
        REQUIRE_FALSE(committed_while_failing.empty());
        for (auto off : committed_while_failing)
            CHECK(off <= 5); // never past the poison record at offset 5
    }
    f.check_exact(10);
    CHECK(committed_offset(f.group, f.topic, 0) == 11);
    const auto dlq = read_topic(f.group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() >= 1);
    CHECK(dlq[0].header("idemkafka.original.offset") == "5");
}

TEST_CASE("a dead letter the broker acknowledges after dead_letter_timeout is written once", "[fault][mock]")
{
    Fixture f(1);
    f.publish(5);
    auto cfg = f.config();
    cfg.dead_letter_timeout = 1s;
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return f.rows() == 5; }, 60s));
    // Every answer of the broker now takes 2.5 s: the dead letter's Produce
    // is written at once but acknowledged after its 1 s timeout, again and again.
    mock_control("rtt 1 2500");
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(f.topic, "k", "garbage", {}, 30s);
    }
    REQUIRE(wait_until([&] { return c.metrics().snapshot().dead_lettered_total() == 1; }, 90s));
    mock_control("rtt 1 0");
    f.publish(5);
    REQUIRE(wait_until([&] { return f.rows() == 10 && committed_offset(f.group, f.topic, 0) == 11; }, 60s));
    run.join();
    fail_if_threw(run.error());
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_letter_failures >= 1); // the timeouts
    // Before: each timeout purged the record the broker had written, and the
    // next try wrote another copy.
    const auto dlq = read_topic(f.group + ".dlq", 5, 10s);
    CHECK(dlq.size() == 1);
    f.check_exact(10);
}

TEST_CASE("offset commit failures are counted, never fatal, and lose or double nothing", "[fault][mock]")
{
    Fixture f(2);
    f.publish(300);
    mock_control("push-errors OffsetCommit REBALANCE_IN_PROGRESS NOT_COORDINATOR REQUEST_TIMED_OUT "
                 "REBALANCE_IN_PROGRESS UNKNOWN_MEMBER_ID");
    std::atomic<int> calls{0};
    auto handler = [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
    };
    auto cfg = f.config();
    cfg.max_batch = 20;
    {
        Consumer c(cfg, decode, event_id_of, handler);
        // Failed commits are sent again, also once the partitions are idle.
        run_until(c, [&] {
            return f.rows() == 300 &&
                   committed_offset(f.group, f.topic, 0) + committed_offset(f.group, f.topic, 1) == 300;
        });
        CHECK(c.metrics().snapshot().offset_commit_failures >= 1);
    }
    // Whatever was not committed in Kafka comes again: dedup absorbs it.
    Consumer again(cfg, decode, event_id_of, handler);
    run_until(again, [&] { return again.metrics().snapshot().lag == 0; });
    CHECK(calls == 300);
    f.check_exact(300);
}

TEST_CASE("a PostgreSQL connection killed mid-batch: reconnect, redeliver, exact counts", "[fault]")
{
    Fixture f(2);
    f.publish(400);
    std::atomic<bool> killed{false};
    auto cfg = f.config();
    cfg.max_batch = 100;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (ctx.offset() == 50 && !killed.exchange(true))
            tx.exec("SELECT pg_terminate_backend(pg_backend_pid())");
    });
    run_until(c, [&] { return f.rows() == 400 && c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(killed);
    CHECK(m.db_reconnects >= 1);
    CHECK(m.db_failures >= 1);
    CHECK(m.handler_failures == 0);
    f.check_exact(400);
}

TEST_CASE("a PostgreSQL restart in the middle of a run loses and doubles nothing", "[fault]")
{
    const char* restart = std::getenv("IDEMKAFKA_TEST_PG_RESTART");
    REQUIRE(restart != nullptr); // scripts/test.sh provides it for its throwaway server
    Fixture f(4);
    f.publish(3000);
    auto cfg = f.config();
    cfg.max_batch = 50;
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
    });
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return calls >= 500; }, 60s));
    REQUIRE(std::system(restart) == 0);
    REQUIRE(wait_until([&] { return c.metrics().snapshot().lag == 0 && f.rows() == 3000; }, 90s));
    run.join();
    REQUIRE_FALSE(run.error());
    CHECK(c.metrics().snapshot().db_reconnects >= 1);
    f.check_exact(3000);
}

TEST_CASE("a serialization failure re-runs the transaction without counting a handler failure", "[fault]")
{
    Fixture f(1);
    f.publish(20);
    std::atomic<bool> thrown{false};
    Consumer c(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (ctx.offset() == 7 && !thrown.exchange(true)) {
            const std::string what = "could not serialize access due to concurrent update";
#if PQXX_VERSION_MAJOR >= 7 // what, query, SQLSTATE
            throw pqxx::serialization_failure(what, "", "40001");
#else
            throw pqxx::serialization_failure(what);
#endif
        }
    });
    run_until(c, [&] { return f.rows() == 20; });
    const auto m = c.metrics().snapshot();
    CHECK(m.transaction_retries == 1);
    CHECK(m.handler_failures == 0);
    f.check_exact(20);
}

namespace {

// Several members of one group with a slow handler, joining and leaving
// while records are in flight.
void scale_test(const std::string& strategy)
{
    Fixture f(6);
    f.publish(2400);
    auto cfg = f.config();
    cfg.max_batch = 25;
    set_assignment_strategy(cfg, strategy); // the consumer protocol's broker assigns, incrementally
    std::atomic<int> calls{0};
    auto make = [&](const std::string& member) {
        return std::make_unique<Consumer>(cfg, decode, event_id_of,
                                          [&, member](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                                              f.insert(tx, e, ctx, member);
                                              ++calls;
                                              std::this_thread::sleep_for(5ms); // work outlasts the joins
                                          });
    };
    auto a = make("a");
    auto ra = std::make_unique<Runner<Consumer>>(*a);
    REQUIRE(wait_until([&] { return calls >= 100; }, 60s));
    // 1 -> 3 members while a batch is in flight
    auto b = make("b");
    auto c = make("c");
    auto rb = std::make_unique<Runner<Consumer>>(*b);
    auto rc = std::make_unique<Runner<Consumer>>(*c);
    REQUIRE(wait_until(
        [&] {
            return b->metrics().snapshot().assigned_partitions > 0 && c->metrics().snapshot().assigned_partitions > 0;
        },
        60s));
    // The joiners take over partitions with work left (which ones is the
    // assignor's choice, so only their sum is certain).
    REQUIRE(wait_until([&] { return b->metrics().snapshot().claimed + c->metrics().snapshot().claimed > 0; }, 60s));
    // 3 -> 1
    rb.reset();
    rc.reset();
    REQUIRE(wait_until([&] { return f.rows() == 2400; }, 120s));
    ra.reset();
    for (auto* m : {a.get(), b.get(), c.get()}) {
        REQUIRE(m->metrics().snapshot().rebalances >= 1);
    }
    const auto total_claimed =
        a->metrics().snapshot().claimed + b->metrics().snapshot().claimed + c->metrics().snapshot().claimed;
    CHECK(total_claimed == 2400);
    CHECK(calls >= 2400); // rolled-back handler runs may repeat; committed effects may not
    f.check_exact(2400);
}

} // namespace

TEST_CASE("scaling a group 1 -> 3 -> 1 mid-run keeps counts exact (eager)", "[fault][rebalance]")
{
    scale_test("range");
}

TEST_CASE("scaling a group 1 -> 3 -> 1 mid-run keeps counts exact (cooperative-sticky)", "[fault][rebalance]")
{
    scale_test("cooperative-sticky");
}

TEST_CASE("stop() mid-batch commits the batch; a second stop() abandons it; restart completes exactly", "[fault]")
{
    Fixture f(2);
    f.publish(600);
    std::atomic<int> calls{0};
    auto cfg = f.config();
    cfg.max_batch = 100;

    SECTION("graceful")
    {
        std::unique_ptr<Consumer> c;
        c = std::make_unique<Consumer>(cfg, decode, event_id_of,
                                       [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                                           f.insert(tx, e, ctx);
                                           if (++calls == 150)
                                               c->stop(); // the current batch still commits
                                       });
        c->run();
        const auto m = c->metrics().snapshot();
        CHECK(static_cast<std::int64_t>(m.claimed) == f.rows());
        CHECK(f.rows() >= 150);
        CHECK(f.rows() < 600);
    }
    SECTION("forced")
    {
        std::unique_ptr<Consumer> c;
        std::int64_t before = -1;
        c = std::make_unique<Consumer>(cfg, decode, event_id_of,
                                       [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                                           f.insert(tx, e, ctx);
                                           if (++calls == 150) {
                                               before = static_cast<std::int64_t>(c->metrics().snapshot().claimed);
                                               c->stop();
                                               c->stop(); // second stop: abandon this transaction
                                           }
                                       });
        c->run();
        CHECK(f.rows() == before); // the abandoned batch left nothing behind
    }
    Consumer rest(cfg, decode, event_id_of,
                  [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(rest, [&] { return f.rows() == 600 && rest.metrics().snapshot().lag == 0; });
    f.check_exact(600);
}

TEST_CASE("a slow batch commits within its time budget and gives the rest back", "[fault]")
{
    Fixture f(2);
    f.publish(120);
    auto cfg = f.config();
    cfg.max_batch = 500;
    cfg.max_batch_wait = 2s; // one big batch
    cfg.max_batch_duration = 300ms;
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
        std::this_thread::sleep_for(10ms);
    });
    run_until(c, [&] { return f.rows() == 120 && c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(m.db_commits >= 3); // ~30 handler calls per 300 ms budget
    CHECK(calls == 120);      // given-back records ran once, later, not twice
    CHECK(m.claimed == 120);
    f.check_exact(120);
}

TEST_CASE("events beyond the dedup horizon go to the dead letter, never to the handler; key window flag", "[fault]")
{
    Fixture f(1);
    using namespace std::chrono;
    const auto now_ms =
        static_cast<std::uint64_t>(duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
    const TestEvent ancient{EventId::from_v7_parts(now_ms - 8ULL * 24 * 3600 * 1000, 1, 42), "old", 1};
    const TestEvent hours_old{EventId::from_v7_parts(now_ms - 2ULL * 3600 * 1000, 1, 43), "mid", 2};
    const TestEvent fresh{new_event_id(), "new", 3};
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (const auto* e : {&ancient, &hours_old, &fresh})
            pub.publish_async(f.topic, e->entity, encode(*e));
        pub.flush();
    }
    auto cfg = f.config();
    cfg.retention.downstream_key_window = std::chrono::hours(1);
    std::mutex mu;
    std::map<std::string, bool> window;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        std::lock_guard<std::mutex> lock(mu);
        window[e.entity] = ctx.idempotency_key_window_open();
    });
    run_until(c, [&] { return f.rows() == 2 && c.metrics().snapshot().dead_lettered_total() == 1; });
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_lettered_for(DeadLetterReason::beyond_dedup_horizon) == 1);
    CHECK(m.beyond_dedup_horizon == 1);
    CHECK(m.key_window_closed == 1);
    std::lock_guard<std::mutex> lock(mu);
    CHECK(window.count("old") == 0); // never handed to the handler
    CHECK(window["mid"] == false);   // past the downstream key window: check before charging again
    CHECK(window["new"] == true);
    const auto dlq = read_topic(f.group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() == 1);
    CHECK(dlq[0].header("idemkafka.reason") == "beyond_dedup_horizon");
    CHECK(dlq[0].header("idemkafka.event_id") == ancient.id.to_string());
}
