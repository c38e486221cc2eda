// Handlers and records that misbehave: a handler that swallows a database
// error, records too large to dead-letter, a dead-letter topic that refuses.
// Every test ends with exact counts: nothing lost, nothing doubled, nothing
// written outside the claim transaction.

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/retention.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// Events whose handler runs a statement that fails with a unique violation,
// catches the error and goes on writing, as a handler that treats "already
// exists" as fine would (without a savepoint).
struct Swallower {
    Fixture& f;
    std::set<EventId> bad;
    std::string taken = unique_name("taken");
    std::string escaped = unique_name("escaped");
    std::atomic<int> bad_calls{0};

    Swallower(Fixture& fixture, int every) : f(fixture)
    {
        for (std::size_t i = 0; i < f.events.size(); i += static_cast<std::size_t>(every))
            bad.insert(f.events[i].id);
        exec(fmt::format("CREATE TABLE {} (id int PRIMARY KEY); INSERT INTO {} VALUES (1)", taken, taken));
        exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL)", escaped));
    }

    void handle(pqxx::work& tx, const TestEvent& e, const Context& ctx)
    {
        f.insert(tx, e, ctx);
        if (!bad.count(e.id))
            return;
        ++bad_calls;
        try {
            tx.exec(fmt::format("INSERT INTO {} VALUES (1)", taken)); // 23505
        } catch (const pqxx::sql_error&) {
            // "already exists": fine, says this handler
        }
        try {
            // A write after the error: it must never commit.
            detail::pg::exec_params(tx, fmt::format("INSERT INTO {} VALUES ($1::uuid)", escaped), e.id.to_string());
        } catch (const pqxx::sql_error&) {
        }
    }

    std::int64_t escaped_rows() const { return scalar("SELECT count(*) FROM " + escaped); }
    std::int64_t bad_effects() const
    {
        std::string ids;
        for (const auto& id : bad)
            ids += (ids.empty() ? "'" : ",'") + id.to_string() + "'";
        return scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id IN ({})", f.effects, ids));
    }
};

} // namespace

TEST_CASE("a handler that swallows an SQL error: nothing escapes, that record is dead-lettered, the rest commit",
          "[fault][adversity]")
{
    constexpr int partitions = 4;
    constexpr int events = 400;
    Fixture f(partitions);
    f.publish(events);
    Swallower s(f, 50);
    const auto bad = static_cast<std::int64_t>(s.bad.size());
    auto cfg = f.config();
    cfg.max_attempts = 2;

    std::string shape;
    SECTION("per-record handler, batches of many")
    {
        shape = "records";
    }
    SECTION("per-record handler, max_batch = 1: the swallowing call is the last of its transaction")
    {
        shape = "single";
        cfg.max_batch = 1;
    }
    SECTION("batch handler")
    {
        shape = "batch";
    }
    SECTION("per-record handler, 3 workers")
    {
        shape = "workers";
        cfg.workers = 3;
    }
    CAPTURE(shape);

    auto check = [&](Consumer& c) {
        run_until(
            c,
            [&] {
                return c.metrics().snapshot().dead_lettered_total() == static_cast<std::uint64_t>(bad) &&
                       f.rows() == events - bad;
            },
            60s);
        const auto m = c.metrics().snapshot();
        CHECK(s.escaped_rows() == 0);
        CHECK(s.bad_effects() == 0);
        f.check_exact(static_cast<std::size_t>(events - bad));
        CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == static_cast<std::uint64_t>(bad));
        // Only the swallowing records are blamed, each max_attempts times.
        CHECK(m.handler_failures == static_cast<std::uint64_t>(bad * cfg.max_attempts));
        // A batch handler's call for many records counts too, before the split finds the record.
        CHECK(m.handler_aborted_transactions >= static_cast<std::uint64_t>(bad * cfg.max_attempts));
        CHECK(f.committed_total(partitions) == events);
        const auto dlq = read_topic(f.group + ".dlq", static_cast<std::size_t>(bad), 30s);
        REQUIRE(dlq.size() == static_cast<std::size_t>(bad));
        std::set<std::string> ids;
        for (const auto& r : dlq) {
            CHECK(r.header("idemkafka.reason") == "handler_failed");
            CHECK(r.header("idemkafka.error").find("transaction aborted inside the handler") != std::string::npos);
            ids.insert(r.header("idemkafka.event_id"));
        }
        std::set<std::string> expected;
        for (const auto& id : s.bad)
            expected.insert(id.to_string());
        CHECK(ids == expected);
    };

    if (shape == "batch") {
        Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const Batch<TestEvent>& b) {
            for (const auto& entry : b)
                s.handle(tx, entry.event, entry.context);
        });
        check(c);
    } else {
        Consumer c(cfg, decode, event_id_of,
                   [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { s.handle(tx, e, ctx); });
        check(c);
        CHECK(s.bad_calls == bad * cfg.max_attempts);
        CHECK(c.metrics().snapshot().handler_aborted_transactions ==
              static_cast<std::uint64_t>(bad * cfg.max_attempts));
    }
}

TEST_CASE("a handler that tolerates an error inside a subtransaction is not blamed", "[fault][adversity]")
{
    constexpr int events = 100;
    Fixture f(2);
    f.publish(events);
    const auto taken = unique_name("taken");
    exec(fmt::format("CREATE TABLE {} (id int PRIMARY KEY); INSERT INTO {} VALUES (1)", taken, taken));
    std::atomic<int> tolerated{0};
    Consumer c(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.amount % 10 == 0) {
            try {
                pqxx::subtransaction sub(tx, "tolerate");
                sub.exec(fmt::format("INSERT INTO {} VALUES (1)", taken)); // 23505, rolled back to the savepoint
                sub.commit();
            } catch (const pqxx::sql_error&) {
                ++tolerated;
            }
        }
        f.insert(tx, e, ctx);
    });
    run_until(
        c, [&] { return f.rows() == events; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(events);
    CHECK(tolerated == events / 10);
    CHECK(m.handler_failures == 0);
    CHECK(m.handler_aborted_transactions == 0);
    CHECK(m.dead_lettered_total() == 0);
}

TEST_CASE("a record too large to dead-letter goes without its payload, once; the partition moves on",
          "[fault][adversity]")
{
    Fixture f(1);
    const std::size_t big = 1500 * 1000;
    {
        // The broker takes records up to its own limit; the consumer's max_payload_bytes (1 MiB) and the
        // dead-letter producer's message.max.bytes (1,000,000) are smaller.
        Publisher pub(PublisherConfig{brokers(), {{"message.max.bytes", "2000000"}}, log_sink()});
        auto valid = [&](int n) {
            for (int i = 0; i < n; ++i) {
                TestEvent e{new_event_id(), fmt::format("entity-{}", i % 7), i};
                f.events.push_back(e);
                pub.publish_async(f.topic, e.entity, encode(e));
            }
        };
        valid(10);
        pub.publish_async(f.topic, "garbage", "not an event");
        valid(5);
        pub.publish_async(f.topic, "big", std::string(big, 'x'), {Header{"trace", std::string("t-1")}});
        valid(5);
        for (int i = 0; i < 3; ++i)
            pub.publish_async(f.topic, "garbage", "not an event either");
        valid(10);
        pub.flush();
    }
    auto cfg = f.config();
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 30 && c.metrics().snapshot().dead_lettered_total() == 5; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(30);
    CHECK(m.dead_lettered_for(DeadLetterReason::payload_too_large) == 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 4);
    CHECK(m.dead_letter_failures == 0);
    CHECK(committed_offset(f.group, f.topic, 0) == 35);
    // Exactly five dead letters: none written twice (read until a sixth or 5 s).
    const auto dlq = read_topic(f.group + ".dlq", 6, 5s);
    REQUIRE(dlq.size() == 5);
    int oversize = 0;
    for (const auto& r : dlq) {
        if (r.header("idemkafka.reason") != "payload_too_large")
            continue;
        ++oversize;
        CHECK_FALSE(r.value.has_value());
        CHECK(r.header("idemkafka.original.value_bytes") == std::to_string(big));
        CHECK(r.header("idemkafka.original.offset") == "16");
        CHECK(r.header("trace") == "t-1");
        CHECK(r.key == std::optional<std::string>("big"));
    }
    CHECK(oversize == 1);
}

TEST_CASE("a dead-letter topic that refuses a record: the partition waits with a growing backoff, then moves on",
          "[fault][adversity][mock]")
{
    Fixture f(2);
    f.publish(20);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(f.topic, "entity-1", "garbage"); // same key as some events: one partition
    }
    f.publish(20, "later");
    // Six refusals in a row: with retry_backoff 100 ms the tries are spaced
    // 100, 200, 400, 800, 1600 ms apart, not once per poll.
    mock_control("push-errors Produce MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE "
                 "MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE");
    struct ClearOnExit { // a failed test must not leave its errors to the next one
        ~ClearOnExit()
        {
            try {
                mock_control("clear-errors Produce");
            } catch (...) {
            }
        }
    } clear_on_exit;
    auto cfg = f.config();
    cfg.retry_backoff = 100ms;
    std::mutex mu;
    std::vector<std::chrono::steady_clock::time_point> refusals;
    auto sink = log_sink();
    cfg.log = [&](const LogRecord& r) {
        if (r.message.find("not acknowledged") != std::string::npos) {
            std::lock_guard<std::mutex> lock(mu);
            refusals.push_back(std::chrono::steady_clock::now());
        }
        sink(r);
    };
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 40 && c.metrics().snapshot().dead_lettered_total() == 1; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(40);
    CHECK(m.dead_letter_failures >= 1);
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(refusals.size() == m.dead_letter_failures);
    REQUIRE(refusals.size() >= 3);
    // The tries wait a backoff doubling per refusal: 100, 200, 400 ... ms. Load
    // can only stretch the gaps, so their sum is at least the backoffs' sum
    // (with a constant backoff it would be about 100 ms per gap).
    std::chrono::milliseconds backoffs{0};
    for (std::size_t k = 1; k < refusals.size(); ++k)
        backoffs += cfg.retry_backoff * (1 << (k - 1));
    CHECK(refusals.back() - refusals.front() >= backoffs * 9 / 10);
    CHECK(read_topic(f.group + ".dlq", 2, 5s).size() == 1);
}

namespace {

// The claims table as a consumer with the default settings creates it.
void ensure_claims_table()
{
    pqxx::connection conn(pg());
    Maintenance(ProcessedEventStore("public", "processed_event"), RetentionConfig{}).migrate(conn);
}

// A trigger on the claims table, for this group only, that fails the first
// `times` claim statements with SQLSTATE `state`: a conflict at the claim,
// which is no record's doing. Dropped at the end of the test.
struct ClaimConflicts {
    std::string seq = unique_name("claim_conflicts");
    std::string fn = unique_name("claim_conflict_fn");
    std::string trigger = unique_name("claim_conflict_tr");

    ClaimConflicts(const std::string& group, int times, const std::string& state = "40001")
    {
        exec(fmt::format("CREATE SEQUENCE {}", seq));
        exec(fmt::format("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         "IF nextval('{}') <= {} THEN RAISE EXCEPTION 'injected conflict' USING ERRCODE = '{}'; "
                         "END IF; RETURN NEW; END $$",
                         fn, seq, times, state));
        exec(fmt::format("CREATE TRIGGER {} BEFORE INSERT ON processed_event FOR EACH ROW "
                         "WHEN (NEW.consumer_group = '{}') EXECUTE FUNCTION {}()",
                         trigger, group, fn));
    }
    ~ClaimConflicts()
    {
        try {
            exec(fmt::format("DROP TRIGGER {} ON processed_event; DROP FUNCTION {}(); DROP SEQUENCE {}", trigger, fn,
                             seq));
        } catch (...) {
        }
    }
    std::int64_t fired() const { return scalar(fmt::format("SELECT last_value FROM {}", seq)); }
};

} // namespace

TEST_CASE("a conflict at the claim that outlasts transaction_retries blames no record", "[fault][adversity]")
{
    Fixture f(1);
    f.publish(30);
    // Ensure the claims table exists before the trigger goes on it.
    ensure_claims_table();
    ClaimConflicts conflicts(f.group, 8);
    auto cfg = f.config();
    cfg.transaction_retries = 2;
    cfg.max_attempts = 2;
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 30; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(30);
    CHECK(conflicts.fired() >= 8);
    CHECK(m.handler_failures == 0);
    CHECK(m.dead_lettered_total() == 0);
    CHECK(m.transaction_retries >= 2);
    CHECK(m.db_failures >= 1);
    CHECK(committed_offset(f.group, f.topic, 0) == 30);
}

TEST_CASE("a conflict at COMMIT that outlasts transaction_retries blames no record", "[fault][adversity]")
{
    Fixture f(1);
    f.publish(30);
    // A deferred trigger on the effects table fails the first 8 COMMITs with 40001.
    const auto seq = unique_name("commit_conflicts");
    const auto fn = unique_name("commit_conflict_fn");
    exec(fmt::format("CREATE SEQUENCE {}", seq));
    exec(fmt::format("CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "IF nextval('{}') <= 8 THEN RAISE EXCEPTION 'injected conflict at commit' USING ERRCODE = "
                     "'40001'; END IF; RETURN NULL; END $$",
                     fn, seq));
    exec(fmt::format("CREATE CONSTRAINT TRIGGER {} AFTER INSERT ON {} DEFERRABLE INITIALLY DEFERRED "
                     "FOR EACH ROW EXECUTE FUNCTION {}()",
                     unique_name("commit_conflict_tr"), f.effects, fn));
    auto cfg = f.config();
    cfg.transaction_retries = 2;
    cfg.max_attempts = 2;
    cfg.max_batch = 5;
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 30; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(30);
    CHECK(scalar(fmt::format("SELECT last_value FROM {}", seq)) >= 8);
    CHECK(m.handler_failures == 0);
    CHECK(m.dead_lettered_total() == 0);
    CHECK(committed_offset(f.group, f.topic, 0) == 30);
}

TEST_CASE("a claim waiting on another transaction's claims is bounded by lock_timeout and blames no record",
          "[fault][adversity]")
{
    Fixture f(1);
    f.publish(20);
    ensure_claims_table();
    // Another member's open batch: the claims of events 5..9, not committed.
    pqxx::connection other(pg());
    auto holder = std::make_unique<pqxx::work>(other);
    for (int i = 5; i < 10; ++i)
        holder->exec(fmt::format("INSERT INTO processed_event (event_id, consumer_group) VALUES ('{}', '{}')",
                                 f.events[static_cast<std::size_t>(i)].id.to_string(), f.group));
    auto cfg = f.config();
    cfg.lock_timeout = 300ms;
    cfg.max_attempts = 2;
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    Runner<Consumer> run(c);
    const bool timed_out = wait_until([&] { return c.metrics().snapshot().lock_timeouts >= 3; }, 30s);
    holder->abort(); // the other member's batch rolls back: its records are ours to process
    holder.reset();
    const bool done = wait_until([&] { return f.rows() == 20; }, 60s);
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(timed_out);
    REQUIRE(done);
    const auto m = c.metrics().snapshot();
    f.check_exact(20);
    CHECK(m.handler_failures == 0);
    CHECK(m.dead_lettered_total() == 0);
}

namespace {

EventId old_v7(std::int64_t days_ago, std::uint64_t n)
{
    const auto now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    return EventId::from_v7_parts(static_cast<std::uint64_t>(now - days_ago * 86400000), static_cast<std::uint16_t>(n),
                                  0x0123456789abcdefULL ^ (n * 0x9E3779B97F4A7C15ULL));
}

} // namespace

TEST_CASE("a reconcile hook that keeps failing: retried max_attempts times, then dead-lettered", "[fault][adversity]")
{
    Fixture f(1);
    f.publish(10);
    const TestEvent old{old_v7(30, 1), "entity-old", 1};
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(f.topic, old.entity, encode(old));
    }
    f.publish(10);
    auto cfg = f.config();
    cfg.max_attempts = 3;
    cfg.retention.maintenance = false;
    cfg.retention.beyond_horizon = HorizonPolicy::reconcile;
    std::atomic<int> hook_calls{0};
    cfg.retention.reconcile = [&](pqxx::work&, const Context&) -> ReconcileOutcome {
        ++hook_calls;
        throw std::runtime_error("ledger unreachable");
    };
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 20 && c.metrics().snapshot().dead_lettered_total() == 1; }, 60s);
    const auto m = c.metrics().snapshot();
    f.check_exact(20);
    CHECK(hook_calls == 3);
    CHECK(m.dead_lettered_for(DeadLetterReason::beyond_dedup_horizon) == 1);
    const auto dlq = read_topic(f.group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() == 1);
    CHECK(dlq[0].header("idemkafka.event_id") == old.id.to_string());
    CHECK(dlq[0].header("idemkafka.error").find("reconcile hook failed 3 times: ledger unreachable") !=
          std::string::npos);
    CHECK(committed_offset(f.group, f.topic, 0) == 21);
}

TEST_CASE("a reconcile hook's skip claims the event with what the hook wrote", "[fault][adversity]")
{
    Fixture f(1);
    const TestEvent old{old_v7(30, 2), "entity-old", 1};
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(f.topic, old.entity, encode(old));
    }
    f.publish(5);
    auto cfg = f.config();
    cfg.retention.maintenance = false;
    cfg.retention.beyond_horizon = HorizonPolicy::reconcile;
    cfg.retention.reconcile = [&](pqxx::work& tx, const Context& ctx) {
        tx.exec(fmt::format("INSERT INTO {} (event_id, member, kafka_partition, kafka_offset) VALUES ('{}', "
                            "'reconciled', {}, {})",
                            f.effects, ctx.event_id().to_string(), ctx.partition(), ctx.offset()));
        return ReconcileOutcome::skip;
    };
    std::atomic<int> handled_old{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.id == old.id)
            ++handled_old;
        f.insert(tx, e, ctx);
    });
    run_until(
        c, [&] { return f.rows() == 6 && c.metrics().snapshot().duplicates == 1; }, 60s);
    f.check_exact(6);
    CHECK(handled_old == 0);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}' AND event_id = '{}'",
                             f.group, old.id.to_string())) == 1);
}

TEST_CASE("a partition in retry backoff during an eager rebalance is fetched again afterwards", "[fault][adversity]")
{
    Fixture f(1);
    f.publish(20);
    const auto other_topic = unique_name("other");
    create_topic(other_topic, 1);
    const EventId failing = f.events[5].id;
    auto cfg = f.config();
    // The rebalance lands inside the backoff, however slow the machine: with
    // the partition resumed at assignment nothing waits it out.
    cfg.retry_backoff = 60000ms;
    cfg.retry_backoff_max = 60000ms;
    cfg.kafka["partition.assignment.strategy"] = "range";
    std::atomic<int> attempts{0};
    std::atomic<bool> rebalanced_before_retry{false};
    std::atomic<const Metrics*> metrics{nullptr};
    std::atomic<std::uint64_t> rebalances_at_failure{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.id == failing) {
            const auto rebalances = metrics.load()->snapshot().rebalances;
            if (++attempts == 1) {
                rebalances_at_failure = rebalances;
                throw std::runtime_error("first attempt fails");
            }
            // Revoked and assigned again since the failure.
            rebalanced_before_retry = rebalances >= rebalances_at_failure + 2;
        }
        f.insert(tx, e, ctx);
    });
    metrics = &c.metrics();
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return c.metrics().snapshot().handler_failures == 1; }, 60s));
    // A second member of the group, on another topic: an eager rebalance
    // revokes and gives back the paused partition.
    auto other_cfg = consumer_config(f.group, other_topic);
    other_cfg.kafka["partition.assignment.strategy"] = "range";
    Consumer other(other_cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
    Runner<Consumer> other_run(other);
    REQUIRE(wait_until([&] { return other.metrics().snapshot().assigned_partitions == 1; }, 60s));
    const bool done = wait_until([&] { return f.rows() == 20; }, 60s);
    other_run.join();
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(done);
    CHECK(rebalanced_before_retry);
    CHECK(attempts == 2);
    CHECK(c.metrics().snapshot().rebalances >= 3);
    f.check_exact(20);
}

TEST_CASE("the first record the non_v7 default dead-letters logs once which setting to change", "[fault][adversity]")
{
    Fixture f(1);
    f.publish(5);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 3; ++i) {
            // UUIDv4, as most existing producers send.
            const TestEvent e{EventId::parse(fmt::format("6f1c2a3b-4d5e-4f60-8a7b-{:012x}", 0xabc000 + i)), "entity-v4",
                              i};
            pub.publish(f.topic, e.entity, encode(e));
        }
    }
    auto cfg = f.config();
    cfg.table = unique_name("claims"); // created partitioned, the default layout
    cfg.retention.maintenance = false;
    std::mutex mu;
    std::vector<LogRecord> errors;
    auto sink = log_sink();
    cfg.log = [&](const LogRecord& r) {
        if (r.level == LogLevel::error) {
            std::lock_guard<std::mutex> lock(mu);
            errors.push_back(r);
        }
        sink(r);
    };
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    run_until(
        c, [&] { return f.rows() == 5 && c.metrics().snapshot().dead_lettered_total() == 3; }, 60s);
    CHECK(c.metrics().snapshot().dead_lettered_for(DeadLetterReason::non_v7_event_id) == 3);
    CHECK(f.rows() == 5);
    std::lock_guard<std::mutex> lock(mu);
    int explained = 0;
    for (const auto& r : errors)
        if (r.message.find("retention.non_v7 = NonV7Policy::process") != std::string::npos)
            ++explained;
    CHECK(explained == 1);
}
