// A record whose handler fails on every delivery, in a share group with a
// delivery-count limit of 3: released after its first two deliveries,
// dead-lettered on the third (the last, which the broker would archive on a
// release without telling anyone), then REJECTed and not delivered again.

#include <atomic>
#include <mutex>
#include <stdexcept>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

TEST_CASE("a record failing on every delivery is dead-lettered on its last one, not archived", "[share]")
{
    const auto topic = share_topic("share_limit", 1);
    const auto group = unique_name("share_limit_g");
    share_setting(group, "delivery-limit", "3");
    const auto table = make_effect_table(unique_name("share_effects"));
    auto events = new_events("ok", 5);
    const TestEvent bad{new_event_id(), "bad", 0};
    events.insert(events.begin() + 2, bad);
    publish(topic, events);

    std::mutex mu;
    std::vector<int> bad_attempts;
    auto cfg = share_config(group, topic);
    cfg.delivery_limit = 3;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.id == bad.id) {
            std::lock_guard<std::mutex> lock(mu);
            bad_attempts.push_back(ctx.attempt());
            throw std::runtime_error("this record always fails");
        }
        insert_effect(tx, table, e, ctx);
    });
    const auto& s = consumer.share_metrics();
    {
        Runner<Consumer> runner(consumer);
        REQUIRE(wait_until([&] { return (effects(table) == 5 && s.rejected.get() == 1) || runner.finished(); }, 60s));
        std::this_thread::sleep_for(3s); // a fourth delivery would come within this
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(effects(table) == 5);
    CHECK(distinct_effects(table) == 5);
    CHECK(bad_attempts == std::vector<int>{1, 2, 3});
    CHECK(m.handler_failures == 3);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
    CHECK(s.released.get() == 2);
    CHECK(s.rejected.get() == 1);
    CHECK(s.delivery_limit_dead_letters.get() == 1);
    CHECK(s.archived_without_dead_letter.get() == 0);
    CHECK(claims(group) == 5);

    const auto dead = read_topic(cfg.consumer.effective_dead_letter_topic(), 2, 5s);
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].header(dead_letter_header::reason) == "handler_failed");
    CHECK(dead[0].header(dead_letter_header::attempts) == "3");
    CHECK(dead[0].header(dead_letter_header::event_id) == bad.id.to_string());
}
