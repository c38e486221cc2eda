#pragma once
/// \file
/// The test kit for handlers (target `idemkafka::testing`): a Kafka-protocol
/// broker in the test process, so a test can run a real IdempotentConsumer end
/// to end.
///
///     find_package(idemkafka CONFIG REQUIRED COMPONENTS testing)
///     target_link_libraries(my_tests PRIVATE idemkafka::testing)
///
/// Nothing here depends on a test framework: use it from Catch2 (v2 or v3),
/// GoogleTest or a plain main(). Failures are exceptions (idemkafka::KafkaError,
/// idemkafka::DatabaseError, idemkafka::ConfigError) whose message names what
/// went wrong; every wait is bounded, nothing here blocks forever.
///
/// The kit lives in namespace idemkafka itself (no `testing` namespace, which
/// would clash with GoogleTest's `::testing` under `using namespace idemkafka`).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"

namespace idemkafka {

/// A record read back from a topic by TestBroker::read_all().
struct TestRecord {
    std::string topic;
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    std::optional<std::string> key;   ///< nullopt for a null key
    std::optional<std::string> value; ///< nullopt for a null value
    std::vector<Header> headers;      ///< in record order; names may repeat

    /// Value of the first header called `name`; nullopt when there is none or
    /// its value is null. E.g. `header(dead_letter_header::reason)`.
    std::optional<std::string> header(std::string_view name) const;
};

/// An in-process Kafka cluster: librdkafka's mock cluster, which speaks the
/// Kafka protocol on loopback (consumer groups, offset commits, producers) and
/// injects faults. It lives as long as this object; declare it before the
/// consumers that use it so it outlives them.
///
/// Topics are never created behind your back by this class: create every topic
/// a test uses, the dead-letter topic too, with create_topic() (librdkafka 2.0's
/// mock cluster auto-creates a topic a client names with 4 partitions, which
/// makes partition-dependent tests flaky).
///
/// All member functions may be called from any thread, including while
/// consumers run.
class TestBroker {
public:
    /// Starts a cluster of `brokers` brokers (ids 1..brokers) on loopback.
    /// Throws ConfigError when `brokers` is not 1 to 64, KafkaError when the
    /// cluster cannot be created.
    explicit TestBroker(int brokers = 1);
    /// Stops the cluster; clients still connected see their brokers vanish.
    ~TestBroker();
    TestBroker(const TestBroker&) = delete;
    TestBroker& operator=(const TestBroker&) = delete;
    TestBroker(TestBroker&&) noexcept;
    TestBroker& operator=(TestBroker&&) noexcept;

    /// `host:port,...` of the cluster, for ConsumerConfig::brokers,
    /// PublisherConfig::brokers or any Kafka client.
    std::string bootstrap_servers() const;

    /// Sets `cfg.brokers` to this cluster and, unless `cfg.kafka` already says
    /// otherwise, a 6 s session timeout and 500 ms heartbeats so group joins
    /// and rebalances take seconds, not the 45 s default. Under
    /// `group.protocol=consumer` the broker owns those settings and only
    /// `cfg.brokers` is set. Throws nothing.
    void configure(ConsumerConfig& cfg) const;

    /// Creates `name` with `partitions` partitions and returns once a client's
    /// metadata shows every one of them, so a producer or consumer started
    /// next sees the topic whole. Throws ConfigError for an empty name or
    /// partitions outside 1..100000, KafkaError when the cluster refuses the
    /// topic (e.g. it exists already) or its metadata is not complete within
    /// 30 s (e.g. while the brokers are down).
    void create_topic(const std::string& name, int partitions = 1);

    /// Produces one record, partitioned by librdkafka's default partitioner
    /// (by key hash; records without key spread), and waits for the
    /// acknowledgement. Returns the record's offset. Throws KafkaError when the
    /// topic does not exist (it is never auto-created), when the record is not
    /// acknowledged within 10 s (e.g. the brokers are down) or the cluster
    /// refuses it (e.g. no such partition).
    std::int64_t produce(const std::string& topic, const std::optional<std::string>& key,
                         const std::optional<std::string>& value, const std::vector<Header>& headers = {});
    /// As above, into partition `partition` of `topic`.
    std::int64_t produce(const std::string& topic, std::int32_t partition, const std::optional<std::string>& key,
                         const std::optional<std::string>& value, const std::vector<Header>& headers = {});

    /// Every record of `topic` from the beginning to the end it has when the
    /// call starts, ordered by partition then offset. Uses no consumer group
    /// and commits nothing. A topic that does not exist has no records (empty
    /// result). Throws KafkaError when the end is not reached within `timeout`
    /// (e.g. the brokers are down); it never waits longer than that.
    std::vector<TestRecord> read_all(const std::string& topic,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

    /// The next `n` OffsetCommit requests, from any client of the cluster, are
    /// answered with REBALANCE_IN_PROGRESS: an error librdkafka reports to the
    /// application without retrying it, so a consumer sees `n` failed offset
    /// commits (Metrics::offset_commit_failures) after its database commits.
    /// Failures accumulate with earlier calls. Throws ConfigError when `n` < 0.
    void fail_next_offset_commits(int n);
    /// Forgets any offset-commit failures still queued by fail_next_offset_commits().
    void clear_offset_commit_failures();

    /// Takes every broker down: connections are closed and new ones refused
    /// until bring_up(). Clients retry on their own; produce(), create_topic()
    /// and read_all() fail (after their bounded wait) meanwhile. Throws
    /// KafkaError when the cluster refuses.
    void take_down();
    /// Brings every broker back up after take_down(). Throws KafkaError when
    /// the cluster refuses.
    void bring_up();

    /// Number of brokers in the cluster.
    int broker_count() const noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// HandlerHarness<Event> (deliver / deliver_twice / crash after the database
// commit, without Kafka) will be declared here once the engine's claim
// transaction is a component of its own it can drive. Until then, test a
// handler through a real IdempotentConsumer on a TestBroker.

} // namespace idemkafka
