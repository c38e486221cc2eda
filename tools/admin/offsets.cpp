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
#include "pg/connect.hpp"
#include "pg/exec.hpp"

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
            if (rd_kafka_query_watermark_offsets(rk, list->elems[i].topic, list->elems[i].partition, &lo, &hi, 10000) ==
                RD_KAFKA_RESP_ERR_NO_ERROR)
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

namespace {

struct OffsetsOptions {
    std::string action = "list";
    std::string postgres, schema = "public", table = "consumer_offset", brokers, group, topic;
    std::optional<std::int64_t> partition, offset;
    bool json = false, dry_run = false, help = false;
};

OffsetsOptions parse_offsets_args(std::vector<std::string> args)
{
    OffsetsOptions o;
    if (!args.empty() && (args.front() == "list" || args.front() == "set")) {
        o.action = args.front();
        args.erase(args.begin());
    }
    ArgReader a("offsets", std::move(args));
    while (a.more()) {
        if (a.option("--postgres"))
            o.postgres = a.value();
        else if (a.option("--schema"))
            o.schema = a.value();
        else if (a.option("--table"))
            o.table = a.value();
        else if (a.option("--brokers"))
            o.brokers = a.value();
        else if (a.option("--group"))
            o.group = a.value();
        else if (a.option("--topic"))
            o.topic = a.value();
        else if (a.option("--partition"))
            o.partition = static_cast<std::int64_t>(parse_count(a.value(), "--partition"));
        else if (a.option("--offset"))
            o.offset = static_cast<std::int64_t>(parse_count(a.value(), "--offset"));
        else if (a.option("--json"))
            o.json = true;
        else if (a.option("--dry-run"))
            o.dry_run = true;
        else if (a.option("--help") || a.option("-h")) {
            o.help = true;
            return o;
        } else
            a.unknown();
    }
    if (o.postgres.empty()) {
        const char* env = std::getenv("IDEMKAFKA_POSTGRES");
        if (!env || !*env)
            throw UsageError("offsets: no database: pass --postgres CONNINFO or set IDEMKAFKA_POSTGRES");
        o.postgres = env;
    }
    if (o.brokers.empty() && std::getenv("IDEMKAFKA_BROKERS"))
        o.brokers = std::getenv("IDEMKAFKA_BROKERS");
    if (o.action == "set" && (o.group.empty() || o.topic.empty() || !o.partition || !o.offset))
        throw UsageError("offsets set: --group, --topic, --partition and --offset are required");
    return o;
}

int set_position(pqxx::work& tx, const OffsetStore& store, const OffsetsOptions& o)
{
    const auto rows = store.read(tx, o.group);
    std::optional<std::int64_t> before;
    for (const auto& [g, s] : rows)
        if (s.topic == o.topic && s.partition == *o.partition)
            before = s.next_offset;
    const auto line = fmt::format("{} {}/{}: stored position {} -> {}", o.group, o.topic, *o.partition,
                                  before ? std::to_string(*before) : std::string("none"), *o.offset);
    if (o.dry_run) {
        out("dry run: " + line);
        return exit_ok;
    }
    store.set(tx, o.group, o.topic, static_cast<std::int32_t>(*o.partition), *o.offset);
    tx.commit();
    out(line);
    return exit_ok;
}

using StoredRows = std::vector<std::pair<std::string, OffsetStore::Stored>>;
using KafkaViews = std::map<std::tuple<std::string, std::string, std::int32_t>, KafkaView>;

KafkaView view_of(const KafkaViews& kafka, const std::string& group, const std::string& topic, std::int32_t partition)
{
    const auto k = kafka.find({group, topic, partition});
    return k == kafka.end() ? KafkaView{} : k->second;
}

void print_positions_json(const StoredRows& rows, const KafkaViews& kafka)
{
    std::string s = "[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& [g, r] = rows[i];
        const KafkaView v = view_of(kafka, g, r.topic, r.partition);
        const std::int64_t stored = r.next_offset.value_or(-1);
        s += fmt::format("{}{{\"group\":{},\"topic\":{},\"partition\":{},\"stored\":{},\"epoch\":{},"
                         "\"kafka_committed\":{},\"log_end\":{},\"lag\":{}}}",
                         i ? "," : "", json_string(g), json_string(r.topic), r.partition, json_number(stored), r.epoch,
                         json_number(v.committed), json_number(v.high),
                         v.high >= 0 && stored >= 0 ? json_number(std::max<std::int64_t>(0, v.high - stored)) : "null");
    }
    out(s + "]");
}

void print_positions_table(const StoredRows& rows, const KafkaViews& kafka)
{
    out(fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>10}", "group", "topic", "partition", "stored", "kafka",
                    "log end", "lag"));
    for (const auto& [g, r] : rows) {
        const KafkaView v = view_of(kafka, g, r.topic, r.partition);
        const std::int64_t stored = r.next_offset.value_or(-1);
        out(fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>10}", g, r.topic, r.partition,
                        number_or_dash(stored), number_or_dash(v.committed), number_or_dash(v.high),
                        v.high >= 0 && stored >= 0 ? std::to_string(std::max<std::int64_t>(0, v.high - stored))
                                                   : std::string("-")));
    }
    if (rows.empty())
        out("no stored positions");
}

} // namespace

int run_offsets(std::vector<std::string> args)
{
    const OffsetsOptions o = parse_offsets_args(std::move(args));
    if (o.help) {
        out(offsets_help);
        return exit_ok;
    }
    redactor().add_conninfo(o.postgres);
    std::unique_ptr<OffsetStore> store;
    try {
        store = std::make_unique<OffsetStore>(o.schema, o.table);
    } catch (const ConfigError& e) {
        throw UsageError(fmt::format("offsets: {}", e.what()));
    }
    std::unique_ptr<pqxx::connection> conn;
    try {
        conn = pg::connect(o.postgres);
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("cannot connect to PostgreSQL: {}", e.what()));
    }
    pqxx::work tx(*conn);
    if (pg::exec_params(tx, "SELECT to_regclass($1) IS NOT NULL", store->qualified_name())[0][0].as<bool>() == false)
        throw DatabaseError(fmt::format("{} does not exist: no consumer runs with offsets_in_database here "
                                        "(or pass --schema/--table)",
                                        store->qualified_name()));
    if (o.action == "set")
        return set_position(tx, *store, o);

    const auto rows = store->read(tx, o.group);
    tx.commit();
    KafkaViews kafka;
    if (!o.brokers.empty() && !rows.empty())
        kafka = kafka_view(o.brokers, rows);
    if (o.json)
        print_positions_json(rows, kafka);
    else
        print_positions_table(rows, kafka);
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
