#pragma once
// Services for integration tests: a real PostgreSQL and a Kafka-protocol
// broker, named by IDEMKAFKA_TEST_PG and IDEMKAFKA_TEST_BROKERS (scripts/test.sh
// starts both). A missing service fails the test; it never skips it.

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/types.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/testing.hpp>

namespace idemkafka::test {

/// libpq connection string of the test database; throws if unset.
std::string pg();
/// Bootstrap servers of the test broker; throws if unset.
std::string brokers();
/// A name no other test (or earlier run) uses: prefix + pid + counter.
std::string unique_name(std::string_view prefix);
/// Creates a topic and waits until its metadata shows every partition.
void create_topic(const std::string& name, int partitions);
/// Sends one command to the mock broker's control FIFO (IDEMKAFKA_MOCK_CONTROL)
/// and waits until it was applied; throws if there is no mock broker or the
/// command failed. E.g. "push-errors OffsetCommit REBALANCE_IN_PROGRESS".
void mock_control(const std::string& command);

/// True when the tests run against librdkafka's mock cluster (IDEMKAFKA_MOCK_CONTROL is set),
/// false on Apache Kafka.
bool on_mock_cluster();
/// Sets one dynamic setting of a consumer or share group, as `kafka-configs --entity-type
/// groups --alter` does (IncrementalAlterConfigs; Apache Kafka, librdkafka 2.2 or later);
/// throws when the broker refuses it. E.g. ("billing", "share.auto.offset.reset", "earliest").
void set_group_config(const std::string& group, const std::string& name, const std::string& value);
/// Raises the partition count of `topic` to `total` (CreatePartitions) and waits until the
/// metadata shows them all.
void add_partitions(const std::string& topic, int total);
/// The node id of the broker that leads topic/partition now (-1 when it has none).
std::int32_t partition_leader(const std::string& topic, std::int32_t partition);
/// Runs IDEMKAFKA_KAFKA_CTL with `command` ("kill 1", "stop 2", "cont 2", "start 1"): fault
/// control of the Apache Kafka cluster of the test's own (run_isolated.sh --own-kafka); throws
/// when there is none or the command fails.
void kafka_control(const std::string& command);
/// The offset committed in Kafka for `group` on topic/partition (-1001 when none).
std::int64_t committed_offset(const std::string& group, const std::string& topic, std::int32_t partition);

/// Commits `offset` for every partition of `topic` in `group`, as an operator's
/// offset reset does (the group must have no active member).
void reset_group_offsets(const std::string& group, const std::string& topic, int partitions, std::int64_t offset);

/// A record read back from a topic.
struct ReadRecord {
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    std::optional<std::string> key;
    std::optional<std::string> value;
    std::vector<Header> headers;
    /// Value of the first header `name`, or "" when absent.
    std::string header(std::string_view name) const;
};
/// Reads `topic` from the beginning (no consumer group offsets are used or
/// committed) until `count` records arrived or `timeout` passed.
std::vector<ReadRecord> read_topic(const std::string& topic, std::size_t count, std::chrono::milliseconds timeout);

/// Runs one SQL statement returning one integer.
std::int64_t scalar(const std::string& sql);
/// Runs SQL statements.
void exec(const std::string& sql);
/// The test kit's: polls `done` every 20 ms until it is true or `timeout` passes.
using idemkafka::wait_until;

/// Consumer settings for tests: fast group joins on the mock broker. Under
/// the consumer group protocol (see consumer_protocol()) they set
/// group.protocol=consumer instead of the session and heartbeat settings that
/// protocol refuses, and have the mock broker (IDEMKAFKA_MOCK_CONTROL) use a
/// 6 s session and 500 ms heartbeats for the groups it creates from then on.
ConsumerConfig consumer_config(const std::string& group, const std::string& topic);

/// True when IDEMKAFKA_TEST_GROUP_PROTOCOL=consumer: the tests run their
/// consumer groups under KIP-848 (librdkafka 2.12 or later); else classic.
/// Any other value fails the test that asks.
bool consumer_protocol();

/// Sets the partition assignment a test asks for (a classic strategy:
/// range, roundrobin, cooperative-sticky) in the form the group protocol takes:
/// under the consumer protocol the broker assigns, sticky and incremental
/// always, and group.remote.assignor names its assignor (range stays range,
/// the others become uniform).
void set_assignment_strategy(ConsumerConfig& cfg, const std::string& strategy);

/// The sink tests give the library: every record is kept for the test
/// case's failure report (recent_log.hpp), and those at `shown` or above go
/// to stderr as stderr_sink() writes them. IDEMKAFKA_TEST_VERBOSE shows all.
LogSink log_sink(LogLevel shown = LogLevel::warning);

/// The test event: payload "event-id,entity,amount".
struct TestEvent {
    EventId id;
    std::string entity;
    std::int64_t amount = 0;
};
std::string encode(const TestEvent& e);
TestEvent decode(std::string_view payload);
inline EventId event_id_of(const TestEvent& e)
{
    return e.id;
}

/// This test program again, as a child process running the test cases
/// `spec` selects (a hidden case: "[xyz-child]"), with this process's
/// environment plus `extra_env` ("NAME=value"). Returns its pid.
pid_t spawn_self(const std::string& spec, const std::vector<std::string>& extra_env);

/// Runs a consumer's run() on its own thread; stop() and join() on destruction.
/// The exception run() ended with, if any, is kept in `error`.
template <class C> class Runner {
public:
    explicit Runner(C& c)
        : c_(c), t_([this] {
              try {
                  c_.run();
              } catch (...) {
                  std::lock_guard<std::mutex> lock(mu_);
                  error_ = std::current_exception();
              }
              finished_ = true;
          })
    {
    }
    ~Runner() { join(); }
    void join()
    {
        if (t_.joinable()) {
            c_.stop();
            t_.join();
        }
    }
    bool finished() const { return finished_; }
    std::exception_ptr error()
    {
        std::lock_guard<std::mutex> lock(mu_);
        return error_;
    }

private:
    C& c_;
    std::mutex mu_;
    std::exception_ptr error_;
    std::atomic<bool> finished_{false};
    std::thread t_;
};

} // namespace idemkafka::test
