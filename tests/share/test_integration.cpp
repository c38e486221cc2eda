// IdempotentShareConsumer end to end: three members of one share group on a
// topic of two partitions, records re-sent with new offsets. Every effect is
// committed once, every re-send is a duplicate, and every record is ACCEPTed.

#include <atomic>
#include <random>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

TEST_CASE("three share members on two partitions: every effect once, re-sends are duplicates", "[share]")
{
    constexpr int unique = 20000;
    constexpr int resends = unique / 10;
    const auto topic = share_topic("share_integration", 2);
    const auto group = unique_name("share_integration_g");
    const auto table = make_effect_table(unique_name("share_effects"));

    // Re-sends of earlier events (same payload: the same event id at a new offset), spread through the stream.
    auto events = new_events("order", unique);
    std::vector<TestEvent> stream;
    stream.reserve(static_cast<std::size_t>(unique + resends));
    std::mt19937 rng(7);
    for (int i = 0; i < unique; ++i) {
        stream.push_back(events[static_cast<std::size_t>(i)]);
        if (i % 10 == 9)
            stream.push_back(events[rng() % static_cast<unsigned>(i + 1)]);
    }
    REQUIRE(stream.size() == static_cast<std::size_t>(unique + resends));
    publish(topic, stream);

    auto cfg = share_config(group, topic);
    cfg.members = 3;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, table, e, ctx);
    });
    const auto t0 = std::chrono::steady_clock::now();
    {
        Runner<Consumer> runner(consumer);
        REQUIRE(wait_until(
            [&] { return consumer.share_metrics().accepted.get() >= stream.size() || runner.finished(); }, 300s));
        if (auto error = runner.error())
            std::rethrow_exception(error);
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto m = consumer.metrics().snapshot();
    const auto& s = consumer.share_metrics();
    INFO("took " << took << " s; accepted " << s.accepted.get() << ", released " << s.released.get()
                 << ", acks refused " << s.acks_refused.get() << ", claimed " << m.claimed << ", duplicates "
                 << m.duplicates);
    CHECK(effects(table) == unique);
    CHECK(distinct_effects(table) == unique);
    CHECK(claims(group) == unique);
    CHECK(m.claimed == static_cast<std::uint64_t>(unique));
    CHECK(m.duplicates == static_cast<std::uint64_t>(resends));
    CHECK(s.accepted.get() == stream.size());
    CHECK(s.released.get() == 0);
    CHECK(s.rejected.get() == 0);
    CHECK(s.acks_refused.get() == 0);
    CHECK(m.dead_lettered_total() == 0);
    // Members that handled records: the mock gives each partition to one member.
    CHECK(effects(table) == scalar(fmt::format("SELECT count(*) FROM {} WHERE delivery = 1", table)));
}
