// The billing listener's handler under test, written with idemkafka's test
// kit the way a service team would write theirs:
// * HandlerHarness runs billing::ChargeHandler through the library's own
//   claim-and-handle path, one record at a time, without Kafka: re-sends,
//   a crash after the database commit, poison records, a lost response;
// * TestBroker and TestDatabase run the real IdempotentConsumer end to end.
// Every check counts what is in PostgreSQL and what the payment provider did.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/dead_letter.hpp>
#include <idemkafka/handler_harness.hpp>
#include <idemkafka/testing.hpp>

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_test_macros.hpp>
#else
#include <catch2/catch.hpp>
#endif

#include "charge.hpp"
#include "order_confirmed.hpp"
#include "payment_client.hpp"

using namespace std::chrono_literals;

namespace {

using idemkafka::DeadLetterReason;
using idemkafka::DeliveryOutcome;
using idemkafka::wait_until;

billing::OrderConfirmed order(int n)
{
    billing::OrderConfirmed e;
    e.event_id = idemkafka::new_event_id();
    e.order_id = fmt::format("order-{}", n);
    e.customer_id = fmt::format("customer-{}", n % 17);
    e.amount_cents = 1000 + n;
    e.currency = "EUR";
    e.occurred_at_ms = 1767225600000 + n;
    return e;
}

// A TestDatabase with the billing tables, the simulated payment provider and
// the listener's configuration.
struct Billing {
    idemkafka::TestDatabase db; // IDEMKAFKA_TEST_PG, else a throwaway cluster
    billing::SimulatedPaymentProvider payments;

    Billing()
    {
        pqxx::connection c(db.connection_string());
        billing::create_charge_table(c, "charge");
    }

    idemkafka::ConsumerConfig config() const
    {
        idemkafka::ConsumerConfig cfg;
        cfg.group_id = "billing-service";
        db.configure(cfg);
        cfg.retry_backoff = 20ms;
        cfg.log = idemkafka::stderr_sink(idemkafka::LogLevel::error);
        return cfg;
    }

    std::int64_t charges() const { return db.scalar("SELECT count(*) FROM charge"); }
    std::int64_t charges_of(const std::string& order_id) const
    {
        return db.scalar(fmt::format("SELECT count(*) FROM charge WHERE order_id = '{}'", order_id));
    }
};

using Harness = idemkafka::HandlerHarness<billing::OrderConfirmed>;

// A provider whose first answer is lost: the charge goes through, then the
// call fails (a timeout after the provider charged).
class LosesFirstResponse final : public billing::PaymentClient {
public:
    explicit LosesFirstResponse(billing::PaymentClient& inner) : inner_(inner) {}
    std::string charge(const std::string& order_id, std::int64_t amount_cents, const std::string& currency,
                       const std::string& idempotency_key) override
    {
        auto id = inner_.charge(order_id, amount_cents, currency, idempotency_key);
        if (!lost_) {
            lost_ = true;
            throw std::runtime_error("payment provider: read timeout");
        }
        return id;
    }

private:
    billing::PaymentClient& inner_;
    bool lost_ = false;
};

} // namespace

TEST_CASE("a re-sent order is charged once", "[billing]")
{
    Billing b;
    Harness h(b.config(), billing::decode, billing::event_id_of, billing::ChargeHandler(b.payments, "charge"));
    const auto e = order(1);

    const auto d = h.deliver_twice(billing::encode(e));
    CHECK(d.first.outcome == DeliveryOutcome::processed);
    CHECK(d.second.outcome == DeliveryOutcome::duplicate);
    CHECK(b.charges_of(e.order_id) == 1);
    CHECK(b.payments.calls() == 1); // the duplicate never reached the provider
    CHECK(b.payments.charges() == 1);
    CHECK(h.metrics().snapshot().duplicates == 1);
}

TEST_CASE("a crash after the database commit charges once", "[billing]")
{
    Billing b;
    Harness h(b.config(), billing::decode, billing::event_id_of, billing::ChargeHandler(b.payments, "charge"));
    const auto e = order(2);

    const auto d = h.deliver_with_crash_after_commit(billing::encode(e));
    CHECK(d.first.outcome == DeliveryOutcome::processed);
    CHECK(d.second.outcome == DeliveryOutcome::duplicate);
    CHECK(d.second.offset == d.first.offset);
    CHECK(b.charges_of(e.order_id) == 1);
    CHECK(b.payments.charges() == 1);
}

TEST_CASE("a lost provider response is retried with the same idempotency key: one charge", "[billing]")
{
    Billing b;
    LosesFirstResponse flaky(b.payments);
    Harness h(b.config(), billing::decode, billing::event_id_of, billing::ChargeHandler(flaky, "charge"));
    const auto e = order(3);

    const auto first = h.deliver(billing::encode(e));
    CHECK(first.outcome == DeliveryOutcome::failed);
    CHECK(first.error == "payment provider: read timeout");
    CHECK(b.charges() == 0); // the row was rolled back, the provider charged

    const auto again = h.redeliver();
    CHECK(again.outcome == DeliveryOutcome::processed);
    CHECK(again.attempt == 2);
    CHECK(b.charges_of(e.order_id) == 1);
    CHECK(b.payments.calls() == 2);
    CHECK(b.payments.charges() == 1); // the provider recognised the key
}

TEST_CASE("poison payloads are dead-lettered with their reason and charge nothing", "[billing]")
{
    Billing b;
    Harness h(b.config(), billing::decode, billing::event_id_of, billing::ChargeHandler(b.payments, "charge"));

    SECTION("a payload without an event id: missing_event_id")
    {
        const auto d = h.deliver(R"({"type":"order.confirmed.v1","order_id":"order-4","customer_id":"c",)"
                                 R"("amount_cents":100,"currency":"EUR","occurred_at_ms":1})");
        REQUIRE(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::missing_event_id);
        CHECK(d.error == "missing event_id");
        REQUIRE(h.dead_letters().size() == 1);
        CHECK(h.dead_letters().front().topic == "billing-service.dlq");
        CHECK(h.dead_letters().front().header(idemkafka::dead_letter_header::reason) == "missing_event_id");
    }
    SECTION("a malformed event id: invalid_event_id")
    {
        auto e = order(5);
        auto payload = billing::encode(e);
        const auto id = e.event_id.to_string();
        payload.replace(payload.find(id), id.size(), "not-a-uuid");
        const auto d = h.deliver(payload);
        CHECK(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::invalid_event_id);
    }
    SECTION("not JSON: decode_error")
    {
        const auto d = h.deliver("order 6 confirmed");
        CHECK(d.outcome == DeliveryOutcome::dead_lettered);
        CHECK(d.reason == DeadLetterReason::decode_error);
        CHECK(d.error == "payload is not a JSON object");
    }
    CHECK(b.charges() == 0);
    CHECK(b.payments.calls() == 0);
}

TEST_CASE("a full run through TestBroker: 1,000 orders, 10% re-sent, each charged once", "[billing]")
{
    constexpr int orders = 1000;
    constexpr int resends = 100;
    idemkafka::TestBroker broker;
    Billing b;
    const std::string topic = "order-service.order.confirmed";
    broker.create_topic(topic, 3);
    broker.create_topic("billing-service.dlq", 1);

    std::vector<billing::OrderConfirmed> sent;
    for (int n = 0; n < orders; ++n) {
        sent.push_back(order(n));
        broker.produce(topic, sent.back().order_id, billing::encode(sent.back()));
        if (n % 10 == 9) // every tenth order: an earlier one is sent again (same event id, new offset)
            broker.produce(topic, sent[static_cast<std::size_t>(n / 2)].order_id,
                           billing::encode(sent[static_cast<std::size_t>(n / 2)]));
    }

    auto cfg = b.config();
    cfg.topics = {topic};
    broker.configure(cfg);
    idemkafka::IdempotentConsumer<billing::OrderConfirmed> consumer(cfg, billing::decode, billing::event_id_of,
                                                                    billing::ChargeHandler(b.payments, "charge"));
    std::exception_ptr failed;
    std::thread run([&] {
        try {
            consumer.run();
        } catch (...) {
            failed = std::current_exception();
        }
    });
    const bool drained = wait_until(
        [&] {
            return failed || consumer.metrics().snapshot().consumed >= static_cast<std::uint64_t>(orders + resends);
        },
        60s);
    consumer.stop();
    run.join();
    if (failed)
        std::rethrow_exception(failed);
    REQUIRE(drained);

    const auto m = consumer.metrics().snapshot();
    CHECK(m.consumed == orders + resends);
    CHECK(m.claimed == orders);
    CHECK(m.duplicates == resends);
    CHECK(m.dead_lettered_total() == 0);
    CHECK(b.charges() == orders);
    CHECK(b.db.scalar("SELECT count(DISTINCT order_id) FROM charge") == orders);
    CHECK(b.db.scalar("SELECT count(*) FROM processed_event WHERE consumer_group = 'billing-service'") == orders);
    CHECK(b.payments.charges() == orders);
    CHECK(b.payments.calls() == orders);
    CHECK(broker.read_all("billing-service.dlq").empty());
}
