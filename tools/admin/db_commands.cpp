// migrate, maintain and status: the subcommands that work on the claims table.

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/error.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/retention.hpp>
#include <idemkafka/schema.hpp>
#include <idemkafka/store.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "lag.hpp"
#include "pg/connect.hpp"

namespace idemkafka::detail::admin {
namespace {

constexpr const char* db_options_help = R"(database options:
  --postgres CONNINFO        libpq connection string or URI (default: $IDEMKAFKA_POSTGRES)
  --schema NAME              schema of the claims table (default public)
  --table NAME               the claims table (default processed_event)
)";

constexpr const char* retention_options_help = R"(retention options:
  --retention DURATION       how long claims are kept (default 7d)
  --partition-width DURATION width of one range partition, whole minutes (default 1d)
  --partitions-ahead N       partitions kept ready beyond the current one (default 3)
  --horizon-margin DURATION  dedup horizon = retention - margin (default 1d)
  --now TIME                 act as if it were TIME (YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or @<unix ms>),
                             to rehearse what maintenance will do
)";

constexpr const char* durations_help = R"(
DURATION is a number and a unit: ms, s, m, h, d or w (e.g. 500ms, 36h, 7d).
A password in the connection string is never printed.
)";

struct DbOptions {
    std::string postgres;
    std::string schema = "public";
    std::string table = "processed_event";
    RetentionConfig config;
    std::optional<RetentionMode> mode;
    std::optional<std::chrono::system_clock::time_point> now;
    bool help = false;
    // The optional tables, selected as ConsumerConfig selects them.
    bool offsets = false;
    std::string offsets_table = "consumer_offset";
    bool outbox = false;
    std::optional<std::string> outbox_schema;
    std::string outbox_table = "outbox";
    bool replay_audit = false;
    std::string replay_audit_table = "dead_letter_replay";
};

constexpr const char* table_options_help = R"(tables (the claims table is always included):
  --offsets                  the consumer positions table (ConsumerConfig::offsets_in_database)
  --offsets-table NAME       its name (default consumer_offset; implies --offsets)
  --outbox                   the transactional outbox table (ConsumerConfig::outbox)
  --outbox-table NAME        its name (default outbox; implies --outbox)
  --outbox-schema NAME       its schema (default: --schema)
  --replay-audit             the dead-letter replay audit table (dead-letters replay, serve)
  --replay-audit-table NAME  its name (default dead_letter_replay; implies --replay-audit)
)";

// Consumes one of the table options; false if it is not one.
bool table_option(ArgReader& a, DbOptions& o)
{
    if (a.option("--offsets"))
        o.offsets = true;
    else if (a.option("--offsets-table")) {
        o.offsets = true;
        o.offsets_table = a.value();
    } else if (a.option("--outbox"))
        o.outbox = true;
    else if (a.option("--outbox-table")) {
        o.outbox = true;
        o.outbox_table = a.value();
    } else if (a.option("--outbox-schema")) {
        o.outbox = true;
        o.outbox_schema = a.value();
    } else if (a.option("--replay-audit"))
        o.replay_audit = true;
    else if (a.option("--replay-audit-table")) {
        o.replay_audit = true;
        o.replay_audit_table = a.value();
    } else
        return false;
    return true;
}

// The tables the options select. Configuration errors are usage errors here.
SchemaSpec make_spec(const std::string& command, const DbOptions& o)
{
    SchemaSpec spec;
    spec.schema = o.schema;
    spec.claims_table = o.table;
    spec.retention = o.config;
    if (o.mode)
        spec.retention.mode = *o.mode;
    if (o.offsets)
        spec.offsets_table = o.offsets_table;
    if (o.outbox) {
        spec.outbox_schema = o.outbox_schema ? *o.outbox_schema : o.schema;
        spec.outbox_table = o.outbox_table;
    }
    if (o.replay_audit)
        spec.replay_audit_table = o.replay_audit_table;
    try {
        spec.retention.validate();
        (void)ProcessedEventStore(spec.schema, spec.claims_table);
        if (spec.offsets_table)
            (void)quote_identifier(*spec.offsets_table);
        if (spec.outbox_table)
            (void)Outbox(spec.outbox_schema, *spec.outbox_table);
        if (spec.replay_audit_table)
            (void)quote_identifier(*spec.replay_audit_table);
    } catch (const ConfigError& e) {
        throw UsageError(fmt::format("{}: {}", command, e.what()));
    }
    return spec;
}

// Consumes one option shared by the database subcommands; false if it is not one.
bool db_option(ArgReader& a, DbOptions& o)
{
    if (a.option("--postgres"))
        o.postgres = a.value();
    else if (a.option("--schema"))
        o.schema = a.value();
    else if (a.option("--table"))
        o.table = a.value();
    else if (a.option("--retention"))
        o.config.retention = parse_duration(a.value(), "--retention");
    else if (a.option("--partition-width"))
        o.config.partition_width = parse_duration(a.value(), "--partition-width");
    else if (a.option("--partitions-ahead"))
        o.config.partitions_ahead = static_cast<std::size_t>(parse_count(a.value(), "--partitions-ahead"));
    else if (a.option("--horizon-margin"))
        o.config.horizon_margin = parse_duration(a.value(), "--horizon-margin");
    else if (a.option("--now"))
        o.now = parse_time(a.value(), "--now");
    else if (a.option("--help") || a.option("-h"))
        o.help = true;
    else
        return false;
    return true;
}

// The clock maintenance reads: --now when given, else the system's.
Maintenance::WallClock wall_clock(const DbOptions& o)
{
    if (!o.now)
        return {};
    const auto now = *o.now;
    return [now] { return now; };
}

// The library's log as progress lines: info on stdout, warnings and errors on
// stderr; each maintenance action is logged once, as it happens.
const auto progress = [](LogLevel level, std::string_view line) {
    if (level >= LogLevel::warning)
        err(fmt::format("idemkafka-admin: warning: {}", line));
    else if (level == LogLevel::info)
        out(fmt::format("  {}", line));
};

// Checks the options and builds the Maintenance they describe. Configuration
// errors are usage errors here: they come from the command line.
std::unique_ptr<Maintenance> make_maintenance(const std::string& command, DbOptions& o)
{
    if (o.postgres.empty()) {
        const char* env = std::getenv("IDEMKAFKA_POSTGRES");
        if (!env || !*env)
            throw UsageError(
                fmt::format("{}: no database: pass --postgres CONNINFO or set IDEMKAFKA_POSTGRES", command));
        o.postgres = env;
    }
    redactor().add_conninfo(o.postgres);
    if (o.mode)
        o.config.mode = *o.mode;
    try {
        return std::make_unique<Maintenance>(ProcessedEventStore(o.schema, o.table), o.config, progress, wall_clock(o));
    } catch (const ConfigError& e) {
        throw UsageError(fmt::format("{}: {}", command, e.what()));
    }
}

std::unique_ptr<pqxx::connection> connect(const std::string& conninfo)
{
    try {
        return pg::connect(conninfo);
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("cannot connect to PostgreSQL: {}", e.what()));
    }
}

std::string opt_time(const std::optional<std::chrono::system_clock::time_point>& t)
{
    return t ? format_time(*t) : "-";
}

} // namespace

// ---- migrate ---------------------------------------------------------------

namespace {

constexpr const char* migrate_help = R"(usage: idemkafka-admin migrate [options]

Creates every table idemkafka uses (and their schemas) if missing, or upgrades tables of an
earlier schema version in place (every claim and position kept), and marks each with the schema
version: the claims table always, the offsets and outbox tables when asked for. One transaction;
idempotent: safe to run twice, and from several places at once. Consumers with create_schema =
false check at start-up that these tables exist and have this version.

  --print-sql                print the statements migrate runs on a database without the tables,
                             in order, without connecting: for review, or for a Flyway,
                             Liquibase, sqitch or plain SQL migration (with --now for the
                             initial partitions' dates)
  --from-version N           with --print-sql: print instead the statements that upgrade tables
                             of schema version N (`idemkafka-admin status` shows it) to this one
  --mode partitioned|purge   layout of a new claims table (default partitioned). Given for an
                             existing plain table, `partitioned` converts it: the table becomes
                             the default partition of a new partitioned table (its rows expire
                             there by processed_at). Without --mode an existing table keeps its
                             layout.
  --lock-timeout DURATION    longest wait for each lock on a table (default 5s): a conversion
                             queued behind a long transaction on the claims table would hold up
                             every claim after it. Past it the transaction rolls back and runs
                             again after a pause (1s, doubling; 5 attempts in all)
)";

// --print-sql: the statements, without connecting.
int print_migrate_sql(const SchemaSpec& spec, const DbOptions& o, std::optional<int> from_version)
{
    if (from_version) {
        try {
            out(schema_upgrade_sql(spec, *from_version, migrate_command(spec)));
        } catch (const ConfigError& e) {
            throw UsageError(fmt::format("migrate: --from-version: {}", e.what()));
        }
        return exit_ok;
    }
    std::string cmd = migrate_command(spec);
    if (o.now)
        cmd += " --now " + format_time(*o.now);
    out(schema_sql(spec, o.now ? *o.now : std::chrono::system_clock::now(), cmd));
    return exit_ok;
}

void print_migrated(const SchemaSpec& spec, const ProcessedEventStore& store, const SchemaMigrationReport& r)
{
    out(fmt::format("{} is {} ({}{} partitions created)", store.qualified_name(),
                    r.claims.mode == RetentionMode::partitioned ? "partitioned by event id"
                                                                : "a plain table (purge mode)",
                    r.claims.created     ? "created, "
                    : r.claims.converted ? "converted, "
                                         : "",
                    r.claims.partitions_created.size()));
    if (spec.offsets_table)
        out(fmt::format("{}.{} {}", quote_identifier(spec.schema), quote_identifier(*spec.offsets_table),
                        r.offsets_created ? "created" : "exists"));
    if (spec.outbox_table)
        out(fmt::format("{}.{} {}", quote_identifier(spec.outbox_schema), quote_identifier(*spec.outbox_table),
                        r.outbox_created ? "created" : "exists"));
    if (spec.replay_audit_table)
        out(fmt::format("{}.{} {}", quote_identifier(spec.schema), quote_identifier(*spec.replay_audit_table),
                        r.replay_audit_created ? "created" : "exists"));
    out(fmt::format("schema version {}", schema_version));
}

} // namespace

int run_migrate(std::vector<std::string> args)
{
    ArgReader a("migrate", std::move(args));
    DbOptions o;
    bool print_sql = false;
    std::optional<int> from_version;
    while (a.more()) {
        if (db_option(a, o) || table_option(a, o))
            continue;
        if (a.option("--print-sql")) {
            print_sql = true;
            continue;
        }
        if (a.option("--from-version")) {
            from_version = static_cast<int>(parse_count(a.value(), "--from-version"));
            continue;
        }
        if (a.option("--lock-timeout")) {
            o.config.lock_timeout = parse_duration(a.value(), "--lock-timeout");
            continue;
        }
        if (!a.option("--mode"))
            a.unknown();
        try {
            o.mode = parse_retention_mode(a.value());
        } catch (const ConfigError& e) {
            throw UsageError(std::string("migrate: --") + e.what());
        }
    }
    if (o.help) {
        out(std::string(migrate_help) + table_options_help + db_options_help + retention_options_help + durations_help);
        return exit_ok;
    }
    const SchemaSpec spec = make_spec("migrate", o);
    if (from_version && !print_sql)
        throw UsageError("migrate: --from-version goes with --print-sql (migrate itself reads each table's version)");
    if (print_sql)
        return print_migrate_sql(spec, o, from_version);
    auto m = make_maintenance("migrate", o);
    auto conn = connect(o.postgres);
    out(fmt::format("migrating {} ...", m->store().qualified_name()));
    const auto r = migrate_schema(*conn, spec, o.mode ? Maintenance::Existing::convert : Maintenance::Existing::keep,
                                  progress, wall_clock(o));
    print_migrated(spec, m->store(), r);
    return exit_ok;
}

// ---- maintain --------------------------------------------------------------

int run_maintain(std::vector<std::string> args)
{
    ArgReader a("maintain", std::move(args));
    DbOptions o;
    bool dry_run = false;
    std::vector<std::string> forget;
    while (a.more()) {
        if (db_option(a, o))
            continue;
        if (a.option("--dry-run"))
            dry_run = true;
        else if (a.option("--forget-group"))
            forget.push_back(a.value());
        else if (a.option("--purge-batch"))
            o.config.purge_batch = static_cast<std::size_t>(parse_count(a.value(), "--purge-batch"));
        else if (a.option("--purge-pause"))
            o.config.purge_pause = parse_duration(a.value(), "--purge-pause");
        else if (a.option("--purge-max-batches"))
            o.config.purge_max_batches = static_cast<std::size_t>(parse_count(a.value(), "--purge-max-batches"));
        else if (a.option("--max-move-rows"))
            o.config.max_move_rows = static_cast<std::size_t>(parse_count(a.value(), "--max-move-rows"));
        else if (a.option("--lock-timeout"))
            o.config.lock_timeout = parse_duration(a.value(), "--lock-timeout");
        else
            a.unknown();
    }
    if (o.help) {
        out(std::string(R"(usage: idemkafka-admin maintain [options]

One maintenance run on the claims table, as the consumers' maintenance thread does it. A partitioned
table: creates the partitions from now - retention to --partitions-ahead ahead, drops partitions
whose every event id is older than the retention, purges the default partition by processed_at.
A plain table: deletes claims processed longer than the retention ago, in small batches.
Only one session maintains a table at a time; if another one is at it, nothing is done.

  --dry-run                  show what would be done, change nothing
  --purge-batch N            rows per DELETE (default 5000)
  --purge-pause DURATION     pause between batches (default 50ms)
  --purge-max-batches N      most batches in this run (default 2000)
  --max-move-rows N          largest number of rows moved out of the default partition to create
                             a partition over them (default 100000)
  --lock-timeout DURATION    lock_timeout of each statement (default 5s)
  --forget-group GROUP       first remove GROUP (retired for good) from the table's retention
                             registry; repeatable. Claims are kept for the longest retention of
                             this run and every registered group
)") + db_options_help +
            retention_options_help + durations_help);
        return exit_ok;
    }
    auto m = make_maintenance("maintain", o);
    auto conn = connect(o.postgres);
    for (const auto& g : forget) {
        if (dry_run)
            out(fmt::format("would remove group {} from the retention registry", g));
        else
            out(fmt::format(m->forget_group(*conn, g) ? "removed group {} from the retention registry"
                                                      : "group {} was not in the retention registry",
                            g));
    }
    out(fmt::format("maintaining {}{} (retention {}, now {}) ...", m->store().qualified_name(),
                    dry_run ? " [dry run]" : "", format_duration(o.config.retention),
                    format_time(o.now ? *o.now : std::chrono::system_clock::now())));
    const auto r = m->run_once(*conn, dry_run);
    if (!r.acted)
        return exit_ok;
    if (!r.retention_group.empty())
        out(fmt::format("claims kept for {}: the retention group {} registered", format_duration(r.retention),
                        r.retention_group));
    out(fmt::format("{}: {} partitions {}, {} {}, {} rows {}{}", dry_run ? "dry run" : "done",
                    r.partitions_created.size(), dry_run ? "to create" : "created", r.partitions_dropped.size(),
                    dry_run ? "to drop" : "dropped", r.rows_purged, dry_run ? "to purge" : "purged",
                    r.purge_incomplete ? " (more remain for the next run)" : ""));
    return exit_ok;
}

// ---- status ----------------------------------------------------------------

namespace {

constexpr const char* status_help = R"(usage: idemkafka-admin status [options]

Claims per consumer group, the partitions with the creation-time ranges of the event ids they hold,
the oldest and newest claim, and the effective dedup horizon. Counts are exact (the table is scanned).

When consumers keep their positions in PostgreSQL (offsets_in_database), the stored positions
follow, next to Kafka's committed offsets and the lag (see `idemkafka-admin offsets`).

It starts with the schema check a consumer with create_schema = false makes at start-up: each
table (the offsets and outbox tables with --offsets / --outbox), its schema version and what it
lacks, and the `idemkafka-admin migrate` command that fixes it. Exit status 1 when a table is
missing or lacks something.

  --json                     one JSON object instead of the tables
  --brokers HOST:PORT        Kafka, for the committed offsets and lag (default: $IDEMKAFKA_BROKERS)
  --lag                      each group's lag per partition in Kafka: committed offset, log end,
                             records behind and seconds behind (the first unconsumed record's
                             timestamp against now), for the topics Kafka lists offsets of
  --lag-topic NAME           the same for this topic (repeatable; implies --lag)
)";

// What status found, for the JSON and the text forms.
struct StatusReport {
    const DbOptions& o;
    const SchemaSpec& spec;
    const Maintenance& m;
    const std::vector<TableCheck>& checks;
    bool schema_ok;
    const RetentionStatus& s;
};

std::string json_checks(const std::vector<TableCheck>& checks)
{
    std::string j;
    for (std::size_t i = 0; i < checks.size(); ++i) {
        const auto& c = checks[i];
        std::string problems;
        for (std::size_t k = 0; k < c.problems.size(); ++k)
            problems += (k ? "," : "") + json_string(c.problems[k]);
        j += fmt::format("{}{{\"kind\":{},\"table\":{},\"exists\":{},\"version\":{},\"problems\":[{}]}}", i ? "," : "",
                         json_string(c.kind), json_string(c.qualified), c.exists ? "true" : "false",
                         c.version ? std::to_string(*c.version) : "null", problems);
    }
    return j;
}

// The members of the JSON arrays of groups and partitions.
std::string json_groups(const RetentionStatus& s)
{
    std::string j;
    for (std::size_t i = 0; i < s.groups.size(); ++i) {
        const auto& g = s.groups[i];
        j +=
            fmt::format("{}{{\"consumer_group\":{},\"rows\":{},\"oldest_claim\":{},\"newest_claim\":{}}}", i ? "," : "",
                        json_string(g.consumer_group), g.rows, json_time(g.oldest_claim), json_time(g.newest_claim));
    }
    return j;
}

std::string json_registered(const RetentionStatus& s)
{
    std::string j;
    for (std::size_t i = 0; i < s.registered.size(); ++i) {
        const auto& g = s.registered[i];
        j += fmt::format("{}{{\"consumer_group\":{},\"retention_ms\":{},\"registered_at\":{},\"registered_by\":{}}}",
                         i ? "," : "", json_string(g.consumer_group), g.retention.count(),
                         json_time(std::optional<std::chrono::system_clock::time_point>(g.registered_at)),
                         json_string(g.registered_by));
    }
    return j;
}

std::string json_partitions(const RetentionStatus& s)
{
    std::string j;
    for (std::size_t i = 0; i < s.partitions.size(); ++i) {
        const auto& p = s.partitions[i];
        j += fmt::format("{}{{\"name\":{},\"default\":{},\"from\":{},\"to\":{},\"bound\":{},\"rows\":{}}}",
                         i ? "," : "", json_string(p.name), p.is_default ? "true" : "false", json_time(p.from),
                         json_time(p.to), json_string(p.bound), p.rows);
    }
    return j;
}

// --json: one object.
std::string status_json(const StatusReport& r)
{
    const auto& s = r.s;
    const auto& cfg = r.m.config();
    std::string j = "{";
    j += fmt::format("\"table\":{},\"schema\":{},\"name\":{},\"exists\":{}", json_string(r.m.store().qualified_name()),
                     json_string(r.o.schema), json_string(r.o.table), s.exists ? "true" : "false");
    j += fmt::format(",\"schema_version\":{},\"schema_ok\":{},\"migrate_command\":{},\"tables\":[", schema_version,
                     r.schema_ok ? "true" : "false", json_string(migrate_command(r.spec)));
    j += json_checks(r.checks);
    j += "]";
    j += fmt::format(",\"mode\":{},\"rows\":{},\"oldest_claim\":{},\"newest_claim\":{}",
                     s.exists ? json_string(to_string(s.mode)) : "null", s.rows, json_time(s.oldest_claim),
                     json_time(s.newest_claim));
    j += fmt::format(",\"now\":{},\"retention_ms\":{},\"horizon_margin_ms\":{},\"dedup_horizon_ms\":{},"
                     "\"horizon_cutoff\":{},\"partitions_from\":{},\"partitions_to\":{}",
                     json_time(s.now), cfg.retention.count(), cfg.horizon_margin.count(), s.dedup_horizon.count(),
                     json_time(s.horizon_cutoff), json_time(s.partitions_from), json_time(s.partitions_to));
    j += ",\"groups\":[";
    j += json_groups(s);
    j += "],\"registered\":[";
    j += json_registered(s);
    j += "],\"partitions\":[";
    j += json_partitions(s);
    j += "]}";
    return j;
}

void print_schema_checks(const std::vector<TableCheck>& checks)
{
    out(fmt::format("schema        version {} expected by this library", schema_version));
    for (const auto& c : checks)
        out(fmt::format(
            "  {:<8} {}: {}{}", c.kind, c.qualified,
            c.version ? fmt::format("version {}", *c.version) : std::string(c.exists ? "no version mark" : "missing"),
            c.ok() ? ", ok" : ", " + [&c] {
                std::string all;
                for (const auto& p : c.problems)
                    all += (all.empty() ? "" : "; ") + p;
                return all;
            }()));
}

// The claims table, its claims and horizon, and the claims per group.
void print_claims(const StatusReport& r)
{
    const auto& s = r.s;
    const auto& cfg = r.m.config();
    out(fmt::format("table         {} ({})", r.m.store().qualified_name(),
                    s.mode == RetentionMode::partitioned ? "partitioned by event id" : "plain, purge mode"));
    out(fmt::format("claims        {}", s.rows));
    out(fmt::format("oldest claim  {}", opt_time(s.oldest_claim)));
    out(fmt::format("newest claim  {}", opt_time(s.newest_claim)));
    out(fmt::format("dedup horizon {} (retention {} - margin {}): events created before {} are beyond it",
                    format_duration(s.dedup_horizon), format_duration(cfg.retention),
                    format_duration(cfg.horizon_margin), format_time(s.horizon_cutoff)));
    if (s.mode == RetentionMode::partitioned)
        out(fmt::format("partitions    ids created {} .. {}", opt_time(s.partitions_from), opt_time(s.partitions_to)));
    out("");
    std::size_t w = 14;
    for (const auto& g : s.groups)
        w = std::max(w, g.consumer_group.size());
    out(fmt::format("{:<{}}  {:>12}  {:<24}  {:<24}", "consumer group", w, "claims", "oldest claim", "newest claim"));
    for (const auto& g : s.groups)
        out(fmt::format("{:<{}}  {:>12}  {:<24}  {:<24}", g.consumer_group, w, g.rows, opt_time(g.oldest_claim),
                        opt_time(g.newest_claim)));
    if (s.groups.empty())
        out("(no claims)");
    out("");
    out(fmt::format("{:<{}}  {:>12}  {:<24}  {}", "registered", w, "retention", "registered at", "by"));
    for (const auto& g : s.registered)
        out(fmt::format("{:<{}}  {:>12}  {:<24}  {}", g.consumer_group, w, format_duration(g.retention),
                        format_time(g.registered_at), g.registered_by));
    if (s.registered.empty())
        out("(no group registered its retention; maintenance keeps claims for its own)");
}

void print_partitions(const RetentionStatus& s)
{
    out("");
    std::size_t pw = 9;
    for (const auto& p : s.partitions)
        pw = std::max(pw, p.name.size());
    out(fmt::format("{:<{}}  {:<24}  {:<24}  {:>12}", "partition", pw, "ids created from", "to", "rows"));
    for (const auto& p : s.partitions) {
        if (p.is_default)
            out(fmt::format("{:<{}}  {:<50}  {:>12}", p.name, pw, "(default: everything else)", p.rows));
        else if (p.from || p.to)
            out(fmt::format("{:<{}}  {:<24}  {:<24}  {:>12}", p.name, pw, p.from ? format_time(*p.from) : "MINVALUE",
                            p.to ? format_time(*p.to) : "MAXVALUE", p.rows));
        else
            out(fmt::format("{:<{}}  {:<50}  {:>12}", p.name, pw, p.bound, p.rows));
    }
}

} // namespace

std::string status_json_of(const std::string& postgres, const std::string& schema, const std::string& table,
                           const std::optional<std::string>& replay_audit_table)
{
    DbOptions o;
    o.postgres = postgres;
    o.schema = schema;
    o.table = table;
    if (replay_audit_table) {
        o.replay_audit = true;
        o.replay_audit_table = *replay_audit_table;
    }
    const SchemaSpec spec = make_spec("status", o);
    auto m = make_maintenance("status", o);
    auto conn = connect(o.postgres);
    const auto checks = check_schema(*conn, spec);
    const bool schema_ok = std::all_of(checks.begin(), checks.end(), [](const TableCheck& c) { return c.ok(); });
    const auto s = m->status(*conn);
    return status_json(StatusReport{o, spec, *m, checks, schema_ok, s});
}

int run_status(std::vector<std::string> args)
{
    ArgReader a("status", std::move(args));
    DbOptions o;
    bool json = false, lag = false;
    std::string brokers;
    std::vector<std::string> lag_topics;
    while (a.more()) {
        if (db_option(a, o) || table_option(a, o))
            continue;
        if (a.option("--json"))
            json = true;
        else if (a.option("--brokers"))
            brokers = a.value();
        else if (a.option("--lag"))
            lag = true;
        else if (a.option("--lag-topic")) {
            lag = true;
            lag_topics.push_back(a.value());
        } else
            a.unknown();
    }
    if (o.help) {
        out(std::string(status_help) + table_options_help + db_options_help + retention_options_help + durations_help);
        return exit_ok;
    }
    const SchemaSpec spec = make_spec("status", o);
    auto m = make_maintenance("status", o);
    auto conn = connect(o.postgres);
    const auto checks = check_schema(*conn, spec);
    const bool schema_ok = std::all_of(checks.begin(), checks.end(), [](const TableCheck& c) { return c.ok(); });
    const auto s = m->status(*conn);
    const StatusReport report{o, spec, *m, checks, schema_ok, s};
    if (lag && brokers.empty() && std::getenv("IDEMKAFKA_BROKERS"))
        brokers = std::getenv("IDEMKAFKA_BROKERS");
    if (lag && brokers.empty())
        throw UsageError("status: --lag needs Kafka: pass --brokers SERVERS or set IDEMKAFKA_BROKERS");
    std::vector<PartitionLag> lags;
    if (lag) {
        std::vector<std::string> groups;
        for (const auto& g : s.groups)
            groups.push_back(g.consumer_group);
        lags = partition_lag(brokers, {}, groups, lag_topics, std::chrono::seconds(10));
    }
    if (json) {
        std::string j = status_json(report);
        if (lag)
            j.insert(j.size() - 1, ",\"lag\":" + lag_json(lags).dump());
        out(j);
        return s.exists && schema_ok ? exit_ok : exit_failure;
    }
    print_schema_checks(checks);
    if (!s.exists) {
        err(fmt::format("idemkafka-admin: error: {} does not exist; run `idemkafka-admin migrate` first: `{}`",
                        m->store().qualified_name(), migrate_command(spec)));
        return exit_failure;
    }
    if (!schema_ok)
        err(fmt::format("idemkafka-admin: error: the schema is not ready for idemkafka; fix it with `{}`",
                        migrate_command(spec)));
    print_claims(report);
    print_stored_positions(o.postgres, o.schema, brokers);
    if (lag) {
        out("");
        out("lag per partition of the groups with claims (records and seconds behind)");
        for (const auto& line : lag_lines(lags))
            out(line);
    }
    if (s.mode != RetentionMode::partitioned)
        return schema_ok ? exit_ok : exit_failure;
    print_partitions(s);
    return schema_ok ? exit_ok : exit_failure;
}

} // namespace idemkafka::detail::admin
