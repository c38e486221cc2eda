// ConsumerConfig::validate(): what it refuses, and that each refusal names
// the field (or Kafka property) to change.

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <librdkafka/rdkafka.h>

#include <idemkafka/config.hpp>
#include <idemkafka/error.hpp>

#include "catch_compat.hpp"
#include "kafka/client.hpp"

using namespace idemkafka;

namespace {

ConsumerConfig valid()
{
    ConsumerConfig c;
    c.brokers = "localhost:9092";
    c.group_id = "billing";
    c.topics = {"orders"};
    c.postgres = "dbname=x";
    return c;
}

std::string error_of(const ConsumerConfig& c)
{
    try {
        c.validate();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("a valid configuration passes", "[unit]")
{
    REQUIRE_NOTHROW(valid().validate());
}

TEST_CASE("enable.auto.commit=true is refused, naming the property", "[unit]")
{
    for (const char* v : {"true", "TRUE", "1"}) {
        auto c = valid();
        c.kafka["enable.auto.commit"] = v;
        const auto msg = error_of(c);
        CAPTURE(v, msg);
        CHECK(msg.find("enable.auto.commit") != std::string::npos);
    }
    auto c = valid();
    c.kafka["enable.auto.offset.store"] = "true";
    CHECK(error_of(c).find("enable.auto.offset.store") != std::string::npos);
    c = valid();
    c.kafka["enable.auto.commit"] = "false"; // saying what the library does anyway is fine
    CHECK(error_of(c).empty());
}

TEST_CASE("missing and out-of-range fields name the field", "[unit]")
{
    auto c = valid();
    c.brokers.clear();
    CHECK(error_of(c).rfind("brokers", 0) == 0);
    c = valid();
    c.group_id.clear();
    CHECK(error_of(c).rfind("group_id", 0) == 0);
    c = valid();
    c.topics.clear();
    CHECK(error_of(c).rfind("topics", 0) == 0);
    c = valid();
    c.postgres.clear();
    CHECK(error_of(c).rfind("postgres", 0) == 0);
    c = valid();
    c.max_batch = 0;
    CHECK(error_of(c).rfind("max_batch", 0) == 0);
    c = valid();
    c.batches_per_unit = 0;
    CHECK(error_of(c).rfind("batches_per_unit", 0) == 0);
    c.batches_per_unit = 65;
    CHECK(error_of(c).rfind("batches_per_unit", 0) == 0);
    c.batches_per_unit = 64;
    c.max_batch = 2000; // 128000 records a unit
    CHECK(error_of(c).rfind("batches_per_unit", 0) == 0);
    c.max_batch = 500;
    CHECK(error_of(c).empty());
    c = valid();
    c.table = "";
    CHECK(error_of(c).rfind("table", 0) == 0);
    c = valid();
    c.schema = std::string(64, 's');
    CHECK(error_of(c).rfind("schema", 0) == 0);
    c = valid();
    c.kafka["group.id"] = "other";
    CHECK(error_of(c).find("group_id") != std::string::npos);
    c = valid();
    c.commit_interval = std::chrono::milliseconds(-1);
    CHECK(error_of(c).rfind("commit_interval", 0) == 0);
    c = valid();
    c.commit_interval = std::chrono::milliseconds(0); // one commit per batch
    CHECK(error_of(c).empty());
    c = valid();
    c.max_prefetch_records = 0;
    CHECK(error_of(c).rfind("max_prefetch_records", 0) == 0);
}

TEST_CASE("circuit breaker settings: on by default, a bad value names its field", "[unit]")
{
    const ConsumerConfig defaults;
    CHECK(defaults.circuit_breaker.enabled);
    using Field = std::tuple<const char*, void (*)(CircuitBreaker&)>;
    const std::vector<Field> bad{
        {"circuit_breaker.window", [](CircuitBreaker& b) { b.window = std::chrono::milliseconds(0); }},
        {"circuit_breaker.min_attempts", [](CircuitBreaker& b) { b.min_attempts = 0; }},
        {"circuit_breaker.failure_ratio", [](CircuitBreaker& b) { b.failure_ratio = 0; }},
        {"circuit_breaker.failure_ratio", [](CircuitBreaker& b) { b.failure_ratio = 1.5; }},
        {"circuit_breaker.failure_ratio", [](CircuitBreaker& b) { b.failure_ratio = std::nan(""); }},
        {"circuit_breaker.min_keys", [](CircuitBreaker& b) { b.min_keys = 0; }},
        {"circuit_breaker.min_partitions", [](CircuitBreaker& b) { b.min_partitions = 0; }},
        {"circuit_breaker.backoff", [](CircuitBreaker& b) { b.backoff = std::chrono::milliseconds(0); }},
        {"circuit_breaker.backoff_max", [](CircuitBreaker& b) { b.backoff_max = b.backoff / 2; }},
        {"circuit_breaker.probe_records", [](CircuitBreaker& b) { b.probe_records = 0; }},
        {"circuit_breaker.give_up_after", [](CircuitBreaker& b) { b.give_up_after = std::chrono::milliseconds(-1); }},
    };
    for (const auto& [field, spoil] : bad) {
        auto c = valid();
        spoil(c.circuit_breaker);
        const auto msg = error_of(c);
        CAPTURE(field, msg);
        CHECK(msg.rfind(std::string(field) + ":", 0) == 0);
    }
    auto c = valid();
    c.circuit_breaker.failure_ratio = 1; // every attempt failed
    c.circuit_breaker.min_keys = 1;
    c.circuit_breaker.give_up_after = std::chrono::milliseconds(0); // never
    CHECK(error_of(c).empty());
    c.circuit_breaker.enabled = false;
    CHECK(error_of(c).empty());
}

TEST_CASE("the dead-letter topic: a valid Kafka name, never consumed by its own group", "[unit]")
{
    auto c = valid();
    c.group_id = "billing:v2"; // the derived name "billing:v2.dlq" cannot be a topic
    auto msg = error_of(c);
    CAPTURE(msg);
    CHECK(msg.rfind("dead_letter_topic: \"billing:v2.dlq\" (group_id + \".dlq\") is not a valid Kafka topic name", 0) ==
          0);
    CHECK(msg.find("set dead_letter_topic") != std::string::npos);
    c.dead_letter_topic = "billing-v2.dlq";
    CHECK(error_of(c).empty());

    for (const auto& bad :
         {std::string(".."), std::string("dead letters"), std::string(250, 'x'), std::string("dlq/x")}) {
        c = valid();
        c.dead_letter_topic = bad;
        CAPTURE(bad);
        CHECK(error_of(c).rfind("dead_letter_topic: \"" + bad + "\" is not a valid Kafka topic name", 0) == 0);
    }

    c = valid();
    c.topics = {"orders"};
    c.dead_letter_topic = "orders";
    CHECK(error_of(c).rfind("dead_letter_topic: must not be one of the consumed topics", 0) == 0);

    // A pattern subscription that would take in the group's own dead letters.
    c = valid();
    c.group_id = "orders-x";
    c.topics = {"payments", "^orders.*"};
    msg = error_of(c);
    CAPTURE(msg);
    CHECK(msg.rfind("topics: the pattern ^orders.* matches the dead-letter topic orders-x.dlq", 0) == 0);
    c.dead_letter_topic = "dlq.orders-x";
    CHECK(error_of(c).empty());
    c.dead_letter_topic.clear();
    c.topics = {"^orders-[0-9]+$"}; // does not match orders-x.dlq
    CHECK(error_of(c).empty());
}

TEST_CASE("group.protocol: consumer refuses the settings the broker owns, naming what replaces them", "[unit]")
{
    auto c = valid();
    c.kafka["group.protocol"] = "cooperative";
    CHECK(error_of(c).find("expected classic or consumer") != std::string::npos);
    c = valid();
    c.kafka["group.protocol"] = "classic";
    c.kafka["session.timeout.ms"] = "6000";
    c.kafka["partition.assignment.strategy"] = "cooperative-sticky";
    CHECK(error_of(c).empty());
    c.kafka["group.remote.assignor"] = "uniform";
    CHECK(error_of(c).find("group.remote.assignor") != std::string::npos);

    c = valid();
    c.kafka["group.protocol"] = " Consumer ";
    if (rd_kafka_version() < 0x020c0000) {
        // KIP-848 is generally available from librdkafka 2.12 on.
        const auto msg = error_of(c);
        CAPTURE(msg);
        CHECK(msg.find("librdkafka 2.12") != std::string::npos);
        return;
    }
    CHECK(error_of(c).empty());
    c.kafka["group.remote.assignor"] = "uniform";
    c.kafka["max.poll.interval.ms"] = "60000";
    CHECK(error_of(c).empty());
    const std::vector<std::tuple<std::string, std::string, std::string>> refused = {
        {"session.timeout.ms", "6000", "group.consumer.session.timeout.ms"},
        {"heartbeat.interval.ms", "500", "group.consumer.heartbeat.interval.ms"},
        {"partition.assignment.strategy", "range", "group.remote.assignor"},
        {"group.protocol.type", "consumer", "no protocol type"}};
    for (const auto& [key, value, instead] : refused) {
        auto k = c;
        k.kafka[key] = value;
        const auto msg = error_of(k);
        CAPTURE(key, msg);
        CHECK(msg.find("kafka[\"" + key + "\"]") != std::string::npos);
        CHECK(msg.find("group.protocol=consumer") != std::string::npos);
        CHECK(msg.find(instead) != std::string::npos);
    }
}

TEST_CASE("cooperative-sticky on a librdkafka that aborts closing before the first assignment is warned of", "[unit]")
{
    using detail::kafka::client_bug_warning;
    const std::map<std::string, std::string> sticky{{"partition.assignment.strategy", "cooperative-sticky"}};
    const std::map<std::string, std::string> both{{"partition.assignment.strategy", "range,cooperative-sticky"}};
    const std::map<std::string, std::string> range{{"partition.assignment.strategy", "range"}};
    const int v2_0_2 = 0x020002ff;
    const int v2_3_0 = 0x020300ff;
    const std::string warning = client_bug_warning(sticky, v2_0_2);
    CHECK(warning.find("librdkafka 2.0.2") != std::string::npos);
    CHECK(warning.find("aborts the process") != std::string::npos);
    CHECK(warning.find("2.3.0 or later") != std::string::npos);
    CHECK_FALSE(client_bug_warning(both, 0x020201ff).empty());
    CHECK(client_bug_warning(sticky, v2_3_0).empty());
    CHECK(client_bug_warning(sticky, 0x020f00ff).empty());
    CHECK(client_bug_warning(range, v2_0_2).empty());
    CHECK(client_bug_warning({}, v2_0_2).empty());
}

TEST_CASE("frozen_member_timeout below 1 s is refused, naming the field", "[unit]")
{
    // Another member's session idle in a transaction that long is ended: a
    // live member's ordinary handler call must never look frozen.
    for (const auto ms : {1, 10, 999}) {
        auto c = valid();
        c.frozen_member_timeout = std::chrono::milliseconds(ms);
        const auto msg = error_of(c);
        CAPTURE(ms, msg);
        CHECK(msg.rfind("frozen_member_timeout", 0) == 0);
        CHECK(msg.find("1000 ms") != std::string::npos);
    }
    for (const auto ms : {0, 1000, 60000}) { // 0: max.poll.interval.ms
        auto c = valid();
        c.frozen_member_timeout = std::chrono::milliseconds(ms);
        CAPTURE(ms);
        CHECK(error_of(c).empty());
    }
}
