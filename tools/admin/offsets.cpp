// offsets: the consumer positions kept in PostgreSQL (offsets_in_database),
// next to Kafka's committed offsets and the lag; and setting a stored position,
// the supported way to skip or replay on purpose.

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <pqxx/pqxx>

#include <idemkafka/error.hpp>
#include <idemkafka/offset_store.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "pg/exec.hpp"
#include "pg/connect.hpp"

namespace idemkafka::detail::admin {
namespace {

constexpr const char* offsets_help = R"(usage: idemkafka-admin offsets [list] [options]
       idemkafka-admin offsets set --group G --topic T --partition P --offset N [--dry-run] [options]

list (the default): the stored position of every partition of every consumer group (or --group),
with Kafka's committed offset, the log end and the lag when --brokers is given.
set: sets one stored position exactly (backwards too) and bumps its epoch, so that a running
member's next write is refused and it restarts from the new position after its next rebalance.
Stop the group first for a clean cut. Records before the position are skipped, after it replayed
(replayed events are still deduplicated by their claims while those exist).

options:
  --postgres CONNINFO   libpq connection string or URI (default: $IDEMKAFKA_POSTGRES)
  --schema NAME         schema of the offset table (default public)
  --table NAME          the offset table (default consumer_offset)
  --brokers HOST:PORT   Kafka, to show committed offsets and lag (default: $IDEMKAFKA_BROKERS)
  --group NAME          only this consumer group (required for set)
  --json                machine-readable output (list)
  --dry-run             show what set would change, change nothing
A password in the connection string is never printed.
)";

struct KafkaView {
    std::int64_t committed = RD_KAFKA_OFFSET_INVALID;
    std::int64_t high = -1;
};

// Kafka's committed offset and high watermark per (group, topic, partition).
std::map<std::tuple<std::string, std::string, std::int32_t>, KafkaView>
kafka_view(const std::string& brokers, const std::vector<std::pair<std::string, OffsetStore::Stored>>& rows)
{
    std::map<std::tuple<std::string, std::string, std::int32_t>, KafkaView> out;
    std::map<std::string, std::vector<const OffsetStore::Stored*>> by_group;
    for (const auto& [g, s] : rows)
        by_group[g].push_back(&s);
    for (const auto& [group, parts] : by_group) {
        char errstr[512];
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "bootstrap.servers", brokers.c_str(), errstr, sizeof errstr);
        rd_kafka_conf_set(conf, "group.id", group.c_str(), errstr, sizeof errstr);
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof errstr);
        rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr);
        if (!rk)
            throw KafkaError(fmt::format("cannot create a Kafka client: {}", errstr));
        rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(static_cast<int>(parts.size()));
        for (const auto* s : parts)
            rd_kafka_topic_partition_list_add(list, s->topic.c_str(), s->partition);
        const auto e = rd_kafka_committed(rk, list, 10000);
        for (int i = 0; i < list->cnt; ++i) {
            KafkaView v;
            if (!e && !list->elems[i].err)
                v.committed = list->elems[i].offset;
            std::int64_t lo = -1, hi = -1;
            if (rd_kafka_query_watermark_offsets(rk, list->elems[i].topic, list->elems[i].partition, &lo, &hi,
                                                 10000) == RD_KAFKA_RESP_ERR_NO_ERROR)
                v.high = hi;
            out[{group, list->elems[i].topic, list->elems[i].partition}] = v;
        }
        rd_kafka_topic_partition_list_destroy(list);
        rd_kafka_destroy(rk);
        if (e)
            throw KafkaError(fmt::format("reading committed offsets of {}: {}", group, rd_kafka_err2str(e)));
    }
    return out;
}

std::string number_or_dash(std::int64_t v)
{
    return v < 0 ? "-" : std::to_string(v);
}

std::string json_number(std::int64_t v)
{
    return v < 0 ? "null" : std::to_string(v);
}

} // namespace

int run_offsets(std::vector<std::string> args)
{
    std::string action = "list";
    if (!args.empty() && (args.front() == "list" || args.front() == "set")) {
        action = args.front();
        args.erase(args.begin());
    }
    ArgReader a("offsets", std::move(args));
    std::string postgres, schema = "public", table = "consumer_offset", brokers, group, topic;
    std::optional<std::int64_t> partition, offset;
    bool json = false, dry_run = false;
    while (a.more()) {
        if (a.option("--postgres"))
            postgres = a.value();
        else if (a.option("--schema"))
            schema = a.value();
        else if (a.option("--table"))
            table = a.value();
        else if (a.option("--brokers"))
            brokers = a.value();
        else if (a.option("--group"))
            group = a.value();
        else if (a.option("--topic"))
            topic = a.value();
        else if (a.option("--partition"))
            partition = static_cast<std::int64_t>(parse_count(a.value(), "--partition"));
        else if (a.option("--offset"))
            offset = static_cast<std::int64_t>(parse_count(a.value(), "--offset"));
        else if (a.option("--json"))
            json = true;
        else if (a.option("--dry-run"))
            dry_run = true;
        else if (a.option("--help") || a.option("-h")) {
            out(offsets_help);
            return exit_ok;
        } else
            a.unknown();
    }
    if (postgres.empty()) {
        const char* env = std::getenv("IDEMKAFKA_POSTGRES");
        if (!env || !*env)
            throw UsageError("offsets: no database: pass --postgres CONNINFO or set IDEMKAFKA_POSTGRES");
        postgres = env;
    }
    redactor().add_conninfo(postgres);
    if (brokers.empty() && std::getenv("IDEMKAFKA_BROKERS"))
        brokers = std::getenv("IDEMKAFKA_BROKERS");
    std::unique_ptr<OffsetStore> store;
    try {
        store = std::make_unique<OffsetStore>(schema, table);
    } catch (const ConfigError& e) {
        throw UsageError(fmt::format("offsets: {}", e.what()));
    }
    if (action == "set" && (group.empty() || topic.empty() || !partition || !offset))
        throw UsageError("offsets set: --group, --topic, --partition and --offset are required");

    std::unique_ptr<pqxx::connection> conn;
    try {
        conn = pg::connect(postgres);
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("cannot connect to PostgreSQL: {}", e.what()));
    }
    pqxx::work tx(*conn);
    if (pg::exec_params(tx, "SELECT to_regclass($1) IS NOT NULL", store->qualified_name())[0][0].as<bool>() == false)
        throw DatabaseError(fmt::format("{} does not exist: no consumer runs with offsets_in_database here "
                                        "(or pass --schema/--table)",
                                        store->qualified_name()));

    if (action == "set") {
        const auto rows = store->read(tx, group);
        std::optional<std::int64_t> before;
        for (const auto& [g, s] : rows)
            if (s.topic == topic && s.partition == *partition)
                before = s.next_offset;
        const auto line = fmt::format("{} {}/{}: stored position {} -> {}", group, topic, *partition,
                                      before ? std::to_string(*before) : std::string("none"), *offset);
        if (dry_run) {
            out("dry run: " + line);
            return exit_ok;
        }
        store->set(tx, group, topic, static_cast<std::int32_t>(*partition), *offset);
        tx.commit();
        out(line);
        return exit_ok;
    }

    const auto rows = store->read(tx, group);
    tx.commit();
    std::map<std::tuple<std::string, std::string, std::int32_t>, KafkaView> kafka;
    if (!brokers.empty() && !rows.empty())
        kafka = kafka_view(brokers, rows);
    if (json) {
        std::string s = "[";
        for (std::size_t i = 0; i < rows.size(); ++i) {
            const auto& [g, r] = rows[i];
            const auto k = kafka.find({g, r.topic, r.partition});
            const KafkaView v = k == kafka.end() ? KafkaView{} : k->second;
            const std::int64_t stored = r.next_offset.value_or(-1);
            s += fmt::format("{}{{\"group\":{},\"topic\":{},\"partition\":{},\"stored\":{},\"epoch\":{},"
                             "\"kafka_committed\":{},\"log_end\":{},\"lag\":{}}}",
                             i ? "," : "", json_string(g), json_string(r.topic), r.partition, json_number(stored),
                             r.epoch, json_number(v.committed), json_number(v.high),
                             v.high >= 0 && stored >= 0 ? json_number(std::max<std::int64_t>(0, v.high - stored))
                                                        : "null");
        }
        out(s + "]");
        return exit_ok;
    }
    out(fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>10}", "group", "topic", "partition", "stored",
                    "kafka", "log end", "lag"));
    for (const auto& [g, r] : rows) {
        const auto k = kafka.find({g, r.topic, r.partition});
        const KafkaView v = k == kafka.end() ? KafkaView{} : k->second;
        const std::int64_t stored = r.next_offset.value_or(-1);
        out(fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>10}", g, r.topic, r.partition,
                        number_or_dash(stored), number_or_dash(v.committed), number_or_dash(v.high),
                        v.high >= 0 && stored >= 0 ? std::to_string(std::max<std::int64_t>(0, v.high - stored))
                                                   : std::string("-")));
    }
    if (rows.empty())
        out("no stored positions");
    return exit_ok;
}

void print_stored_positions(const std::string& postgres, const std::string& schema, const std::string& brokers)
{
    {
        const auto c = pg::connect(postgres);
        pqxx::nontransaction tx(*c);
        const OffsetStore store(schema, "consumer_offset");
        if (!pg::exec_params(tx, "SELECT to_regclass($1) IS NOT NULL", store.qualified_name())[0][0].as<bool>())
            return;
    }
    out("");
    out("stored positions (offsets_in_database)");
    std::vector<std::string> args{"list", "--postgres", postgres, "--schema", schema};
    if (!brokers.empty()) {
        args.push_back("--brokers");
        args.push_back(brokers);
    }
    run_offsets(std::move(args));
}

} // namespace idemkafka::detail::admin
