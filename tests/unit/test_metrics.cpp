// Gauges of the metrics registry: per-partition lag, in-flight records, the
// oldest claim's age, and the statistics parser behind the lag; the
// Prometheus text exposition of every counter, gauge and histogram.

#include <chrono>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <idemkafka/config.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"
#include "kafka/stats.hpp"
#include "observe/metrics_access.hpp"

using namespace idemkafka;

namespace {

std::int64_t now_ms()
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

bool has_line(const std::string& text, const std::string& line)
{
    return text.find(line + "\n") != std::string::npos;
}

// Trimmed from a librdkafka 2.0.2 consumer's statistics (statistics.interval.ms)
// after one partition committed offset 2 and the other nothing.
constexpr const char* stats_json = R"({
  "name": "rdkafka#consumer-2", "type": "consumer", "ts": 1234, "time": 1796033010,
  "brokers": {},
  "topics": {
    "orders": { "topic": "orders", "age": 5000, "partitions": {
      "0": { "partition": 0, "fetch_state": "active", "app_offset": 5, "stored_offset": -1001,
             "committed_offset": 2, "hi_offset": 5, "ls_offset": 5, "lo_offset": 0,
             "consumer_lag": 3, "consumer_lag_stored": -1, "fetchq_cnt": 0 },
      "1": { "partition": 1, "fetch_state": "active", "app_offset": 5, "stored_offset": -1001,
             "committed_offset": -1001, "hi_offset": 5, "ls_offset": 5, "lo_offset": 0,
             "consumer_lag": -1, "consumer_lag_stored": -1 },
      "-1": { "partition": -1, "fetch_state": "none", "committed_offset": -1001, "hi_offset": -1001,
              "consumer_lag": -1 } } },
    "refunds": { "topic": "refunds", "partitions": {
      "3": { "partition": 3, "committed_offset": 10, "hi_offset": 14, "ls_offset": 12 } } }
  },
  "cgrp": { "state": "up" }
})";

} // namespace

TEST_CASE("per-partition lag renders as a labelled gauge, escaped per the text format", "[unit]")
{
    Metrics m;
    m.lag.set(8);
    detail::set_partitions(m, {{"orders", 0, 5, 10, 10, 15, LagSource::watermarks},
                               {"orders", 1, 3, 2, 2, 5, LagSource::statistics},
                               {"we\"ird\\topic\nname", 2, -1, -1, -1, -1, LagSource::watermarks}});
    const auto s = m.snapshot();
    REQUIRE(s.partitions.size() == 3);
    CHECK(s.partitions[1].topic == "orders");
    CHECK(s.partitions[1].partition == 1);
    CHECK(s.partitions[1].lag == 3);
    CHECK(s.partitions[1].position == 2);
    CHECK(s.partitions[1].committed == 2);
    CHECK(s.partitions[1].high_watermark == 5);
    CHECK(s.partitions[1].source == LagSource::statistics);
    const auto text = s.to_prometheus("bill\"ing");
    CHECK(has_line(text, "# TYPE idemkafka_consumer_lag gauge"));
    CHECK(has_line(text, R"(idemkafka_consumer_lag{group="bill\"ing",topic="orders",partition="0"} 5)"));
    CHECK(has_line(text, R"(idemkafka_consumer_lag{group="bill\"ing",topic="orders",partition="1"} 3)"));
    CHECK(has_line(text, R"(idemkafka_consumer_lag{group="bill\"ing",topic="we\"ird\\topic\nname",partition="2"} -1)"));
    CHECK(has_line(text, R"(idemkafka_lag{group="bill\"ing"} 8)"));
    // The family is declared once and its samples follow the declaration.
    const auto type = text.find("# TYPE idemkafka_consumer_lag gauge");
    CHECK(text.find("# TYPE idemkafka_consumer_lag gauge", type + 1) == std::string::npos);
    CHECK(text.find("idemkafka_consumer_lag{") > type);

    // Revoked partitions leave the list, and the family stays declared without samples.
    detail::set_partitions(m, {});
    const auto empty = m.snapshot().to_prometheus("g");
    CHECK(has_line(empty, "# TYPE idemkafka_consumer_lag gauge"));
    CHECK(empty.find("idemkafka_consumer_lag{") == std::string::npos);
}

TEST_CASE("in-flight and oldest-claim gauges in the snapshot and the exposition", "[unit]")
{
    Metrics m;
    auto s = m.snapshot();
    CHECK(s.in_flight_records == 0);
    CHECK(s.in_flight_bytes == 0);
    CHECK(s.oldest_claim_unix_ms == -1);
    CHECK(s.oldest_claim_age_seconds == -1);
    CHECK(s.partitions.empty());
    CHECK(has_line(s.to_prometheus("g"), R"(idemkafka_oldest_claim_age_seconds{group="g"} -1)"));

    m.in_flight_records.add(2);
    m.in_flight_bytes.add(300);
    const auto minted = now_ms() - 90000;
    m.oldest_claim_unix_ms.set(minted);
    const auto before = now_ms();
    s = m.snapshot();
    const auto after = now_ms();
    CHECK(s.in_flight_records == 2);
    CHECK(s.in_flight_bytes == 300);
    CHECK(s.oldest_claim_unix_ms == minted);
    CHECK(s.oldest_claim_age_seconds >= static_cast<double>(before - minted) / 1000.0);
    CHECK(s.oldest_claim_age_seconds <= static_cast<double>(after - minted) / 1000.0);
    const auto text = s.to_prometheus("g");
    CHECK(has_line(text, "# TYPE idemkafka_in_flight_records gauge"));
    CHECK(has_line(text, R"(idemkafka_in_flight_records{group="g"} 2)"));
    CHECK(has_line(text, R"(idemkafka_in_flight_bytes{group="g"} 300)"));
    CHECK(has_line(text, "# TYPE idemkafka_oldest_claim_age_seconds gauge"));
    CHECK(text.find(R"(idemkafka_oldest_claim_age_seconds{group="g"} 9)") != std::string::npos);

    // An id from the future (producer clock ahead of ours) is age 0, not negative.
    m.oldest_claim_unix_ms.set(now_ms() + 60000);
    CHECK(m.snapshot().oldest_claim_age_seconds == 0);
}

TEST_CASE("oldest_claim_refresh must not be negative", "[unit]")
{
    ConsumerConfig c;
    c.brokers = "localhost:9092";
    c.group_id = "g";
    c.topics = {"t"};
    c.postgres = "dbname=x";
    c.oldest_claim_refresh = std::chrono::milliseconds(0);
    CHECK_NOTHROW(c.validate());
    c.oldest_claim_refresh = std::chrono::milliseconds(-1);
    CHECK_THROWS_AS(c.validate(), ConfigError);
}

TEST_CASE("librdkafka statistics: per-partition lag, committed offset and high watermark", "[unit]")
{
    using detail::kafka::parse_partition_stats;
    const auto parts = parse_partition_stats(stats_json);
    REQUIRE(parts.size() == 3); // the internal partition -1 is left out
    const auto find = [&](const std::string& topic, std::int32_t partition) {
        for (const auto& p : parts)
            if (p.topic == topic && p.partition == partition)
                return p;
        FAIL("partition missing: " << topic << "/" << partition);
        return parts.front();
    };
    const auto p0 = find("orders", 0);
    CHECK(p0.consumer_lag == 3);
    CHECK(p0.committed_offset == 2);
    CHECK(p0.hi_offset == 5);
    CHECK(p0.lag() == 3);
    // Nothing committed: librdkafka knows no lag, and neither do we (-1001 is -1 here).
    const auto p1 = find("orders", 1);
    CHECK(p1.committed_offset == -1);
    CHECK(p1.consumer_lag == -1);
    CHECK(p1.lag() == -1);
    // Without consumer_lag: end (the last stable offset when there is one) minus committed.
    const auto r3 = find("refunds", 3);
    CHECK(r3.consumer_lag == -1);
    CHECK(r3.lag() == 2);

    CHECK(parse_partition_stats("").empty());
    CHECK(parse_partition_stats("not json {").empty());
    CHECK(parse_partition_stats("[1,2]").empty());
    CHECK(parse_partition_stats(R"({"topics": {"t": {"partitions": {"0": {"partition": "zero"}}}}})").empty());
    CHECK(parse_partition_stats(R"({"topics": 5})").empty());
}

TEST_CASE("circuit breaker metrics in the snapshot and the exposition", "[unit]")
{
    Metrics m;
    auto s = m.snapshot();
    CHECK(s.circuit_open == 0);
    CHECK(s.circuit_opened == 0);
    CHECK(s.circuit_open_seconds == 0);
    m.circuit_open.set(1);
    m.circuit_opened.add();
    m.circuit_gave_up.add();
    m.circuit_open_ms.add(2500);
    s = m.snapshot();
    CHECK(s.circuit_open == 1);
    CHECK(s.circuit_opened == 1);
    CHECK(s.circuit_open_seconds == 2.5);
    const auto text = s.to_prometheus("g");
    CHECK(has_line(text, "# TYPE idemkafka_circuit_open gauge"));
    CHECK(has_line(text, R"(idemkafka_circuit_open{group="g"} 1)"));
    CHECK(has_line(text, "# TYPE idemkafka_circuit_opened_total counter"));
    CHECK(has_line(text, R"(idemkafka_circuit_opened_total{group="g"} 1)"));
    CHECK(s.circuit_gave_up == 1);
    CHECK(has_line(text, R"(idemkafka_circuit_gave_up_total{group="g"} 1)"));
    CHECK(has_line(text, "# TYPE idemkafka_circuit_open_seconds_total counter"));
    CHECK(has_line(text, R"(idemkafka_circuit_open_seconds_total{group="g"} 2.5)"));
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
