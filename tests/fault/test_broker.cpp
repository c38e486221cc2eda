// Broker faults that exist only on a real Apache Kafka (run_isolated.sh --own-kafka: a cluster
// of the test's own, killed, frozen and restarted through IDEMKAFKA_KAFKA_CTL): the broker
// crashing and coming back, the broker frozen past the members' session timeout, partitions
// added while consuming, and (three nodes) the leader of a partition killed under load. The
// mock cluster's counterparts, which inject errors instead, are the [mock] cases of the other
// fault programs. Every case ends by counting effects: each event once, nothing lost, and the
// group's committed offsets at the end of every partition.

#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// A consumer of the fixture's topic whose handler takes about 1 ms a record, so that a few
// thousand records are still being worked on when the fault lands.
struct PacedRun {
    Fixture& f;
    std::atomic<long> calls{0};
    Consumer consumer;

    PacedRun(Fixture& fixture, ConsumerConfig cfg)
        : f(fixture),
          consumer(cfg, decode, event_id_of, [this](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
              f.insert(tx, e, ctx);
              std::this_thread::sleep_for(1ms);
              ++calls;
          })
    {
    }
};

// Every event once in the effects, and the group's committed offsets at the end of each of the
// `partitions` partitions (the records per partition come from the effects themselves).
void check_settled(const Fixture& f, int partitions)
{
    f.check_exact(f.events.size());
    for (int p = 0; p < partitions; ++p) {
        const auto end = scalar(
            fmt::format("SELECT coalesce(max(kafka_offset) + 1, 0) FROM {} WHERE kafka_partition = {}", f.effects, p));
        CHECK(committed_offset(f.group, f.topic, p) == end);
    }
}

bool drained(const Fixture& f, const Consumer& c)
{
    return f.rows() >= static_cast<std::int64_t>(f.events.size()) && c.metrics().snapshot().lag == 0;
}

// Waits up to `timeout` until every published record's effect is in and the lag is 0, stops the
// run and fails the test (with the consumer's metrics) when it did not get there.
void finish(const Fixture& f, PacedRun& r, Runner<Consumer>& run, std::chrono::seconds timeout,
            const std::string& context = "")
{
    const bool ok = wait_until([&] { return drained(f, r.consumer); }, timeout);
    const std::string at_timeout = ok ? std::string() : nonzero_metrics(r.consumer);
    run.join();
    fail_if_threw(run.error());
    INFO(context << at_timeout);
    REQUIRE(ok);
}

// Four partitions, 3,000 records, `fault` while about 300 of them are done, 1,000 more records
// after it: every effect once and the offsets at the end.
template <class Fault> void survives(Fault&& fault)
{
    Fixture f(4);
    f.publish(3000);
    auto cfg = f.config();
    cfg.max_batch = 50;
    PacedRun r(f, cfg);
    Runner<Consumer> run(r.consumer);
    REQUIRE(wait_until([&] { return r.calls >= 300; }, 60s));
    fault();
    f.publish(1000);
    finish(f, r, run, 120s);
    check_settled(f, 4);
}

} // namespace

TEST_CASE("the broker killed with SIGKILL and restarted mid-run: every effect once, the offsets at the end", "[broker]")
{
    survives([] {
        kafka_control("kill 1");
        // The consumer goes on with what it holds while the broker is gone; then it comes back
        // on the same storage (the command returns once it serves).
        std::this_thread::sleep_for(2s);
        kafka_control("start 1");
    });
}

TEST_CASE("the broker frozen (SIGSTOP) past the session timeout: every effect once after it thaws", "[broker]")
{
    survives([] {
        // Past the 6 s session (test_env.cpp, scripts/kafka/broker.properties): when the broker
        // thaws, it may find the member's session expired and rebalance.
        kafka_control("stop 1");
        std::this_thread::sleep_for(9s);
        kafka_control("cont 1");
    });
}

TEST_CASE("partitions added to the topic while consuming are consumed too, every effect once", "[broker]")
{
    Fixture f(2);
    f.publish(500);
    auto cfg = f.config();
    // How soon the member sees the new partitions: librdkafka's metadata refresh (300 s by
    // default) under the classic protocol; the broker tells members under KIP-848.
    cfg.kafka["topic.metadata.refresh.interval.ms"] = "1000";
    PacedRun r(f, cfg);
    Runner<Consumer> run(r.consumer);
    REQUIRE(wait_until([&] { return drained(f, r.consumer); }, 60s));
    add_partitions(f.topic, 4);
    // Keyed records spread over all four partitions now (the default partitioner).
    f.publish(1000, "later");
    finish(f, r, run, 90s);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT kafka_partition) FROM {} WHERE kafka_partition >= 2", f.effects)) ==
          2);
    check_settled(f, 4);
}

TEST_CASE("three brokers: the leader of a partition killed under load, then a second broker; every effect once, "
          "no restart of the consumer",
          "[cluster]")
{
    // Replication factor 3 and min.insync.replicas 2 (scripts/lib.sh for three nodes), so one
    // broker down at a time loses nothing the producer had acknowledged (acks=all).
    Fixture f(6);
    f.publish(4000);
    auto cfg = f.config();
    cfg.max_batch = 50;
    PacedRun r(f, cfg);
    Runner<Consumer> run(r.consumer);
    REQUIRE(wait_until([&] { return r.calls >= 300; }, 60s));

    const auto first = partition_leader(f.topic, 0);
    REQUIRE(first >= 1);
    kafka_control(fmt::format("kill {}", first));
    // The consumer must go on on the new leaders while that broker is away.
    const long before = r.calls;
    REQUIRE(wait_until([&] { return r.calls >= before + 500; }, 60s));
    kafka_control(fmt::format("start {}", first));

    // A second broker, not the one that just came back: the leader of another partition.
    std::int32_t second = -1;
    for (int p = 0; p < 6 && second < 0; ++p) {
        const auto leader = partition_leader(f.topic, p);
        if (leader >= 1 && leader != first)
            second = leader;
    }
    REQUIRE(second >= 1);
    kafka_control(fmt::format("kill {}", second));
    f.publish(1000, "during");
    kafka_control(fmt::format("start {}", second));

    finish(f, r, run, 180s, fmt::format("leaders killed: {} then {}\n", first, second));
    check_settled(f, 6);
}
