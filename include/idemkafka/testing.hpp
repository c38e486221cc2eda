#pragma once
/// \file
/// The test kit for handlers (target `idemkafka::testing`): a Kafka-protocol
/// broker in the test process and a throwaway PostgreSQL schema or cluster, so
/// a test can run a real IdempotentConsumer end to end and count its effects.
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
/// would clash with GoogleTest's `testing` namespace under `using namespace idemkafka`).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/context.hpp"

namespace idemkafka {

// Only filled in by configure(): its definition (idemkafka/config.hpp, which
// brings libpqxx) stays out of this header.
struct ConsumerConfig;

/// A record read back from a topic by TestBroker::read_all().
struct TestRecord {
    std::string topic;                ///< the topic it was read from
    std::int32_t partition = 0;       ///< its partition
    std::int64_t offset = 0;          ///< its offset
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
    /// Moves the cluster; the moved-from object owns nothing.
    TestBroker(TestBroker&&) noexcept;
    /// Moves the cluster, stopping the one this object had.
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

/// A throwaway place in PostgreSQL for the library's tables and the handler's
/// own: a schema with a unique name, which connection_string() makes the
/// `search_path`, so unqualified table names land in it. It is dropped (with
/// everything in it) on destruction.
///
/// The schema lives on, in this order:
/// * the server named by the constructor's connection string;
/// * else the server named by the environment variable IDEMKAFKA_TEST_PG
///   (a libpq connection string), when it is set and not empty;
/// * else a cluster of its own: `initdb` (from PATH, else the newest
///   /usr/lib/postgresql/VERSION/bin) in a temporary directory, listening on a
///   unix socket there only (no TCP port), stopped and removed on destruction.
///   Run as root, the server runs as the `postgres` OS user (via runuser).
///
/// A process killed before the destructor ran leaves the schema (or the
/// cluster, in a directory `idemkafka-testdb.*` under TMPDIR or /tmp) behind.
class TestDatabase {
public:
    /// A schema on the server IDEMKAFKA_TEST_PG names, else on a cluster of its
    /// own (see the class comment). Throws DatabaseError naming what failed:
    /// the server cannot be reached, initdb is not found (the message says
    /// what to install or set), the cluster does not start within 60 s.
    TestDatabase();
    /// A schema on the server `conninfo` names (a libpq keyword/value string
    /// or a postgresql:// URI; the user needs CREATE on the database). Throws
    /// ConfigError for an empty `conninfo`, DatabaseError when the server
    /// cannot be reached or the schema cannot be created.
    explicit TestDatabase(const std::string& conninfo);
    /// A schema on a cluster of its own, whatever IDEMKAFKA_TEST_PG says.
    /// Throws as TestDatabase().
    static TestDatabase own_cluster();
    /// Drops the schema; stops and removes the cluster when it has its own.
    /// Never throws: a failure is written to stderr.
    ~TestDatabase();
    TestDatabase(const TestDatabase&) = delete;
    TestDatabase& operator=(const TestDatabase&) = delete;
    /// Moves the schema (and cluster); the moved-from object owns nothing.
    TestDatabase(TestDatabase&&) noexcept;
    /// Moves the schema (and cluster), dropping the ones this object had.
    TestDatabase& operator=(TestDatabase&&) noexcept;

    /// libpq connection string of the database with the schema as its
    /// `search_path` (`options=-csearch_path=<schema>`), for the handler's
    /// tables, ConsumerConfig::postgres and any other client.
    std::string connection_string() const;
    /// The schema's name: lower-case letters, digits and `_`, unique per
    /// process and run, so it needs no quoting.
    std::string schema() const;

    /// Sets `cfg.postgres` to connection_string() and `cfg.schema` to schema(),
    /// so the consumer's claims table (and its offsets and outbox tables) land
    /// in the schema. Throws nothing.
    void configure(ConsumerConfig& cfg) const;

    /// Runs SQL (one or more statements, no results) in its own transaction on
    /// a connection of its own. Throws DatabaseError with the server's message.
    void exec(const std::string& sql) const;
    /// Runs a query whose first row's first column is an integer (a count, a
    /// sum) and returns it. Throws DatabaseError with the server's message, and
    /// when the query returns no row or a null.
    std::int64_t scalar(const std::string& sql) const;

    /// The temporary directory of its own cluster (data directory and unix
    /// socket under it); empty when the schema lives on a server named by a
    /// connection string. It is gone once the object is destroyed.
    std::string cluster_directory() const;

private:
    struct OwnCluster {};
    explicit TestDatabase(OwnCluster);
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Calls `done` every 20 ms until it returns true or `timeout` has passed;
/// returns its last answer. For awaiting what a consumer running on another
/// thread does (a count of effects, a metric), instead of sleeping.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout);

// HandlerHarness<Event> (deliver, deliver twice, crash after the database
// commit, until the dead letter; without Kafka) is in
// idemkafka/handler_harness.hpp, which brings libpqxx.

} // namespace idemkafka
