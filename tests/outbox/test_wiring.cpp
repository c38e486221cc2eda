// A consumer configured with an outbox creates it and runs its relay.
#include <fmt/format.h>
#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include "catch_compat.hpp"
#include "test_env.hpp"
using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

TEST_CASE("wiring: a consumer with an outbox runs its relay", "[integration][outbox]")
{
    const auto in = unique_name("w_in");
    const auto out = unique_name("w_out");
    create_topic(in, 2);
    create_topic(out, 2);
    Publisher pub(PublisherConfig{brokers(), {}, stderr_sink(LogLevel::warning)});
    for (int i = 0; i < 100; ++i) {
        TestEvent e{new_event_id(), fmt::format("o{}", i % 7), i};
        pub.publish_async(in, e.entity, encode(e));
    }
    pub.flush();
    auto cfg = consumer_config(unique_name("g"), in);
    OutboxConfig oc;
    oc.table = unique_name("wob");
    oc.relay_options.poll_interval = std::chrono::milliseconds(5000); // only wake() makes it quick
    cfg.outbox = oc;
    const Outbox ob = oc.outbox();
    IdempotentConsumer<TestEvent> c(cfg, decode, event_id_of,
                                    [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        const EventId id = Outbox::new_event_id();
        ob.enqueue(tx, out, std::string_view(e.entity), encode(TestEvent{id, e.entity, e.amount}), {}, id);
    });
    {
        Runner<IdempotentConsumer<TestEvent>> run(c);
        REQUIRE(wait_until(
            [&] {
                return scalar("SELECT count(*) FROM pg_class WHERE oid = to_regclass('" + ob.qualified_name() + "')") ==
                           1 &&
                       scalar("SELECT count(*) FROM " + ob.qualified_name() + " WHERE sent_at IS NOT NULL") == 100;
            },
            60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    CHECK(read_topic(out, 100, 30s).size() == 100);
    CHECK(c.metrics().snapshot().outbox_published == 100);
    OutboxConfig bad;
    bad.table = "";
    cfg.outbox = bad;
    CHECK_THROWS_AS(IdempotentConsumer<TestEvent>(cfg, decode, event_id_of,
                                                  [](pqxx::work&, const TestEvent&, const Context&) {}),
                    ConfigError);
}
