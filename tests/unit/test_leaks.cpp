// What the consumer keeps per dead letter and per partition stays bounded
// by what it has now: revokes and late flag changes leave nothing behind.

#include <set>
#include <string>

#include <idemkafka/config.hpp>
#include <idemkafka/metrics.hpp>
#include <idemkafka/redact.hpp>

#include "catch_compat.hpp"
#include "consumer/dead_letterer.hpp"
#include "kafka/group_member.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;

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
