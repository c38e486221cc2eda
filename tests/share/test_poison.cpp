// A poison record in a share group: dead-lettered once, then REJECTed, and
// never delivered again; the records around it are processed once.

#include <atomic>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

TEST_CASE("an undecodable record is dead-lettered once, then rejected and not delivered again", "[share]")
{
    const auto topic = share_topic("share_poison", 1);
    const auto group = unique_name("share_poison_g");
    const auto table = make_effect_table(unique_name("share_effects"));
    const auto before = new_events("before", 10);
    const auto after = new_events("after", 10);
    publish(topic, before);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(topic, std::string("poison"), "this is not an event");
    }
    publish(topic, after);

    auto cfg = share_config(group, topic);
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, table, e, ctx);
    });
    const auto& s = consumer.share_metrics();
    {
        Runner<Consumer> runner(consumer);
        REQUIRE(wait_until([&] { return (effects(table) == 20 && s.rejected.get() == 1) || runner.finished(); }, 60s));
        // Long enough for a released or lapsed record to come again (the lock is 30 s, a RELEASE at once).
        std::this_thread::sleep_for(3s);
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(effects(table) == 20);
    CHECK(distinct_effects(table) == 20);
    CHECK(m.consumed == 21); // the poison record was delivered once
    CHECK(m.decode_errors == 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 1);
    CHECK(s.rejected.get() == 1);
    CHECK(s.accepted.get() == 20);
    CHECK(s.released.get() == 0);

    const auto dead = read_topic(cfg.consumer.effective_dead_letter_topic(), 2, 5s);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].value == std::optional<std::string>("this is not an event"));
    CHECK(dead[0].header(dead_letter_header::reason) == "decode_error");
    CHECK(dead[0].header(dead_letter_header::original_topic) == topic);
    CHECK(dead[0].header(dead_letter_header::original_offset) == "10");
}
