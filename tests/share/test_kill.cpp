// Members of a share group as child processes, killed with SIGKILL in a loop
// while the records flow and started again: whatever a dead member had
// acquired (committed or not, acknowledged or not) comes again to a live one
// once its session times out, and its claims make the committed ones
// duplicates. At the end every effect is in PostgreSQL exactly once.

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <random>
#include <sys/wait.h>
#include <thread>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

namespace {

constexpr int delivery_limit = 10; // deaths cost deliveries: the test's subject is the claim, not the limit

std::string env(const char* name)
{
    const char* v = std::getenv(name);
    REQUIRE(v != nullptr);
    return v;
}

} // namespace

// Run by the next test in child processes, until killed.
TEST_CASE("share kill child", "[.][share-kill-child]")
{
    const auto table = env("IK_SHARE_EFFECTS");
    auto cfg = share_config(env("IK_SHARE_GROUP"), env("IK_SHARE_TOPIC"));
    cfg.delivery_limit = delivery_limit;
    cfg.consumer.max_batch = 100;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        std::this_thread::sleep_for(1ms); // the records flow for a while: kills land in the middle of batches
        insert_effect(tx, table, e, ctx);
    });
    c.run();
}

TEST_CASE("share members killed with SIGKILL while records flow: every effect once", "[share]")
{
    constexpr int unique = 5000;
    constexpr int kills = 6;
    const auto topic = share_topic("share_kill", 2);
    const auto group = unique_name("share_kill_g");
    share_setting(group, "session-timeout-ms", "3000"); // a dead member's records come again after 3 s
    share_setting(group, "heartbeat-interval-ms", "500");
    share_setting(group, "delivery-limit", std::to_string(delivery_limit));
    const auto table = make_effect_table(unique_name("share_effects"));
    auto events = new_events("kill", unique);
    auto stream = events;
    std::mt19937 rng(11);
    for (int i = 0; i < unique / 10; ++i)
        stream.push_back(events[rng() % events.size()]);
    std::shuffle(stream.begin() + unique / 2, stream.end(), rng);
    publish(topic, stream);

    const std::vector<std::string> child_env{"IK_SHARE_GROUP=" + group, "IK_SHARE_TOPIC=" + topic,
                                             "IK_SHARE_EFFECTS=" + table};
    std::vector<pid_t> children{spawn_self("[share-kill-child]", child_env),
                                spawn_self("[share-kill-child]", child_env)};
    auto kill_child = [](pid_t pid) {
        ::kill(pid, SIGKILL);
        int status = 0;
        ::waitpid(pid, &status, 0);
        return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    };
    int killed_mid_flow = 0;
    for (int k = 0; k < kills; ++k) {
        // Kill once the records flow again after the last kill, while they still do.
        const auto before = effects(table);
        wait_until([&] { return effects(table) > before + 100; }, 30s);
        const auto at_kill = effects(table);
        auto& victim = children[static_cast<std::size_t>(k) % children.size()];
        REQUIRE(kill_child(victim));
        killed_mid_flow += at_kill < unique ? 1 : 0;
        victim = spawn_self("[share-kill-child]", child_env);
    }
    const bool all = wait_until([&] { return effects(table) >= unique && claims(group) >= unique; }, 180s);
    std::this_thread::sleep_for(5s); // redeliveries of the last deaths' records: duplicates, no new effects
    for (const pid_t pid : children)
        REQUIRE(kill_child(pid));
    fmt::print("share kill: {} kills ({} while records flowed), {} effects of {} events, {} of them on a "
               "redelivery\n",
               kills, killed_mid_flow, effects(table), unique,
               scalar(fmt::format("SELECT count(*) FROM {} WHERE delivery > 1", table)));
    REQUIRE(all);
    CHECK(killed_mid_flow >= 3);
    CHECK(effects(table) == unique);
    CHECK(distinct_effects(table) == unique);
    CHECK(claims(group) == unique);
}
