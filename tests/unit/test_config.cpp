#include <cmath>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <librdkafka/rdkafka.h>

#include <idemkafka/config.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/metrics.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "observe/metrics_access.hpp"
#include "pg/claims.hpp"

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

    for (const auto& bad : {std::string(".."), std::string("dead letters"), std::string(250, 'x'), std::string("dlq/x")}) {
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

TEST_CASE("identifiers are quoted, quotes doubled", "[unit]")
{
    CHECK(quote_identifier("processed_event") == "\"processed_event\"");
    CHECK(quote_identifier("a\"; DROP TABLE x; --") == "\"a\"\"; DROP TABLE x; --\"");
    REQUIRE_THROWS_AS(quote_identifier(""), ConfigError);
    REQUIRE_THROWS_AS(quote_identifier(std::string("a\0b", 3)), ConfigError);
    ProcessedEventStore s("my schema", "Processed");
    CHECK(s.qualified_name() == "\"my schema\".\"Processed\"");
    CHECK(detail::pg::claim_sql(s).find("INSERT INTO \"my schema\".\"Processed\"") == 0);
    CHECK(detail::pg::claim_sql(s).find("ON CONFLICT DO NOTHING RETURNING event_id") != std::string::npos);
}

TEST_CASE("claim array literal", "[unit]")
{
    const auto a = EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    const auto b = EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398e");
    CHECK(detail::pg::uuid_array({}) == "{}");
    CHECK(detail::pg::uuid_array({a, b}) ==
          "{017f22e2-79b0-7cc3-98c4-dc0c0c07398f,017f22e2-79b0-7cc3-98c4-dc0c0c07398e}");
}

TEST_CASE("publisher refuses a non-idempotent configuration", "[unit]")
{
    PublisherConfig p;
    p.brokers = "localhost:9092";
    REQUIRE_NOTHROW(p.validate());
    p.kafka["enable.idempotence"] = "false";
    REQUIRE_THROWS_AS(p.validate(), ConfigError);
    p.kafka.clear();
    p.kafka["acks"] = "1";
    REQUIRE_THROWS_AS(p.validate(), ConfigError);
}

TEST_CASE("metrics render as Prometheus text", "[unit]")
{
    Metrics m;
    m.consumed.add(3);
    m.duplicates.add();
    const auto text = m.snapshot().to_prometheus("bill\"ing");
    CHECK(text.find("# TYPE idemkafka_consumed_total counter\n") != std::string::npos);
    CHECK(text.find("idemkafka_consumed_total{group=\"bill\\\"ing\"} 3\n") != std::string::npos);
    CHECK(text.find("idemkafka_duplicates_total{group=\"bill\\\"ing\"} 1\n") != std::string::npos);
}

TEST_CASE("Prometheus exposition follows the text format rules", "[unit]")
{
    Metrics m;
    m.handler_seconds.observe(0.0003);
    m.handler_seconds.observe(2);
    m.batch_records.observe(500);
    m.dead_lettered[static_cast<std::size_t>(DeadLetterReason::decode_error)].add(2);
    detail::set_partitions(m, {{"orders", 0, 3, 7, 7, 10, LagSource::watermarks},
                               {"odd\"topic\\with\nbreak", 1, -1, -1, -1, -1, LagSource::statistics}});
    m.oldest_claim_unix_ms.set(0);
    const auto text = m.snapshot().to_prometheus("billing");
    const std::regex help(R"(# HELP [a-zA-Z_:][a-zA-Z0-9_:]* .+)");
    const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
    const std::regex sample(
        R"(([a-zA-Z_:][a-zA-Z0-9_:]*)\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*"(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*)\} (-?[0-9.e+-]+|\+Inf|NaN))");
    std::istringstream in(text);
    std::string line, typed;
    std::set<std::string> families;
    int samples = 0;
    while (std::getline(in, line)) {
        std::smatch mt;
        if (std::regex_match(line, help))
            continue;
        if (std::regex_match(line, mt, type)) {
            typed = mt[1];
            CHECK(families.insert(typed).second); // each family declared once
            continue;
        }
        INFO(line);
        REQUIRE(std::regex_match(line, mt, sample));
        const std::string name = mt[1];
        // A sample belongs to the family declared just before it.
        CHECK((name == typed || name == typed + "_bucket" || name == typed + "_sum" || name == typed + "_count"));
        ++samples;
    }
    CHECK(samples > 20);
    CHECK(text.find("idemkafka_handler_seconds_bucket{group=\"billing\",le=\"0.0005\"} 1\n") != std::string::npos);
    CHECK(text.find("idemkafka_handler_seconds_bucket{group=\"billing\",le=\"+Inf\"} 2\n") != std::string::npos);
    CHECK(text.find("idemkafka_handler_seconds_count{group=\"billing\"} 2\n") != std::string::npos);
    CHECK(text.find("idemkafka_dead_lettered_total{group=\"billing\",reason=\"decode_error\"} 2\n") !=
          std::string::npos);
    CHECK(text.find("idemkafka_consumer_lag{group=\"billing\",topic=\"orders\",partition=\"0\"} 3\n") !=
          std::string::npos);
    CHECK(families.count("idemkafka_consumer_lag") == 1);
    CHECK(families.count("idemkafka_in_flight_records") == 1);
    CHECK(families.count("idemkafka_in_flight_bytes") == 1);
    CHECK(families.count("idemkafka_oldest_claim_age_seconds") == 1);
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
