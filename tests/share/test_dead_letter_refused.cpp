// A poison record whose dead letter the broker refuses: with deliveries left
// the record is RELEASEd (never REJECTed without its dead letter), comes
// again, and is dead-lettered once the dead-letter topic accepts; then
// REJECTed. One dead letter, nothing lost, the records around it once.

#include <atomic>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

TEST_CASE("a refused dead letter releases its record, which is dead-lettered once the topic accepts", "[share][mock]")
{
    constexpr int refusals = 2;
    mock_control("share-group delivery-limit 5");
    const auto topic = share_topic("share_dead_letter_refused", 1);
    const auto group = unique_name("share_dead_letter_refused_g");
    const auto table = make_effect_table(unique_name("share_effects"));
    const auto before = new_events("before", 5);
    const auto after = new_events("after", 5);
    publish(topic, before);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(topic, std::string("poison"), "this is not an event");
    }
    publish(topic, after);
    // The next two Produce requests fail for good: the dead-letter producer's
    // (nothing else produces from here on), one per delivery of the record.
    mock_control("push-errors Produce MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE");

    auto cfg = share_config(group, topic);
    cfg.delivery_limit = 5;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, table, e, ctx);
    });
    const auto& s = consumer.share_metrics();
    {
        Runner<Consumer> runner(consumer);
        REQUIRE(wait_until([&] { return (effects(table) == 10 && s.rejected.get() == 1) || runner.finished(); }, 60s));
        // Long enough for a released or lapsed record to come again (a RELEASE comes again at once).
        std::this_thread::sleep_for(3s);
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(effects(table) == 10);
    CHECK(distinct_effects(table) == 10);
    CHECK(claims(group) == 10);
    // The poison record: refused twice (released each time, a delivery each), dead-lettered on its third delivery.
    CHECK(m.consumed == 10 + 1 + refusals);
    CHECK(m.decode_errors == 1 + refusals);
    CHECK(m.dead_letter_failures == refusals);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 1);
    CHECK(m.dead_lettered_total() == 1);
    CHECK(s.released.get() == refusals);
    CHECK(s.rejected.get() == 1);
    CHECK(s.accepted.get() == 10);
    CHECK(s.delivery_limit_dead_letters.get() == 0);
    CHECK(s.archived_without_dead_letter.get() == 0);
    CHECK(s.acks_refused.get() == 0);

    const auto dead = read_topic(cfg.consumer.effective_dead_letter_topic(), 2, 5s);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].value == std::optional<std::string>("this is not an event"));
    CHECK(dead[0].header(dead_letter_header::reason) == "decode_error");
    CHECK(dead[0].header(dead_letter_header::original_topic) == topic);
    CHECK(dead[0].header(dead_letter_header::original_offset) == "5");
}
