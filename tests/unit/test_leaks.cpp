// What the consumer keeps per session, per dead letter and per partition
// stays bounded by what it has now: reconnects, revokes and late flag
// changes leave nothing behind. And the member marker is scoped to its
// claims table and group.

#include <set>
#include <string>

#include <idemkafka/config.hpp>
#include <idemkafka/metrics.hpp>
#include <idemkafka/redact.hpp>

#include "catch_compat.hpp"
#include "consumer/dead_letterer.hpp"
#include "consumer/member_sessions.hpp"
#include "kafka/group_member.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;

TEST_CASE("own sessions: a reconnect replaces its worker's session, the list never grows", "[unit]")
{
    OwnSessions own;
    int workers[3];
    std::int64_t pid = 100;
    for (auto& w : workers)
        CHECK_FALSE(own.replace(&w, {pid++, 1}));
    for (int round = 0; round < 200; ++round)
        for (auto& w : workers) {
            const auto lost = own.replace(&w, {pid, pid * 10});
            REQUIRE(lost);
            CHECK(lost->pid == pid - 3); // the worker's session before this reconnect
            ++pid;
        }
    CHECK(own.size() == 3);
    const auto pids = own.pids();
    CHECK(std::set<std::int64_t>(pids.begin(), pids.end()) == std::set<std::int64_t>{pid - 3, pid - 2, pid - 1});
}

TEST_CASE("the member marker is scoped to schema, table and group", "[unit]")
{
    const auto m = MemberMarker::of("public", "processed_event", "billing");
    CHECK(m.key_a >= 0);
    CHECK(m.key_b >= 0);
    const auto same = MemberMarker::of("public", "processed_event", "billing");
    CHECK((same.key_a == m.key_a && same.key_b == m.key_b));
    for (const auto& other :
         {MemberMarker::of("billing", "processed_event", "billing"), MemberMarker::of("public", "claims", "billing"),
          MemberMarker::of("public", "processed_event", "billing2"),
          MemberMarker::of("public", "processed_eventbilling", ""),
          MemberMarker::of("publicprocessed_event", "", "billing")})
        CHECK_FALSE((other.key_a == m.key_a && other.key_b == m.key_b));
    CHECK(MemberMarker::space_a != MemberMarker::space_b);
}

TEST_CASE("dead letters in flight of a revoked partition are forgotten", "[unit]")
{
    LetterFlights flights;
    for (std::int64_t offset = 0; offset < 5; ++offset) {
        flights.put({"orders", 0, offset}, DeliveryStatus{});
        flights.put({"orders", 1, offset}, DeliveryStatus{});
        flights.put({"refunds", 0, offset}, DeliveryStatus{});
    }
    REQUIRE(flights.size() == 15);
    flights.forget({{"orders", 0}, {"refunds", 0}});
    CHECK(flights.size() == 5);
    CHECK(flights.find({"orders", 1, 3}) != nullptr);
    CHECK(flights.find({"orders", 0, 3}) == nullptr);
    flights.forget({{"orders", 1}});
    CHECK(flights.size() == 0);
}

namespace {

struct NoEvents : kafka::GroupEvents {
    bool assigned(std::vector<std::pair<TopicPartition, std::int64_t>>&) override { return false; }
    void revoked(const std::set<TopicPartition>&, bool) override {}
    void commit_failed(const TopicPartition&, std::int64_t) override {}
};

} // namespace

TEST_CASE("the Kafka adapter creates no queue for a partition it only resumes or stops deferring", "[unit]")
{
    // No broker: the client is created and subscribes, nothing is assigned.
    ConsumerConfig cfg;
    cfg.brokers = "127.0.0.1:1";
    cfg.group_id = "leaks";
    cfg.topics = {"orders"};
    cfg.postgres = "dbname=x";
    cfg.shutdown_timeout = std::chrono::milliseconds(1000);
    NoEvents events;
    Metrics metrics;
    kafka::GroupMember member(cfg, events, metrics, LogSink(), Redactor());
    // A unit of a revoked partition merged after the revoke releases its
    // lane; a retry backoff ending resumes its partition.
    for (std::int32_t p = 0; p < 50; ++p) {
        member.defer({"orders", p}, false);
        member.pause({"orders", p}, false);
    }
    CHECK(member.queues() == 0);
    member.defer({"orders", 7}, true); // setting a flag keeps it, for when records come
    CHECK(member.queues() == 1);
    member.defer({"orders", 7}, false);
    CHECK(member.queues() == 1);
}
