// HandlerHarness (idemkafka/handler_harness.hpp) tested through its own API:
// every outcome it reports is checked against what the library really left
// in PostgreSQL (effects, claims) and in the dead letter it produced. The
// database is a schema on IDEMKAFKA_TEST_PG when it is set, else a throwaway
// cluster (TestDatabase); without either the tests fail, they never skip.

#include <atomic>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/handler_harness.hpp>
#include <idemkafka/testing.hpp>

#include "catch_compat.hpp"
#include "charge_event.hpp"

namespace {

using idemkafka::ConsumerConfig;
using idemkafka::Context;
using idemkafka::DeadLetterReason;
using idemkafka::Delivery;
using idemkafka::DeliveryOutcome;
using idemkafka::EventId;
using idemkafka::HandlerHarness;
using idemkafka::TestDatabase;
using idemkafka::TestMessage;

using kit_test::Charge;
using kit_test::decode;
using kit_test::encode;
using kit_test::event_id_of;

std::string charge_payload(std::int64_t amount)
{
    return encode(Charge{idemkafka::new_event_id(), amount});
}

// A schema with a `charge` table without a unique key, so a doubled effect
// shows as a second row; handler calls and the attempts they saw are counted.
struct Fixture {
    TestDatabase db;
    std::vector<int> attempts; // Context::attempt() of each handler call

    Fixture()
    {
        db.exec("CREATE TABLE charge (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, amount bigint NOT NULL)");
    }

    ConsumerConfig config(int max_attempts = 5) const
    {
        ConsumerConfig cfg;
        cfg.group_id = "billing";
        db.configure(cfg);
        cfg.max_attempts = max_attempts;
        cfg.log = idemkafka::stderr_sink(idemkafka::LogLevel::error);
        return cfg;
    }

    // The handler under test: writes the charge, then does what `then` says.
    auto handler(std::function<void(const Charge&, const Context&)> then = nullptr)
    {
        return [this, then](pqxx::work& tx, const Charge& c, const Context& ctx) {
            attempts.push_back(ctx.attempt());
            tx.exec(fmt::format("INSERT INTO charge (event_id, amount) VALUES ('{}', {})", c.id.to_string(), c.amount));
            if (then)
                then(c, ctx);
        };
    }

    std::int64_t effects() const { return db.scalar("SELECT count(*) FROM charge"); }
    std::int64_t claims() const
    {
        return db.scalar("SELECT count(*) FROM processed_event WHERE consumer_group = 'billing'");
    }
    std::int64_t claims_of(const EventId& id) const
    {
        return db.scalar(
            fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = 'billing' AND event_id = '{}'",
                        id.to_string()));
    }
};

std::string header(const idemkafka::TestRecord& r, const char* name)
{
    return r.header(name).value_or("<none>");
}

} // namespace

TEST_CASE("HandlerHarness: deliver_twice gives one effect and one duplicate", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(), decode, event_id_of, f.handler());
    const auto payload = charge_payload(4200);

    const auto d = h.deliver_twice(payload);
    CHECK(d.first.outcome == DeliveryOutcome::processed);
    CHECK(d.first.attempt == 1);
    CHECK(d.second.outcome == DeliveryOutcome::duplicate);
    CHECK(d.first.event_id == decode(payload).id);
    CHECK(d.second.event_id == d.first.event_id);
    CHECK(d.second.offset == d.first.offset + 1); // a re-send: a new record

    CHECK(f.effects() == 1);
    CHECK(f.claims_of(d.first.event_id) == 1);
    CHECK((f.attempts == std::vector<int>{1}));
    const auto m = h.metrics().snapshot();
    CHECK(m.consumed == 2);
    CHECK(m.claimed == 1);
    CHECK(m.duplicates == 1);
    CHECK(m.dead_lettered_total() == 0);
    CHECK(h.dead_letters().empty());

    SECTION("a third delivery is one more duplicate, still one effect")
    {
        CHECK(h.deliver(payload).outcome == DeliveryOutcome::duplicate);
        CHECK(f.effects() == 1);
        CHECK(h.metrics().snapshot().duplicates == 2);
    }
    SECTION("another event is processed")
    {
        CHECK(h.deliver(charge_payload(1)).outcome == DeliveryOutcome::processed);
        CHECK(f.effects() == 2);
        CHECK(f.claims() == 2);
    }
}

TEST_CASE("HandlerHarness: a NonRetryableError is dead-lettered at once with non_retryable", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(), decode, event_id_of, f.handler([](const Charge&, const Context&) {
        throw idemkafka::NonRetryableError("card declined for good");
    }));
    const auto payload = charge_payload(500);

    const auto d = h.deliver(payload);
    REQUIRE(d.outcome == DeliveryOutcome::dead_lettered);
    CHECK(d.reason == DeadLetterReason::non_retryable);
    CHECK(d.error.find("card declined for good") != std::string::npos);
    CHECK(d.attempt == 1);
    CHECK((f.attempts == std::vector<int>{1}));
    // The handler's write and the claim were rolled back together.
    CHECK(f.effects() == 0);
    CHECK(f.claims() == 0);

    REQUIRE(h.dead_letters().size() == 1);
    const auto& letter = h.dead_letters().front();
    REQUIRE(d.dead_letter);
    CHECK(letter.value == d.dead_letter->value);
    CHECK(letter.topic == "billing.dlq");
    CHECK(letter.value == payload);
    CHECK(header(letter, idemkafka::dead_letter_header::reason) == "non_retryable");
    CHECK(header(letter, idemkafka::dead_letter_header::error).find("card declined for good") != std::string::npos);
    CHECK(header(letter, idemkafka::dead_letter_header::event_id) == decode(payload).id.to_string());
    CHECK(header(letter, idemkafka::dead_letter_header::attempts) == "1");
    CHECK(header(letter, idemkafka::dead_letter_header::original_offset) == std::to_string(d.offset));
    CHECK(header(letter, idemkafka::dead_letter_header::consumer_group) == "billing");
    const auto m = h.metrics().snapshot();
    CHECK(m.dead_lettered_for(DeadLetterReason::non_retryable) == 1);
    CHECK(m.handler_failures == 1);
    CHECK(m.retries == 0);
}

TEST_CASE("HandlerHarness: a dead letter's error header is masked as the log is", "[testing][harness]")
{
    Fixture f;
    auto cfg = f.config();
    // Ignored by the test server (trust), remembered as a secret of the configuration.
    cfg.postgres += " password=pg-secret-7731";
    HandlerHarness<Charge> h(cfg, decode, event_id_of, f.handler([](const Charge&, const Context&) {
        throw idemkafka::NonRetryableError(
            "provider refused: dsn host=ledger user=app password=hunter2 dbname=x; "
            "retry via postgresql://app:s3cr3t-uri@ledger/x; echoed pg-secret-7731; sasl.password=k4fk4-k3y");
    }));
    const auto d = h.deliver(charge_payload(7));
    REQUIRE(d.outcome == DeliveryOutcome::dead_lettered);
    REQUIRE(h.dead_letters().size() == 1);
    const auto error = header(h.dead_letters().front(), idemkafka::dead_letter_header::error);
    INFO(error);
    CHECK(error.find("provider refused") != std::string::npos);
    for (const char* secret : {"hunter2", "s3cr3t-uri", "pg-secret-7731", "k4fk4-k3y"})
        CHECK(error.find(secret) == std::string::npos);
    CHECK(error.find("password=***") != std::string::npos);
}

TEST_CASE("HandlerHarness: poison records are dead-lettered with the consumer's reasons", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(), decode, event_id_of, f.handler());

    SECTION("a decode failure: decode_error, no handler call")
    {
        const auto d = h.deliver("not a charge at all");
        REQUIRE(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::decode_error);
        CHECK(d.error == "not a charge");
        CHECK(d.event_id.is_nil());
        CHECK(d.attempt == 0);
        REQUIRE(h.dead_letters().size() == 1);
        CHECK(header(h.dead_letters().front(), idemkafka::dead_letter_header::reason) == "decode_error");
        CHECK(h.metrics().snapshot().decode_errors == 1);
        CHECK(h.metrics().snapshot().dead_lettered_for(DeadLetterReason::decode_error) == 1);
    }
    SECTION("a malformed event id: invalid_event_id")
    {
        const auto d = h.deliver("charge:not-a-uuid:12");
        CHECK(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::invalid_event_id);
    }
    SECTION("an empty payload: empty_payload")
    {
        const auto d = h.deliver(std::string_view());
        CHECK(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::empty_payload);
    }
    SECTION("a UUIDv4 event id under the default partitioned table: non_v7_event_id")
    {
        const auto d = h.deliver("charge:3b241101-e2bb-4255-8caf-4136c566a962:12");
        CHECK(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::non_v7_event_id);
    }
    CHECK(f.attempts.empty());
    CHECK(f.effects() == 0);
    CHECK(f.claims() == 0);
    CHECK(h.dead_letters().size() == 1);
}

TEST_CASE("HandlerHarness: a retryable failure counts attempts and is dead-lettered at max_attempts",
          "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(3), decode, event_id_of, f.handler([](const Charge&, const Context& ctx) {
        throw std::runtime_error(fmt::format("provider timeout {}", ctx.attempt()));
    }));
    const auto payload = charge_payload(700);

    const auto ds = h.deliver_until_dead_letter(payload);
    REQUIRE(ds.size() == 3);
    CHECK(ds[0].outcome == DeliveryOutcome::failed);
    CHECK(ds[0].attempt == 1);
    CHECK(ds[0].error == "provider timeout 1");
    CHECK(ds[1].outcome == DeliveryOutcome::failed);
    CHECK(ds[1].attempt == 2);
    CHECK(ds[1].error == "provider timeout 2");
    CHECK(ds[2].outcome == DeliveryOutcome::dead_lettered);
    CHECK(ds[2].reason == DeadLetterReason::handler_failed);
    CHECK(ds[2].error == "provider timeout 3");
    CHECK(ds[2].attempt == 3);
    for (const auto& d : ds)
        CHECK(d.offset == ds[0].offset); // one record, redelivered
    CHECK((f.attempts == std::vector<int>{1, 2, 3}));
    CHECK(f.effects() == 0);
    CHECK(f.claims() == 0);

    REQUIRE(h.dead_letters().size() == 1);
    CHECK(header(h.dead_letters().front(), idemkafka::dead_letter_header::reason) == "handler_failed");
    CHECK(header(h.dead_letters().front(), idemkafka::dead_letter_header::attempts) == "3");
    const auto m = h.metrics().snapshot();
    CHECK(m.handler_failures == 3);
    CHECK(m.retries == 2);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
}

TEST_CASE("HandlerHarness: a handler that fails once succeeds on redelivery, with one effect", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(), decode, event_id_of, f.handler([](const Charge&, const Context& ctx) {
        if (ctx.attempt() == 1)
            throw std::runtime_error("connection reset by the provider");
    }));
    const auto payload = charge_payload(900);

    const auto first = h.deliver(payload);
    CHECK(first.outcome == DeliveryOutcome::failed);
    CHECK(first.attempt == 1);
    CHECK(f.effects() == 0); // rolled back
    CHECK(f.claims() == 0);

    const auto again = h.redeliver();
    CHECK(again.outcome == DeliveryOutcome::processed);
    CHECK(again.attempt == 2);
    CHECK(again.offset == first.offset);
    CHECK(f.effects() == 1);
    CHECK(f.claims() == 1);
    CHECK((f.attempts == std::vector<int>{1, 2}));

    SECTION("deliver_until_dead_letter stops at the first delivery that is not a failure")
    {
        const auto ds = h.deliver_until_dead_letter(charge_payload(1));
        REQUIRE(ds.size() == 2);
        CHECK(ds[0].outcome == DeliveryOutcome::failed);
        CHECK(ds[1].outcome == DeliveryOutcome::processed);
        CHECK(f.effects() == 2);
    }
}

TEST_CASE("HandlerHarness: a crash after the database commit gives one effect", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(), decode, event_id_of, f.handler());
    const auto payload = charge_payload(1300);

    const auto d = h.deliver_with_crash_after_commit(payload);
    CHECK(d.first.outcome == DeliveryOutcome::processed);
    CHECK(d.second.outcome == DeliveryOutcome::duplicate);
    CHECK(d.second.offset == d.first.offset); // the same record, its offset commit lost
    CHECK(d.second.event_id == d.first.event_id);
    CHECK(f.effects() == 1);
    CHECK(f.claims() == 1);
    CHECK((f.attempts == std::vector<int>{1}));
    CHECK(h.metrics().snapshot().duplicates == 1);
    CHECK(h.dead_letters().empty());

    SECTION("a failure count does not survive the crash")
    {
        int calls = 0;
        HandlerHarness<Charge> flaky(f.config(), decode, event_id_of,
                                     [&](pqxx::work&, const Charge&, const Context& ctx) {
                                         ++calls;
                                         CHECK(ctx.attempt() == 1);
                                         throw std::runtime_error("down");
                                     });
        const auto p = flaky.deliver_with_crash_after_commit(charge_payload(5));
        CHECK(p.first.outcome == DeliveryOutcome::failed);
        CHECK(p.second.outcome == DeliveryOutcome::failed);
        CHECK(p.second.attempt == 1);
        CHECK(calls == 2);
    }
}

TEST_CASE("HandlerHarness: a batch handler, a record's headers and key reach the handler", "[testing][harness]")
{
    Fixture f;
    std::vector<std::string> seen;
    HandlerHarness<Charge> h(
        f.config(), decode, event_id_of, [&](pqxx::work& tx, const idemkafka::Batch<Charge>& batch) {
            for (const auto& [c, ctx] : batch) {
                seen.push_back(std::string(ctx.key().value_or("<null>")) + "/" +
                               std::string(ctx.header("tenant").value_or("<none>")) + "/" + std::string(ctx.topic()));
                tx.exec(
                    fmt::format("INSERT INTO charge (event_id, amount) VALUES ('{}', {})", c.id.to_string(), c.amount));
            }
        });
    TestMessage m;
    m.value = charge_payload(10);
    m.key = "account-7";
    m.headers.push_back({"tenant", std::string("acme")});
    m.topic = "orders";
    const auto d = h.deliver_twice(m);
    CHECK(d.first.outcome == DeliveryOutcome::processed);
    CHECK(d.second.outcome == DeliveryOutcome::duplicate);
    CHECK(d.first.topic == "orders");
    CHECK((seen == std::vector<std::string>{"account-7/acme/orders"}));
    CHECK(f.effects() == 1);
}

TEST_CASE("HandlerHarness: a handler that swallows an SQL error fails that record", "[testing][harness]")
{
    Fixture f;
    HandlerHarness<Charge> h(f.config(2), decode, event_id_of, [](pqxx::work& tx, const Charge&, const Context&) {
        try {
            tx.exec("INSERT INTO no_such_table VALUES (1)");
        } catch (const pqxx::sql_error&) {
            // swallowed: the transaction is aborted all the same
        }
    });
    const auto ds = h.deliver_until_dead_letter(charge_payload(3));
    REQUIRE(ds.size() == 2);
    CHECK(ds[0].outcome == DeliveryOutcome::failed);
    // libpqxx 6 has rolled the transaction back itself: aborted or ended, it says.
    CHECK(ds[0].error.find("transaction aborted") != std::string::npos);
    CHECK(ds[0].error.find("inside the handler") != std::string::npos);
    CHECK(ds[1].outcome == DeliveryOutcome::dead_lettered);
    CHECK(ds[1].reason == DeadLetterReason::handler_failed);
    CHECK(f.claims() == 0);
}

TEST_CASE("HandlerHarness: configuration and database errors are exceptions", "[testing][harness]")
{
    auto id = [](const Charge& c) { return c.id; };
    auto noop = [](pqxx::work&, const Charge&, const Context&) {};
    ConsumerConfig cfg;
    cfg.postgres = "host=/nonexistent-idemkafka-socket-dir connect_timeout=2";
    CHECK_THROWS_AS(HandlerHarness<Charge>(cfg, decode, id, noop), idemkafka::ConfigError); // no group_id
    cfg.group_id = "billing";
    CHECK_THROWS_AS(HandlerHarness<Charge>(cfg, decode, id, noop), idemkafka::DatabaseError);
}

TEST_CASE("HandlerHarness: with Ordering::key a failing record is failed too (its key parked)", "[testing][harness]")
{
    Fixture f;
    auto cfg = f.config(2);
    cfg.ordering = idemkafka::Ordering::key;
    HandlerHarness<Charge> h(cfg, decode, event_id_of, f.handler([](const Charge&, const Context& ctx) {
        if (ctx.attempt() == 1)
            throw std::runtime_error("busy");
    }));
    TestMessage m;
    m.value = charge_payload(8);
    m.key = "account-8";
    const auto ds = h.deliver_until_dead_letter(m);
    REQUIRE(ds.size() == 2);
    CHECK(ds[0].outcome == DeliveryOutcome::failed);
    CHECK(ds[0].error == "busy");
    CHECK(ds[1].outcome == DeliveryOutcome::processed);
    CHECK(ds[1].attempt == 2);
    CHECK(f.effects() == 1);
}
