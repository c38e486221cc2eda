// The chain of issue 6: consumer A (billing) reads order.confirmed, charges, and
// in the same transaction enqueues payment.charged into the outbox; relays
// publish it; consumer B records a receipt. Orders arrive with duplicates, A
// crashes between its PostgreSQL commit and its offset commit several times and
// is restarted, and one relay crashes between the broker's ack and the mark.
// Every count is taken in PostgreSQL: charges == receipts == unique orders.

#include <atomic>
#include <random>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

struct SimulatedCrash {};

// `unique` orders, plus `resends` re-sends of earlier ones (same payload, so
// the same event id at a new offset), interleaved.
int publish_orders(const std::string& topic, int unique, int resends)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    std::vector<TestEvent> events;
    std::mt19937 rng(11);
    int published = 0;
    for (int i = 0; i < unique; ++i) {
        TestEvent e{new_event_id(), fmt::format("order-{}", i), 100 + i};
        events.push_back(e);
        pub.publish_async(topic, e.entity, encode(e));
        ++published;
        if (resends > 0 && rng() % 4 == 0) {
            const auto& again = events[rng() % events.size()];
            pub.publish_async(topic, again.entity, encode(again));
            ++published;
            --resends;
        }
    }
    for (; resends > 0; --resends, ++published) {
        const auto& again = events[rng() % events.size()];
        pub.publish_async(topic, again.entity, encode(again));
    }
    pub.flush();
    return published;
}

} // namespace

TEST_CASE("chain: order.confirmed -> charge + payment.charged through the outbox -> receipt, with crashes",
          "[integration][outbox]")
{
    constexpr int unique_orders = 400;
    const auto orders = unique_name("order_confirmed");
    const auto payments = unique_name("payment_charged");
    create_topic(orders, 4);
    create_topic(payments, 4);
    const auto charges = unique_name("charge");
    const auto receipts = unique_name("receipt");
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, order_id text NOT NULL, order_event_id uuid NOT "
                     "NULL, payment_event_id uuid NOT NULL, amount bigint NOT NULL)",
                     charges));
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, order_id text NOT NULL, payment_event_id uuid NOT "
                     "NULL, amount bigint NOT NULL)",
                     receipts));
    const Outbox outbox("public", unique_name("outbox"));
    outbox.ensure_schema(pg());
    const int order_records = publish_orders(orders, unique_orders, 150);

    // Two relays, as two service instances would run; the first crashes after
    // the broker's ack and before the mark on its 1st, 3rd and 5th cycle that
    // publishes. It runs alone until its first crash, so the crash is certain
    // however the two would share the work; the second joins after it.
    std::atomic<int> relay_cycles{0}, relay_crashes{0};
    std::atomic<std::uint64_t> republished{0};
    OutboxRelayOptions ro;
    ro.batch_size = 40;
    ro.poll_interval = 20ms;
    ro.retry_backoff = 20ms;
    ro.retry_backoff_max = 200ms;
    if (!std::getenv("IDEMKAFKA_TEST_VERBOSE"))
        ro.log = [](LogLevel level, std::string_view line) {
            // The simulated relay crashes are expected; anything else is shown.
            if (level >= LogLevel::warning && line.find("non-standard exception") == std::string_view::npos)
                log_sink()(level, line);
        };
    auto crashing = ro;
    crashing.hooks.after_publish = [&](std::size_t acknowledged) {
        if (relay_cycles++ % 2 == 0 && relay_crashes < 3) {
            ++relay_crashes;
            republished += acknowledged;
            throw SimulatedCrash{};
        }
    };
    PublisherConfig pc{brokers(), {}, log_sink()};
    OutboxRelay relay1(pg(), outbox, pc, crashing);
    OutboxRelay relay2(pg(), outbox, pc, ro);
    relay1.start();

    // Consumer B: payment.charged -> receipt.
    Consumer b(consumer_config(unique_name("receipts"), payments), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context&) {
                   detail::pg::exec_params(
                       tx,
                       fmt::format("INSERT INTO {} (order_id, payment_event_id, amount) VALUES ($1, "
                                   "$2::uuid, $3)",
                                   receipts),
                       e.entity, e.id.to_string(), e.amount);
               });
    Runner<Consumer> run_b(b);

    // Consumer A: order.confirmed -> charge + payment.charged in the outbox, in
    // the transaction that claims the order's event id.
    const auto group_a = unique_name("billing");
    auto handler_a = [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        const EventId payment_id = Outbox::new_event_id(); // taken first, so the payload carries it
        detail::pg::exec_params(
            tx,
            fmt::format("INSERT INTO {} (order_id, order_event_id, payment_event_id, amount) VALUES ($1, "
                        "$2::uuid, $3::uuid, $4)",
                        charges),
            e.entity, e.id.to_string(), payment_id.to_string(), e.amount);
        outbox.enqueue(tx, payments, std::string_view(e.entity), encode(TestEvent{payment_id, e.entity, e.amount}),
                       {Header{"order-event-id", e.id.to_string()}}, payment_id);
    };

    // A crashes four times, each time after a few batches committed in
    // PostgreSQL and before their offsets reached Kafka; the fifth run drains.
    constexpr int crashing_runs = 4;
    std::uint64_t a_consumed = 0, a_duplicates = 0;
    for (int round = 0; round <= crashing_runs; ++round) {
        INFO("run " << round << " of consumer A");
        auto cfg = consumer_config(group_a, orders);
        cfg.max_batch = 20;
        cfg.max_batch_wait = 100ms;
        std::atomic<int> batches{0};
        if (round < crashing_runs)
            cfg.hooks.after_db_commit = [&batches, round](const BatchInfo& info) {
                if (info.claimed > 0 && ++batches > round)
                    throw SimulatedCrash{};
            };
        Consumer a(cfg, decode, event_id_of, handler_a);
        Runner<Consumer> run_a(a);
        if (round < crashing_runs) {
            REQUIRE(wait_until([&] { return run_a.finished(); }, 60s));
            const auto error = run_a.error();
            REQUIRE(error);
            REQUIRE_THROWS_AS(std::rethrow_exception(error), SimulatedCrash);
        } else {
            REQUIRE(wait_until(
                [&] {
                    return scalar(fmt::format("SELECT count(DISTINCT order_id) FROM {}", charges)) == unique_orders;
                },
                120s));
            // Let A read to the end of the topic, so every re-send was seen.
            wait_until(
                [&] {
                    return a_consumed + a.metrics().snapshot().consumed >= static_cast<std::uint64_t>(order_records);
                },
                10s);
            run_a.join();
            REQUIRE_FALSE(run_a.error());
        }
        if (round == 0) {
            // Round 0 committed at least one batch, so the outbox has rows.
            REQUIRE(wait_until([&] { return relay_crashes >= 1; }, 60s));
            relay2.start();
        }
        const auto m = a.metrics().snapshot();
        a_consumed += m.consumed;
        a_duplicates += m.duplicates;
    }

    // Everything A committed reaches B, including what a relay crash sent twice.
    REQUIRE(wait_until(
        [&] {
            return scalar(fmt::format("SELECT count(*) FROM {} WHERE sent_at IS NULL", outbox.qualified_name())) == 0 &&
                   scalar("SELECT count(DISTINCT order_id) FROM " + receipts) == unique_orders;
        },
        120s));
    relay1.stop();
    relay2.stop();
    const std::uint64_t payment_records = unique_orders + republished.load();
    REQUIRE(wait_until([&] { return b.metrics().snapshot().consumed >= payment_records; }, 60s));
    run_b.join();
    REQUIRE_FALSE(run_b.error());

    const auto mb = b.metrics().snapshot();
    INFO("A consumed " << a_consumed << " order records (" << order_records << " on the topic), " << a_duplicates
                       << " duplicates; relays published " << relay1.stats().published << " + "
                       << relay2.stats().published << ", " << relay_crashes.load() << " relay crashes, "
                       << republished.load() << " records sent twice");
    CHECK(relay_crashes >= 1);
    CHECK(republished > 0);
    CHECK(a_consumed > static_cast<std::uint64_t>(order_records)); // crashed batches came again
    CHECK(a_duplicates >= 150);                                    // re-sends, and the replays after each crash

    // Charges == unique orders, receipts == unique orders, one payment event each.
    CHECK(scalar("SELECT count(*) FROM " + charges) == unique_orders);
    CHECK(scalar("SELECT count(DISTINCT order_id) FROM " + charges) == unique_orders);
    CHECK(scalar("SELECT count(*) FROM " + receipts) == unique_orders);
    CHECK(scalar("SELECT count(DISTINCT order_id) FROM " + receipts) == unique_orders);
    CHECK(scalar("SELECT count(*) FROM " + outbox.qualified_name()) == unique_orders);
    CHECK(relay1.stats().published + relay2.stats().published == static_cast<std::uint64_t>(unique_orders));
    // The receipt carries the id A put in the payload and in the outbox row.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} c JOIN {} r ON r.payment_event_id = c.payment_event_id AND "
                             "r.order_id = c.order_id AND r.amount = c.amount JOIN {} o ON o.event_id = "
                             "c.payment_event_id",
                             charges, receipts, outbox.qualified_name())) == unique_orders);
    // B saw every payment record and skipped exactly the re-published ones.
    CHECK(mb.consumed == payment_records);
    CHECK(mb.claimed == static_cast<std::uint64_t>(unique_orders));
    CHECK(mb.duplicates == republished.load());
}
