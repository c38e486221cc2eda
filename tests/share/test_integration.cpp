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
        const auto& s = consumer.share_metrics();
        REQUIRE(wait_until(
            [&] {
                return (effects(table) == unique && s.accepted.get() >= stream.size() &&
                        s.accepted.get() == consumer.metrics().claimed.get() + consumer.metrics().duplicates.get()) ||
                       runner.finished();
            },
            300s));
        if (auto error = runner.error())
            std::rethrow_exception(error);
        runner.join();
        if (auto error = runner.error())
            std::rethrow_exception(error);
    }
    const auto took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto m = consumer.metrics().snapshot();
    const auto& s = consumer.share_metrics();
    fmt::print("share integration: {} records ({} events, {} re-sends) in {:.1f} s, {} accepted, {} duplicates, {} "
               "acknowledgements refused\n",
               stream.size(), unique, resends, took, s.accepted.get(), m.duplicates, s.acks_refused.get());
    INFO("took " << took << " s; accepted " << s.accepted.get() << ", released " << s.released.get()
                 << ", acks refused " << s.acks_refused.get() << ", claimed " << m.claimed << ", duplicates "
                 << m.duplicates);
    CHECK(effects(table) == unique);
    CHECK(distinct_effects(table) == unique);
    CHECK(claims(group) == unique);
    CHECK(m.claimed == static_cast<std::uint64_t>(unique));
    // Every record ACCEPTed once per delivery, each delivery a claim or a duplicate.
    CHECK(s.accepted.get() == m.claimed + m.duplicates);
    CHECK(s.accepted.get() >= stream.size());
    CHECK(m.duplicates >= static_cast<std::uint64_t>(resends));
    CHECK(s.released.get() == 0);
    CHECK(s.rejected.get() == 0);
    CHECK(m.dead_lettered_total() == 0);
    // The mock cluster ends every share session on a broker when any connection to it closes (a
    // new client's bootstrap connection does): acknowledgements sent meanwhile are refused, and
    // their records come again as duplicates. Without that, nothing was delivered twice.
    if (s.acks_refused.get() == 0) {
        CHECK(m.duplicates == static_cast<std::uint64_t>(resends));
        CHECK(s.accepted.get() == stream.size());
    }
}
