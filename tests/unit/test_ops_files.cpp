// The Grafana dashboard and the Prometheus alerting rules in ops/ name only
// metrics the library exports (MetricsSnapshot::to_prometheus): a renamed or
// removed metric fails here. The rules themselves are checked by promtool
// (unit_ops_rules).

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"

using namespace idemkafka;

namespace {

std::string read_file(const std::string& path)
{
    std::ifstream f(path);
    REQUIRE(f.good());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Every sample name the library can write: each family of a `# TYPE` line,
// with _bucket, _sum and _count for histograms.
std::set<std::string> exported()
{
    MetricsSnapshot m;
    PartitionLag p;
    p.topic = "t";
    m.partitions.push_back(p);
    std::set<std::string> names;
    std::istringstream text(m.to_prometheus("g"));
    const std::regex type_line("^# TYPE (idemkafka_[a-z0-9_]+) ([a-z]+)$");
    for (std::string line; std::getline(text, line);) {
        std::smatch s;
        if (!std::regex_match(line, s, type_line))
            continue;
        names.insert(s[1]);
        if (s[2] == "histogram")
            for (const char* suffix : {"_bucket", "_sum", "_count"})
                names.insert(s[1].str() + suffix);
    }
    return names;
}

std::set<std::string> used(const std::string& text)
{
    std::set<std::string> names;
    const std::regex name("idemkafka_[a-z0-9_]+");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), name); it != std::sregex_iterator(); ++it)
        names.insert(it->str());
    return names;
}

} // namespace

TEST_CASE("ops: the dashboard and the alerts use only exported metric names", "[unit][ops]")
{
    const auto names = exported();
    REQUIRE(names.count("idemkafka_lag_seconds"));
    for (const std::string file : {"ops/grafana/idemkafka-consumers.json", "ops/prometheus/idemkafka-alerts.yml"}) {
        const auto text = read_file(std::string(IDEMKAFKA_SOURCE_DIR) + "/" + file);
        const auto in_file = used(text);
        CAPTURE(file);
        CHECK(in_file.size() >= 6);
        for (const auto& n : in_file) {
            CAPTURE(n);
            CHECK(names.count(n) == 1);
        }
    }
}

TEST_CASE("ops: the dashboard shows what operators ask for", "[unit][ops]")
{
    const auto dash =
        nlohmann::json::parse(read_file(std::string(IDEMKAFKA_SOURCE_DIR) + "/ops/grafana/idemkafka-consumers.json"));
    std::string exprs;
    for (const auto& panel : dash.at("panels")) {
        CHECK_FALSE(panel.at("title").get<std::string>().empty());
        REQUIRE_FALSE(panel.at("targets").empty());
        for (const auto& t : panel.at("targets"))
            exprs += t.at("expr").get<std::string>() + "\n";
    }
    for (const char* family :
         {"idemkafka_consumed_total", "idemkafka_duplicates_total", "idemkafka_dead_lettered_total",
          "idemkafka_consumer_lag", "idemkafka_lag_seconds", "idemkafka_circuit_open", "idemkafka_db_timeouts_total",
          "idemkafka_oldest_claim_age_seconds"}) {
        CAPTURE(family);
        CHECK(exprs.find(family) != std::string::npos);
    }
}
