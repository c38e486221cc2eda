// A handler call longer than the share group's lock (2 s here): the batch
// gives back what it cannot do within its budget, the late ACCEPT is
// refused (the lock lapsed), the record comes again and is a duplicate.
// One effect per event; the refusal is counted.

#include <atomic>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

TEST_CASE("a handler slower than the lock: one effect, the lapsed lock counted", "[share]")
{
    const auto topic = share_topic("share_slow", 1);
    const auto group = unique_name("share_slow_g");
    share_setting(group, "lock-duration-ms", "2000");
    const auto table = make_effect_table(unique_name("share_effects"));
    const auto events = new_events("slow", 5);
    publish(topic, events);

    std::atomic<int> slow_calls{0};
    auto cfg = share_config(group, topic);
    cfg.lock_duration = 2000ms;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.id == events.front().id && slow_calls++ == 0)
            std::this_thread::sleep_for(4s); // twice the lock
        insert_effect(tx, table, e, ctx);
    });
    const auto& s = consumer.share_metrics();
    {
        Runner<Consumer> runner(consumer);
        REQUIRE(wait_until(
            [&] {
                return (effects(table) == 5 && s.acks_refused.get() >= 1 && s.accepted.get() >= 5 &&
                        consumer.metrics().duplicates.get() >= 1) ||
                       runner.finished();
            },
            60s));
        std::this_thread::sleep_for(3s); // what comes again within this must be duplicates
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto m = consumer.metrics().snapshot();
    INFO("accepted " << s.accepted.get() << ", released " << s.released.get() << ", given back "
                     << s.budget_given_back.get() << ", acks refused " << s.acks_refused.get() << ", duplicates "
                     << m.duplicates);
    CHECK(effects(table) == 5);
    CHECK(distinct_effects(table) == 5);
    CHECK(claims(group) == 5);
    CHECK(slow_calls.load() == 1); // its redelivery was a duplicate: the handler did not run again
    CHECK(s.acks_refused.get() >= 1);
    CHECK(m.duplicates >= 1);
    CHECK(s.rejected.get() == 0);
    CHECK(m.dead_lettered_total() == 0);
}
