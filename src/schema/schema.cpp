#include "idemkafka/schema.hpp"

#include <algorithm>
#include <ctime>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/duration_text.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/store.hpp"
#include "observe/log_context.hpp"
#include "pg/bounds.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"
#include "schema/ddl.hpp"
#include "schema/migration.hpp"

namespace idemkafka {

// ---- the DDL -------------------------------------------------------------------

namespace detail::ddl {

std::string create_schema(const std::string& schema_q)
{
    return fmt::format("CREATE SCHEMA IF NOT EXISTS {}", schema_q);
}

std::string begin_schema_change(std::chrono::milliseconds bound)
{
    return std::string(schema_lock) + "; " + pg::bound_transaction(bound);
}

std::string claim_columns()
{
    // payload_fingerprint last: where an upgrade added it.
    return "event_id uuid NOT NULL,"
           " consumer_group text NOT NULL,"
           " processed_at timestamptz NOT NULL DEFAULT now(),"
           " payload_fingerprint bigint,"
           " PRIMARY KEY (event_id, consumer_group)";
}

std::string claims_default_partition(const std::string& schema, const std::string& table)
{
    return fmt::format("CREATE TABLE {}.{} PARTITION OF {}.{} DEFAULT", quote_identifier(schema),
                       quote_identifier(default_partition_name(table)), quote_identifier(schema),
                       quote_identifier(table));
}

std::string processed_at_index(const std::string& index_name, const std::string& target)
{
    return fmt::format("CREATE INDEX {} ON {} (processed_at)", quote_identifier(index_name), target);
}

std::vector<std::string> claims_table(const std::string& schema, const std::string& table, RetentionMode mode)
{
    const std::string q = quote_identifier(schema) + "." + quote_identifier(table);
    std::vector<std::string> out;
    if (mode == RetentionMode::partitioned) {
        out.push_back(fmt::format("CREATE TABLE {} ({}) PARTITION BY RANGE (event_id)", q, claim_columns()));
        out.push_back(claims_default_partition(schema, table));
        // The default partition is purged by processed_at like a plain table.
        out.push_back(
            processed_at_index(default_index_name(table),
                               quote_identifier(schema) + "." + quote_identifier(default_partition_name(table))));
    } else {
        out.push_back(fmt::format("CREATE TABLE {} ({})", q, claim_columns()));
        // The purge finds its batches through it instead of scanning the table once per batch.
        out.push_back(processed_at_index(plain_index_name(table), q));
    }
    out.push_back(version_comment(q, claims_kind));
    return out;
}

std::string claims_partition_table(const std::string& partition_q)
{
    return fmt::format("CREATE TABLE {} ({})", partition_q, claim_columns());
}

std::string claims_attach(const std::string& parent_q, const std::string& partition_q, const EventId& lo,
                          const EventId& hi)
{
    return fmt::format("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ('{}') TO ('{}')", parent_q, partition_q,
                       lo.to_string(), hi.to_string());
}

std::vector<std::string> offsets_table(const std::string& qualified)
{
    return {fmt::format("CREATE TABLE {} ("
                        " consumer_group text NOT NULL,"
                        " topic text NOT NULL,"
                        " partition integer NOT NULL,"
                        " next_offset bigint,"
                        " epoch bigint NOT NULL DEFAULT 0,"
                        " updated_at timestamptz NOT NULL DEFAULT now(),"
                        " PRIMARY KEY (consumer_group, topic, partition))",
                        qualified),
            version_comment(qualified, offsets_kind)};
}

std::vector<std::string> outbox_table(const std::string& qualified)
{
    // Table and indexes are created together, so an existing table has its
    // indexes, and PostgreSQL picks index names that fit its 63-byte limit.
    return {fmt::format("CREATE TABLE {} ("
                        " id bigserial PRIMARY KEY,"
                        " event_id uuid NOT NULL,"
                        " topic text NOT NULL,"
                        " key bytea,"
                        " payload bytea NOT NULL,"
                        " headers bytea,"
                        " created_at timestamptz NOT NULL DEFAULT now(),"
                        " sent_at timestamptz,"
                        " UNIQUE (event_id, topic))",
                        qualified),
            // What the relay reads: small, because sent rows leave it.
            fmt::format("CREATE INDEX ON {} (id) WHERE sent_at IS NULL", qualified),
            // What the purge reads.
            fmt::format("CREATE INDEX ON {} (sent_at) WHERE sent_at IS NOT NULL", qualified),
            version_comment(qualified, outbox_kind)};
}

std::vector<std::string> replay_audit_table(const std::string& qualified)
{
    // One row per replay; its records (coordinates and the outcome of each
    // publish) in one jsonb array, read back by the next replay of the topic.
    return {fmt::format("CREATE TABLE {} ("
                        " id bigserial PRIMARY KEY,"
                        " dead_letter_topic text NOT NULL,"
                        " requested_by text NOT NULL,"
                        " tool text NOT NULL,"
                        " filter jsonb NOT NULL,"
                        " again boolean NOT NULL,"
                        " rate_per_second double precision NOT NULL,"
                        " started_at timestamptz NOT NULL DEFAULT now(),"
                        " finished_at timestamptz,"
                        " matched integer NOT NULL,"
                        " published integer NOT NULL DEFAULT 0,"
                        " failed integer NOT NULL DEFAULT 0,"
                        " skipped integer NOT NULL DEFAULT 0,"
                        " outcome text NOT NULL DEFAULT 'running',"
                        " records jsonb NOT NULL)",
                        qualified),
            fmt::format("CREATE INDEX ON {} (dead_letter_topic, id)", qualified),
            version_comment(qualified, replay_audit_kind)};
}

std::vector<std::string> retention_table(const std::string& qualified, bool if_not_exists)
{
    return {fmt::format("CREATE TABLE {}{} (consumer_group text PRIMARY KEY,"
                        " retention_ms bigint NOT NULL CHECK (retention_ms > 0),"
                        " registered_at timestamptz NOT NULL DEFAULT now(),"
                        " registered_by text NOT NULL DEFAULT current_user)",
                        if_not_exists ? "IF NOT EXISTS " : "", qualified),
            version_comment(qualified, retention_kind)};
}

std::vector<std::string> upgrade_statements(std::string_view kind, const std::string& qualified, int to)
{
    // One case per schema version after the first, appended when a release
    // changes a table; a released case never changes again (tables in the
    // field were upgraded by it). Each statement is safe to run on a table
    // that already has what it adds: a table without a version comment is
    // taken for the oldest layout.
    switch (to) {
    case 2:
        // The payload fingerprint (ConsumerConfig::payload_fingerprint).
        // Nullable without a default: a change of the catalog only, instant on
        // a table of any size, and a partitioned table passes it to every
        // partition. Claims from before have none: their redeliveries stay
        // plain duplicates.
        if (kind == claims_kind)
            return {fmt::format("ALTER TABLE {} ADD COLUMN IF NOT EXISTS payload_fingerprint bigint", qualified)};
        return {};
    default:
        return {};
    }
}

std::string version_comment(const std::string& qualified, std::string_view kind)
{
    return fmt::format("COMMENT ON TABLE {} IS 'idemkafka {} table, schema version {}'", qualified, kind,
                       schema_version);
}

} // namespace detail::ddl

std::string detail::duration_text(std::chrono::milliseconds d)
{
    const std::int64_t ms = d.count();
    const std::pair<std::int64_t, const char*> units[] = {{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}};
    for (const auto& [scale, name] : units)
        if (ms != 0 && ms % scale == 0)
            return fmt::format("{}{}", ms / scale, name);
    return fmt::format("{}ms", ms);
}

// ---- spec ------------------------------------------------------------------------

SchemaSpec SchemaSpec::of(const ConsumerConfig& config)
{
    SchemaSpec s;
    s.schema = config.schema;
    s.claims_table = config.table;
    s.retention = config.retention;
    if (config.offsets_in_database)
        s.offsets_table = config.offsets_table;
    if (config.outbox) {
        s.outbox_schema = config.outbox->schema;
        s.outbox_table = config.outbox->table;
    }
    return s;
}

namespace {

using detail::duration_text;

std::string qualify(const std::string& schema, const std::string& table)
{
    return quote_identifier(schema) + "." + quote_identifier(table);
}

// A word the shell takes as it is, or the word in single quotes.
std::string shell_word(const std::string& s)
{
    const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
               c == '-' || c == '/' || c == ':';
    });
    if (plain)
        return s;
    std::string q = "'";
    for (char c : s) {
        if (c == '\'')
            q += "'\\''";
        else
            q.push_back(c);
    }
    return q + "'";
}

std::string iso_minute(std::int64_t unix_ms)
{
    const auto secs = static_cast<std::time_t>(unix_ms / 1000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%MZ", &tm);
    return buf;
}

// One expected column: name and format_type() text.
struct Column {
    const char* name;
    const char* type;
};

struct Expected {
    std::vector<Column> columns;
    std::string primary_key;              // sorted column names, comma-separated
    std::vector<std::string> unique_keys; // same form
};

// The layout of a table of `kind` at schema version `version`.
Expected expected(std::string_view kind, int version)
{
    if (kind == detail::ddl::claims_kind) {
        Expected e{{{"event_id", "uuid"}, {"consumer_group", "text"}, {"processed_at", "timestamp with time zone"}},
                   "consumer_group,event_id",
                   {}};
        if (version >= 2)
            e.columns.push_back({"payload_fingerprint", "bigint"});
        return e;
    }
    if (kind == detail::ddl::retention_kind)
        return {{{"consumer_group", "text"},
                 {"retention_ms", "bigint"},
                 {"registered_at", "timestamp with time zone"},
                 {"registered_by", "text"}},
                "consumer_group",
                {}};
    if (kind == detail::ddl::replay_audit_kind)
        return {{{"id", "bigint"},
                 {"dead_letter_topic", "text"},
                 {"requested_by", "text"},
                 {"tool", "text"},
                 {"filter", "jsonb"},
                 {"again", "boolean"},
                 {"rate_per_second", "double precision"},
                 {"started_at", "timestamp with time zone"},
                 {"finished_at", "timestamp with time zone"},
                 {"matched", "integer"},
                 {"published", "integer"},
                 {"failed", "integer"},
                 {"skipped", "integer"},
                 {"outcome", "text"},
                 {"records", "jsonb"}},
                "id",
                {}};
    if (kind == detail::ddl::offsets_kind)
        return {{{"consumer_group", "text"},
                 {"topic", "text"},
                 {"partition", "integer"},
                 {"next_offset", "bigint"},
                 {"epoch", "bigint"},
                 {"updated_at", "timestamp with time zone"}},
                "consumer_group,partition,topic",
                {}};
    return {{{"id", "bigint"},
             {"event_id", "uuid"},
             {"topic", "text"},
             {"key", "bytea"},
             {"payload", "bytea"},
             {"headers", "bytea"},
             {"created_at", "timestamp with time zone"},
             {"sent_at", "timestamp with time zone"}},
            "id",
            {"event_id,topic"}};
}

std::optional<int> parse_version(const std::string& comment)
{
    constexpr std::string_view marker = "schema version ";
    const auto at = comment.find(marker);
    if (comment.rfind("idemkafka ", 0) != 0 || at == std::string::npos)
        return std::nullopt;
    int v = 0;
    std::size_t i = at + marker.size();
    if (i >= comment.size() || comment[i] < '0' || comment[i] > '9')
        return std::nullopt;
    for (; i < comment.size() && comment[i] >= '0' && comment[i] <= '9' && v < 100000; ++i)
        v = v * 10 + (comment[i] - '0');
    return v;
}

std::string newer_problem(int version)
{
    return fmt::format("has schema version {}, newer than this library understands (version {}): a newer idemkafka "
                       "upgraded it; run that release or a later one",
                       version, schema_version);
}

// Adds to `problems` the columns of `want` that the table `oid` lacks or
// types otherwise.
void check_columns(pqxx::transaction_base& tx, std::int64_t oid, const Expected& want,
                   std::vector<std::string>& problems)
{
    const auto cols = detail::pg::exec_params(tx,
                                              "SELECT attname::text, format_type(atttypid, atttypmod) FROM "
                                              "pg_attribute WHERE attrelid = $1::bigint::oid AND attnum > 0 AND NOT "
                                              "attisdropped",
                                              oid);
    for (const auto& col : want.columns) {
        std::optional<std::string> type;
        for (const auto& row : cols)
            if (row[0].as<std::string>() == col.name)
                type = row[1].as<std::string>();
        if (!type)
            problems.push_back(fmt::format("has no column {} ({})", col.name, col.type));
        else if (*type != col.type)
            problems.push_back(fmt::format("column {} is {}, expected {}", col.name, *type, col.type));
    }
}

// Adds to `problems` the primary and unique keys of `want` that the table
// `oid` lacks.
void check_keys(pqxx::transaction_base& tx, std::int64_t oid, const Expected& want, std::vector<std::string>& problems)
{
    const auto keys = detail::pg::exec_params(
        tx,
        "SELECT i.indisprimary, array_to_string(ARRAY(SELECT a.attname::text FROM unnest(i.indkey) k JOIN "
        "pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k ORDER BY 1), ',') FROM pg_index i "
        "WHERE i.indrelid = $1::bigint::oid AND i.indisunique AND i.indpred IS NULL",
        oid);
    bool pk = false;
    for (const auto& row : keys)
        if (row[0].as<bool>() && row[1].as<std::string>() == want.primary_key)
            pk = true;
    if (!pk)
        problems.push_back(fmt::format("has no primary key ({})", want.primary_key));
    for (const auto& u : want.unique_keys) {
        bool found = false;
        for (const auto& row : keys)
            if (row[1].as<std::string>() == u)
                found = true;
        if (!found)
            problems.push_back(fmt::format("has no unique key ({})", u));
    }
}

// What the table of `kind` looks like: whether it exists, its version, its
// layout, and what it lacks for the layout of schema version `layout` (its
// own version when `layout` is 0; the current one for a table without a
// version). A newer table's layout is not judged: only a newer library can.
TableCheck inspect_table(pqxx::transaction_base& tx, std::string_view kind, const std::string& schema,
                         const std::string& table, int layout = 0)
{
    TableCheck c;
    c.kind = std::string(kind);
    c.qualified = qualify(schema, table);
    // By name through the catalog: no privilege on the schema or table needed.
    const auto rel = detail::pg::exec_params(
        tx,
        "SELECT c.oid::bigint, c.relkind::text, coalesce(pg_get_partkeydef(c.oid), ''), "
        "coalesce(obj_description(c.oid, 'pg_class'), '') FROM pg_class c JOIN pg_namespace n ON n.oid = "
        "c.relnamespace WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
        schema, table);
    if (rel.empty()) {
        c.problems.push_back("does not exist");
        return c;
    }
    c.exists = true;
    const auto oid = rel[0][0].as<std::int64_t>();
    const bool partitioned = rel[0][1].as<std::string>() == "p";
    c.mode = partitioned ? RetentionMode::partitioned : RetentionMode::purge;
    c.version = parse_version(rel[0][3].as<std::string>());
    if (c.version && *c.version > schema_version) {
        c.problems.push_back(newer_problem(*c.version));
        return c;
    }
    if (layout == 0)
        layout = c.version.value_or(schema_version);
    if (partitioned && (kind != detail::ddl::claims_kind || rel[0][2].as<std::string>() != "RANGE (event_id)"))
        c.problems.push_back(
            fmt::format("is partitioned by {}, not as the library creates it", rel[0][2].as<std::string>()));
    const Expected want = expected(kind, layout);
    check_columns(tx, oid, want, c.problems);
    check_keys(tx, oid, want, c.problems);
    return c;
}

// What a consumer that may not change the schema sees: every problem, an
// older version included.
TableCheck check_table(pqxx::transaction_base& tx, std::string_view kind, const std::string& schema,
                       const std::string& table)
{
    TableCheck c = inspect_table(tx, kind, schema, table);
    if (c.version && *c.version < schema_version)
        c.problems.push_back(fmt::format("has schema version {}, this library needs version {}; upgrade it in place",
                                         *c.version, schema_version));
    return c;
}

} // namespace

std::optional<int> detail::schema_version_of(pqxx::transaction_base& tx, const std::string& schema,
                                             const std::string& table)
{
    const auto r = detail::pg::exec_params(
        tx,
        "SELECT coalesce(obj_description(c.oid, 'pg_class'), '') FROM pg_class c JOIN pg_namespace n ON n.oid = "
        "c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
        schema, table);
    return r.empty() ? std::nullopt : parse_version(r[0][0].as<std::string>());
}

bool detail::upgrade_table(pqxx::work& tx, std::string_view kind, const std::string& schema, const std::string& table)
{
    // Unversioned: from before schema versions, or made by hand; the oldest
    // layout is the least it must have, and every step tolerates more.
    const TableCheck c = inspect_table(tx, kind, schema, table, 1);
    if (!c.exists)
        return false;
    const int from = c.version.value_or(1);
    if (c.version == schema_version)
        return false;
    if (!c.ok())
        throw ConfigError(fmt::format("the {} table {} {}; it is not changed automatically", kind, c.qualified,
                                      fmt::join(c.problems, "; ")));
    // An upgrade step may lock the table: its wait is bounded by the
    // transaction's lock_timeout (ddl::begin_schema_change()).
    for (int to = from + 1; to <= schema_version; ++to)
        for (const auto& sql : ddl::upgrade_statements(kind, c.qualified, to))
            tx.exec(sql);
    tx.exec(ddl::version_comment(c.qualified, kind));
    return true;
}

namespace {
constexpr int lock_attempts = 5; // of with_lock_retries()
} // namespace

void detail::with_lock_retries(const LogSink& log, std::string_view what, std::chrono::milliseconds lock_timeout,
                               const std::function<void()>& attempt)
{
    auto pause = std::chrono::milliseconds(1000);
    for (int n = 1;; ++n) {
        try {
            attempt();
            return;
        } catch (const pqxx::sql_error& e) {
            if (!pg::is_lock_timeout(e))
                throw;
            if (n == lock_attempts)
                throw DatabaseError(fmt::format(
                    "{}: a table stayed locked by another transaction for longer than lock_timeout ({}) in {} "
                    "attempts, each rolled back; run it again once that transaction has ended (pg_locks and "
                    "pg_stat_activity show it), or with a longer lock_timeout: {}",
                    what, duration_text(lock_timeout), lock_attempts, e.what()));
            detail::emit(log, LogLevel::warning,
                         fmt::format("{}: a table is locked by another transaction: waited lock_timeout ({}) and "
                                     "rolled back; the claims queued behind go on; attempt {} of {} in {} ms",
                                     what, duration_text(lock_timeout), n + 1, lock_attempts, pause.count()),
                         "schema");
            std::this_thread::sleep_for(pause);
            pause *= 2;
        }
    }
}

// ---- print-sql ---------------------------------------------------------------------

std::string schema_sql(const SchemaSpec& spec, std::chrono::system_clock::time_point now, const std::string& command)
{
    spec.retention.validate();
    const ProcessedEventStore store(spec.schema, spec.claims_table);
    const std::string& t = store.qualified_name();
    std::string out;
    auto stmt = [&out](const std::string& sql) { out += sql + ";\n"; };
    out += fmt::format("-- idemkafka schema version {}, for PostgreSQL {} or later.\n", schema_version,
                       schema_min_postgres);
    if (!command.empty())
        out += fmt::format("-- The statements `{}` runs on a database without these tables, in its order.\n", command);
    out += "-- migrate itself runs them under pg_advisory_xact_lock(hashtext('idemkafka.schema')) so that\n"
           "-- concurrent runs wait for each other; apply this file once, in one transaction\n"
           "-- (Flyway and Liquibase do; with psql: psql -1 -v ON_ERROR_STOP=1 -f FILE).\n"
           "-- Run it as the role that should own the tables; the runtime role needs only the\n"
           "-- privileges listed in docs/operations.md (\"Least privilege\"). Tables of an earlier schema\n"
           "-- version are upgraded, not created: `idemkafka-admin migrate --print-sql --from-version N`.\n\n";
    out += fmt::format("-- Claims table ({}).\n", to_string(spec.retention.mode));
    stmt(detail::ddl::create_schema(store.quoted_schema()));
    for (const auto& sql : detail::ddl::claims_table(store.schema(), store.table(), spec.retention.mode))
        stmt(sql);
    out += "\n-- Its retention registry: each consumer group's retention (maintenance keeps the longest).\n";
    for (const auto& sql :
         detail::ddl::retention_table(qualify(store.schema(), retention_registry_name(store.table()))))
        stmt(sql);
    if (spec.retention.mode == RetentionMode::partitioned) {
        const auto ranges = detail::ddl::partition_ranges(
            spec.retention, std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
        out += fmt::format(
            "\n-- Initial range partitions, for event ids created from now - retention ({}) to {} partitions\n"
            "-- of {} ahead, as of {}. They run out: `idemkafka-admin maintain` (from cron or a\n"
            "-- Kubernetes CronJob) or the consumers' own maintenance (RetentionConfig::maintenance) must\n"
            "-- keep creating partitions ahead and dropping expired ones. Ids beyond the last partition\n"
            "-- land in the default partition and stay deduplicated there.\n",
            duration_text(spec.retention.retention), spec.retention.partitions_ahead,
            duration_text(spec.retention.partition_width),
            iso_minute(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count()));
        for (const auto& [lo, hi] : ranges) {
            const std::string p = qualify(store.schema(), partition_name(store.table(), lo));
            stmt(detail::ddl::claims_partition_table(p));
            stmt(detail::ddl::claims_attach(t, p, partition_bound(lo), partition_bound(hi)));
        }
    }
    if (spec.offsets_table) {
        out += "\n-- Consumer positions (offsets_in_database).\n";
        for (const auto& sql : detail::ddl::offsets_table(qualify(spec.schema, *spec.offsets_table)))
            stmt(sql);
    }
    if (spec.outbox_table) {
        out += "\n-- Transactional outbox.\n";
        if (spec.outbox_schema != spec.schema)
            stmt(detail::ddl::create_schema(quote_identifier(spec.outbox_schema)));
        for (const auto& sql : detail::ddl::outbox_table(qualify(spec.outbox_schema, *spec.outbox_table)))
            stmt(sql);
    }
    if (spec.replay_audit_table) {
        out += "\n-- Dead-letter replay audit.\n";
        for (const auto& sql : detail::ddl::replay_audit_table(qualify(spec.schema, *spec.replay_audit_table)))
            stmt(sql);
    }
    return out;
}

std::string schema_upgrade_sql(const SchemaSpec& spec, int from_version, const std::string& command)
{
    if (from_version < 1 || from_version > schema_version)
        throw ConfigError(
            fmt::format("schema version {} is not one of idemkafka's (1 to {})", from_version, schema_version));
    spec.retention.validate();
    const ProcessedEventStore store(spec.schema, spec.claims_table);
    std::string out = fmt::format("-- idemkafka schema upgrade from version {} to {}, for PostgreSQL {} or later.\n",
                                  from_version, schema_version, schema_min_postgres);
    if (from_version == schema_version)
        return out + "-- Nothing to do: the tables are at this version.\n";
    if (!command.empty())
        out += fmt::format("-- What `{}` runs on tables of schema version {}, in its order.\n", command, from_version);
    out +=
        fmt::format("-- Apply it once, in one transaction, to tables of version {} (each table's comment says its\n"
                    "-- version); every statement is also safe on a table that already has what it adds. The upgrade\n"
                    "-- keeps every claim and position; its ALTERs change the catalog only, but wait for running\n"
                    "-- transactions: past lock_timeout the transaction rolls back, and you run it again.\n\n",
                    from_version);
    auto stmt = [&out](const std::string& sql) { out += sql + ";\n"; };
    stmt(detail::ddl::schema_lock);
    stmt(
        fmt::format("SET LOCAL lock_timeout = '{}ms'", std::max<std::int64_t>(spec.retention.lock_timeout.count(), 1)));
    auto table = [&](const char* title, std::string_view kind, const std::string& qualified) {
        out += fmt::format("\n-- {}.\n", title);
        for (int to = from_version + 1; to <= schema_version; ++to)
            for (const auto& sql : detail::ddl::upgrade_statements(kind, qualified, to))
                stmt(sql);
        stmt(detail::ddl::version_comment(qualified, kind));
    };
    table("Claims table", detail::ddl::claims_kind, store.qualified_name());
    // The retention registry is new in version 2 and has no upgrades yet.
    const std::string registry = qualify(store.schema(), retention_registry_name(store.table()));
    if (from_version < 2) {
        out += "\n-- The claims table's retention registry (new in version 2).\n";
        for (const auto& sql : detail::ddl::retention_table(registry, true))
            stmt(sql);
    } else {
        table("The claims table's retention registry", detail::ddl::retention_kind, registry);
    }
    if (spec.offsets_table)
        table("Consumer positions (offsets_in_database)", detail::ddl::offsets_kind,
              qualify(spec.schema, *spec.offsets_table));
    if (spec.outbox_table)
        table("Transactional outbox", detail::ddl::outbox_kind, qualify(spec.outbox_schema, *spec.outbox_table));
    // The replay audit table is new in version 2 and has no upgrades yet: migrate creates it.
    if (spec.replay_audit_table && from_version >= 2)
        table("Dead-letter replay audit", detail::ddl::replay_audit_kind,
              qualify(spec.schema, *spec.replay_audit_table));
    return out;
}

// ---- migrate -----------------------------------------------------------------------

namespace {

// The tables that migrate_schema() creates or upgrades, by kind, as (schema,
// table): the claims table and its retention registry first.
using KindTables = std::vector<std::pair<std::string_view, std::pair<std::string, std::string>>>;

KindTables tables_of(const SchemaSpec& spec)
{
    KindTables tables;
    tables.push_back({detail::ddl::claims_kind, {spec.schema, spec.claims_table}});
    tables.push_back({detail::ddl::retention_kind, {spec.schema, retention_registry_name(spec.claims_table)}});
    if (spec.offsets_table)
        tables.push_back({detail::ddl::offsets_kind, {spec.schema, *spec.offsets_table}});
    if (spec.outbox_table)
        tables.push_back({detail::ddl::outbox_kind, {spec.outbox_schema, *spec.outbox_table}});
    if (spec.replay_audit_table)
        tables.push_back({detail::ddl::replay_audit_kind, {spec.schema, *spec.replay_audit_table}});
    return tables;
}

// Creates the positions, outbox and replay audit tables that `spec` names and
// that do not exist yet, noting in `report` which it created.
void create_optional_tables(pqxx::work& tx, const SchemaSpec& spec, const std::optional<OffsetStore>& offsets,
                            const std::optional<Outbox>& outbox, SchemaMigrationReport& report)
{
    auto missing = [&tx](const std::string& qualified) { return !detail::pg::relation_exists(tx, qualified); };
    if (offsets) {
        report.offsets_created = missing(offsets->qualified_name());
        offsets->ensure_schema(tx);
    }
    if (outbox) {
        report.outbox_created = missing(outbox->qualified_name());
        outbox->ensure_schema(tx);
    }
    if (spec.replay_audit_table) {
        const std::string q = qualify(spec.schema, *spec.replay_audit_table);
        report.replay_audit_created = missing(q);
        if (report.replay_audit_created)
            for (const auto& sql : detail::ddl::replay_audit_table(q))
                tx.exec(sql);
    }
}

// Throws ConfigError naming everything the migrated `tables` still lack.
void require_complete(pqxx::transaction_base& tx, const KindTables& tables)
{
    std::vector<std::string> problems;
    for (const auto& [kind, name] : tables) {
        const TableCheck c = check_table(tx, kind, name.first, name.second);
        for (const auto& p : c.problems)
            problems.push_back(c.qualified + " " + p);
    }
    if (!problems.empty())
        throw ConfigError(fmt::format("migrate: existing tables lack what idemkafka needs and are not changed "
                                      "automatically: {}",
                                      fmt::join(problems, "; ")));
}

} // namespace

SchemaMigrationReport migrate_schema(pqxx::connection& conn, const SchemaSpec& spec, Maintenance::Existing existing,
                                     const LogSink& log, const Maintenance::WallClock& clock)
{
    SchemaMigrationReport report;
    const ProcessedEventStore store(spec.schema, spec.claims_table);
    std::optional<OffsetStore> offsets;
    if (spec.offsets_table)
        offsets.emplace(spec.schema, *spec.offsets_table);
    std::optional<Outbox> outbox;
    if (spec.outbox_table)
        outbox.emplace(spec.outbox_schema, *spec.outbox_table);
    spec.retention.validate();
    const KindTables tables = tables_of(spec);
    try {
        // Every table is created, converted and upgraded in one transaction:
        // a failure leaves the schema as it was, and a consumer never sees one
        // table upgraded and another not.
        detail::with_lock_retries(log, "migrate", spec.retention.lock_timeout, [&] {
            report = SchemaMigrationReport{};
            pqxx::work tx(conn);
            tx.exec(detail::ddl::begin_schema_change(spec.retention.lock_timeout));
            // Older tables first: conversion and new partitions need their columns.
            for (const auto& [kind, name] : tables)
                if (detail::upgrade_table(tx, kind, name.first, name.second))
                    report.versioned.push_back(qualify(name.first, name.second));
            detail::migrate_claims_table(tx, store, spec.retention, existing, report.claims);
            create_optional_tables(tx, spec, offsets, outbox, report);
            require_complete(tx, tables);
            tx.commit();
        });
    } catch (const Error&) {
        throw;
    } catch (const pqxx::broken_connection& e) {
        throw DatabaseError(fmt::format("migrate: connection to PostgreSQL lost: {}", e.what()));
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("migrate: {}", e.what()));
    }
    for (const auto& t : report.versioned)
        detail::emit(log, LogLevel::info, fmt::format("{} upgraded to schema version {}", t, schema_version), "schema");
    try {
        detail::finish_claims_migration(conn, store, spec.retention, log, clock, report.claims);
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("migrate: {}", e.what()));
    }
    return report;
}

// ---- check -------------------------------------------------------------------------

std::vector<TableCheck> check_schema(pqxx::connection& conn, const SchemaSpec& spec)
{
    try {
        pqxx::read_transaction tx(conn);
        std::vector<TableCheck> out;
        out.push_back(check_table(tx, detail::ddl::claims_kind, spec.schema, spec.claims_table));
        out.push_back(
            check_table(tx, detail::ddl::retention_kind, spec.schema, retention_registry_name(spec.claims_table)));
        if (spec.offsets_table)
            out.push_back(check_table(tx, detail::ddl::offsets_kind, spec.schema, *spec.offsets_table));
        if (spec.outbox_table)
            out.push_back(check_table(tx, detail::ddl::outbox_kind, spec.outbox_schema, *spec.outbox_table));
        if (spec.replay_audit_table)
            out.push_back(check_table(tx, detail::ddl::replay_audit_kind, spec.schema, *spec.replay_audit_table));
        return out;
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("checking the schema failed: {}", e.what()));
    }
}

std::string migrate_command(const SchemaSpec& spec)
{
    const RetentionConfig defaults;
    std::string cmd = "idemkafka-admin migrate --schema " + shell_word(spec.schema);
    if (spec.claims_table != "processed_event")
        cmd += " --table " + shell_word(spec.claims_table);
    if (spec.retention.mode != defaults.mode)
        cmd += " --mode " + std::string(to_string(spec.retention.mode));
    if (spec.retention.retention != defaults.retention)
        cmd += " --retention " + duration_text(spec.retention.retention);
    if (spec.retention.partition_width != defaults.partition_width)
        cmd += " --partition-width " + duration_text(spec.retention.partition_width);
    if (spec.retention.partitions_ahead != defaults.partitions_ahead)
        cmd += fmt::format(" --partitions-ahead {}", spec.retention.partitions_ahead);
    if (spec.offsets_table) {
        cmd += " --offsets";
        if (*spec.offsets_table != "consumer_offset")
            cmd += " --offsets-table " + shell_word(*spec.offsets_table);
    }
    if (spec.outbox_table) {
        cmd += " --outbox";
        if (spec.outbox_schema != spec.schema)
            cmd += " --outbox-schema " + shell_word(spec.outbox_schema);
        if (*spec.outbox_table != "outbox")
            cmd += " --outbox-table " + shell_word(*spec.outbox_table);
    }
    if (spec.replay_audit_table) {
        cmd += " --replay-audit";
        if (*spec.replay_audit_table != "dead_letter_replay")
            cmd += " --replay-audit-table " + shell_word(*spec.replay_audit_table);
    }
    return cmd;
}

std::vector<TableCheck> require_schema(pqxx::connection& conn, const SchemaSpec& spec)
{
    auto checks = check_schema(conn, spec);
    std::vector<std::string> problems;
    for (const auto& c : checks)
        for (const auto& p : c.problems)
            problems.push_back(fmt::format("the {} table {} {}", c.kind, c.qualified, p));
    if (!problems.empty())
        throw ConfigError(fmt::format(
            "create_schema is false and the database is not ready: {}. Create or upgrade the tables as their "
            "owner with `{}` (the database from --postgres or IDEMKAFKA_POSTGRES), or review its SQL with "
            "`{} --print-sql`",
            fmt::join(problems, "; "), migrate_command(spec), migrate_command(spec)));
    return checks;
}

} // namespace idemkafka
