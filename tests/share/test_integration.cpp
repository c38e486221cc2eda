// IdempotentShareConsumer end to end: three members of one share group on a
// topic of two partitions, records re-sent with new offsets. Every effect is
// committed once, every re-send is a duplicate, and every record is ACCEPTed.
// Once with the mock's own assignor (each partition to one member, one member
// idle) and once with every partition assigned to every member (the mock's
// share-assign), so that members take records of the same partitions side by
// side as a real broker's share assignor has them do.

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

namespace {

constexpr int unique = 20000;
constexpr int resends = unique / 10;

// Re-sends of earlier events (same payload: the same event id at a new offset), spread through the stream.
std::vector<TestEvent> stream_with_resends()
{
    auto events = new_events("order", unique);
    std::vector<TestEvent> stream;
    stream.reserve(static_cast<std::size_t>(unique + resends));
    std::mt19937 rng(7);
    for (int i = 0; i < unique; ++i) {
        stream.push_back(events[static_cast<std::size_t>(i)]);
        if (i % 10 == 9)
            stream.push_back(events[rng() % static_cast<unsigned>(i + 1)]);
    }
    return stream;
}

void run_three_members(bool shared_partitions)
{
    const auto name = std::string(shared_partitions ? "share_integration_shared" : "share_integration");
    if (shared_partitions)
        mock_control("share-group heartbeat-interval-ms 500"); // the manual assignment reaches members sooner
    const auto topic = share_topic(name, 2);
    const auto group = unique_name(name + "_g");
    const auto table = make_effect_table(unique_name("share_effects"));
    const auto stream = stream_with_resends();
    REQUIRE(stream.size() == static_cast<std::size_t>(unique + resends));

    // Which member (thread) handled records of which partition.
    std::mutex mu;
    std::map<std::int32_t, std::set<std::thread::id>> handled_by;
    auto cfg = share_config(group, topic);
    cfg.members = 3;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, table, e, ctx);
        std::lock_guard<std::mutex> lock(mu);
        handled_by[ctx.partition()].insert(std::this_thread::get_id());
    });

    // With shared partitions the records are published only once all three
    // members hold both partitions. The publisher connects first: the mock
    // ends every share session on a broker when a connection to it closes, as
    // a new client's bootstrap connection does soon after it starts.
    std::optional<Publisher> late;
    if (shared_partitions) {
        const auto warm = unique_name(name + "_warm");
        create_topic(warm, 1);
        late.emplace(PublisherConfig{brokers(), {}, log_sink()});
        late->publish(warm, std::string("warm"), "connects the publisher");
    } else {
        publish(topic, stream);
    }

    const auto t0 = std::chrono::steady_clock::now();
    {
        Runner<Consumer> runner(consumer);
        if (shared_partitions) {
            const auto command = fmt::format("share-assign {} 3 {}", group, topic);
            REQUIRE(wait_until(
                [&] {
                    try {
                        mock_control(command); // refused until the three members joined
                        return true;
                    } catch (const std::runtime_error&) {
                        return runner.finished();
                    }
                },
                60s));
            REQUIRE_FALSE(runner.finished());
            for (const auto& e : stream)
                late->publish_async(topic, e.entity, encode(e));
            late->flush();
        }
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
    fmt::print("{}: {} records ({} events, {} re-sends) in {:.1f} s, {} accepted, {} duplicates, {} "
               "acknowledgements refused, members per partition {}/{}\n",
               name, stream.size(), unique, resends, took, s.accepted.get(), m.duplicates, s.acks_refused.get(),
               handled_by[0].size(), handled_by[1].size());
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
    if (shared_partitions) {
        // Nothing connected or closed while the records flowed: every record
        // was delivered once, and members did share the partitions.
        CHECK(s.acks_refused.get() == 0);
        CHECK(m.duplicates == static_cast<std::uint64_t>(resends));
        CHECK(s.accepted.get() == stream.size());
        CHECK(handled_by[0].size() >= 2);
        CHECK(handled_by[1].size() >= 2);
    } else if (s.acks_refused.get() == 0) {
        // The mock cluster ends every share session on a broker when any connection to it closes (a new
        // client's bootstrap connection does): acknowledgements sent meanwhile are refused, and their
        // records come again as duplicates. Without that, nothing was delivered twice.
        CHECK(m.duplicates == static_cast<std::uint64_t>(resends));
        CHECK(s.accepted.get() == stream.size());
    }
}

} // namespace

TEST_CASE("three share members on two partitions: every effect once, re-sends are duplicates", "[share]")
{
    run_three_members(false);
}

TEST_CASE("three share members sharing both partitions: every effect once, re-sends are duplicates", "[share][mock]")
{
    run_three_members(true);
}
