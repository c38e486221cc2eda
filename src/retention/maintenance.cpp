// Maintenance: migration of the claims table, one maintenance run, and its
// status.

#include "idemkafka/retention.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "core/duration_text.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/schema.hpp"
#include "pg/exec.hpp"
#include "retention/catalog.hpp"
#include "retention/maintenance_ops.hpp"
#include "retention/registry.hpp"
#include "retention/session_lock.hpp"
#include "retention/time.hpp"
#include "schema/ddl.hpp"
#include "schema/migration.hpp"

namespace idemkafka {
namespace {

using namespace detail::retention;
using std::chrono::milliseconds;

[[noreturn]] void rethrow_as_database_error(const char* what)
{
    try {
        throw;
    } catch (const Error&) {
        throw;
    } catch (const pqxx::broken_connection& e) {
        throw DatabaseError(fmt::format("{}: connection to PostgreSQL lost: {}", what, e.what()));
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("{}: {}", what, e.what()));
    }
}

// The retention a run keeps claims for: its own, or the longest registered.
void keep_for(const RetentionConfig& config, const ProcessedEventStore& store, MaintenanceReport& report, bool registry,
              const std::optional<RegisteredRetention>& longest, const MaintenanceOps& ops)
{
    report.retention = config.retention;
    if (!registry)
        ops.note(report.actions, LogLevel::warning,
                 fmt::format("{} has no retention registry (schema version 2): claims are kept for this run's "
                             "retention {} only, whatever other groups on the table keep theirs for; upgrade it "
                             "with `idemkafka-admin migrate`",
                             store.qualified_name(), detail::duration_text(config.retention)));
    if (longest && longest->retention > config.retention) {
        report.retention = longest->retention;
        report.retention_group = longest->consumer_group;
        ops.note(report.actions, LogLevel::info,
                 fmt::format("keeping claims for {}, the retention group {} registered, longer than this run's {}",
                             detail::duration_text(longest->retention), longest->consumer_group,
                             detail::duration_text(config.retention)));
    }
    report.cutoff = report.now - report.retention;
}

} // namespace

Maintenance::Maintenance(ProcessedEventStore store, RetentionConfig config, LogSink log, WallClock clock)
    : store_(std::move(store)), config_(std::move(config)), log_(std::move(log)), clock_(std::move(clock))
{
    config_.validate();
    if (!clock_)
        clock_ = [] { return std::chrono::system_clock::now(); };
}

namespace {

// migrate_claims_table()'s ways, by what it finds: no table, a partitioned
// one, a plain one to convert, a plain one to keep. `def`: the default
// partition's qualified name.
void create_claims_table(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg,
                         MigrationReport& report)
{
    for (const auto& sql : detail::ddl::claims_table(store.schema(), store.table(), cfg.mode))
        tx.exec(sql);
    report.created = true;
    report.mode = cfg.mode;
    report.notes.insert(report.notes.begin(),
                        fmt::format("created {} ({})", store.qualified_name(), to_string(cfg.mode)));
}

void adopt_partitioned(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg,
                       Maintenance::Existing existing, const TableKind& kind, const std::string& def,
                       MigrationReport& report)
{
    const std::string& t = store.qualified_name();
    if (!keyed_by_event_id(kind))
        throw ConfigError(fmt::format("table: {} is partitioned by {}, not RANGE (event_id); a key "
                                      "other than the event id cannot keep redeliveries in one partition",
                                      t, kind.partkey));
    if (cfg.mode == RetentionMode::purge && existing == Maintenance::Existing::convert)
        throw ConfigError(fmt::format("mode: {} is partitioned; converting it back to a plain table is "
                                      "not supported (its partitions already expire on their own)",
                                      t));
    report.mode = RetentionMode::partitioned;
    if (!find_default(list_partitions(tx, t))) {
        tx.exec(detail::ddl::claims_default_partition(store.schema(), store.table()));
        report.notes.push_back(fmt::format("added the default partition {}", def));
    }
}

void convert_to_partitioned(pqxx::work& tx, const ProcessedEventStore& store, const std::string& def,
                            MigrationReport& report)
{
    const std::string& t = store.qualified_name();
    // The plain table (upgraded to this schema version first: it must have
    // the parent's columns) becomes the default partition as it is (no
    // validation scan: with no other partition it accepts everything).
    // Creating the range partitions then moves the claims of their ranges
    // out of it (up to max_move_rows each); the rest ages out there by
    // processed_at.
    tx.exec(fmt::format("ALTER TABLE {} RENAME TO {}", t, quote_identifier(default_partition_name(store.table()))));
    tx.exec(detail::ddl::claims_table(store.schema(), store.table(), RetentionMode::partitioned)[0]);
    tx.exec(fmt::format("ALTER TABLE {} ATTACH PARTITION {} DEFAULT", t, def));
    tx.exec(detail::ddl::version_comment(t, detail::ddl::claims_kind));
    report.converted = true;
    report.mode = RetentionMode::partitioned;
    report.notes.push_back(fmt::format("converted {} to partitioned: its rows are now in the default "
                                       "partition {} and expire by processed_at",
                                       t, def));
}

void keep_plain(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg, MigrationReport& report)
{
    const std::string& t = store.qualified_name();
    report.mode = RetentionMode::purge;
    if (cfg.mode == RetentionMode::partitioned)
        report.notes.push_back(fmt::format("{} is a plain table and stays one (maintenance purges it); "
                                           "convert it with `idemkafka-admin migrate --mode partitioned`",
                                           t));
    // On a large table this blocks writes while it builds: create the index
    // CONCURRENTLY by hand first (docs/retention.md), migrate then finds it.
    if (ensure_processed_at_index(tx, t, detail::ddl::plain_index_name(store.table())))
        report.notes.push_back(fmt::format("created an index on {} (processed_at) for the purge", t));
}

} // namespace

void detail::migrate_claims_table(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg,
                                  Maintenance::Existing existing, MigrationReport& report)
{
    const std::string def =
        quote_identifier(store.schema()) + "." + quote_identifier(default_partition_name(store.table()));
    tx.exec(detail::ddl::create_schema(store.quoted_schema()));
    const TableKind kind = table_kind(tx, store.qualified_name());
    bool has_default = false;
    if (!kind.exists) {
        create_claims_table(tx, store, cfg, report);
        has_default = cfg.mode == RetentionMode::partitioned;
    } else if (kind.partitioned) {
        adopt_partitioned(tx, store, cfg, existing, kind, def, report);
        has_default = true;
    } else if (cfg.mode == RetentionMode::partitioned && existing == Maintenance::Existing::convert) {
        convert_to_partitioned(tx, store, def, report);
        has_default = true;
    } else {
        keep_plain(tx, store, cfg, report);
    }
    // The default partition is purged by processed_at like a plain table.
    if (has_default && ensure_processed_at_index(tx, def, detail::ddl::default_index_name(store.table())) &&
        !report.created)
        report.notes.push_back(fmt::format("created an index on {} (processed_at) for the purge", def));
    if (!registry_exists(tx, store)) {
        for (const auto& sql : detail::ddl::retention_table(registry_of(store)))
            tx.exec(sql);
        if (!report.created)
            report.notes.push_back(fmt::format("created the retention registry {}", registry_of(store)));
    }
}

void detail::finish_claims_migration(pqxx::connection& conn, const ProcessedEventStore& store,
                                     const RetentionConfig& cfg, const LogSink& log,
                                     const Maintenance::WallClock& clock, MigrationReport& report)
{
    const std::atomic<bool> never{false};
    MaintenanceOps ops(store, cfg, log, never);
    // Logged once committed: a rolled-back migration changed nothing.
    for (const auto& line : report.notes)
        ops.say(LogLevel::info, "{}", line);
    if (report.mode != RetentionMode::partitioned)
        return;

    // Partitions are made under the maintenance lock, as run_once() makes them. A
    // concurrent migrate holds it only briefly; a maintenance run elsewhere makes
    // them itself.
    SessionLock lock(conn, store.qualified_name());
    const auto deadline =
        std::chrono::steady_clock::now() + std::max<milliseconds>(cfg.lock_timeout, std::chrono::seconds(30));
    bool locked = lock.try_lock();
    while (!locked && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(100));
        locked = lock.try_lock();
    }
    if (!locked) {
        ops.note(report.notes, LogLevel::info, "maintenance is running in another session; it creates the partitions");
        return;
    }
    std::uint64_t moved = 0;
    ops.create_partitions(conn, clock ? clock() : std::chrono::system_clock::now(), false, report.partitions_created,
                          moved, report.notes);
}

MigrationReport Maintenance::migrate(pqxx::connection& conn, Existing existing)
{
    MigrationReport report;
    try {
        detail::with_lock_retries(log_, "migrate", config_.lock_timeout, [&] {
            report = MigrationReport{};
            pqxx::work tx(conn);
            // The same lock as every schema change: concurrent migrations and
            // consumer start-ups run one after the other.
            tx.exec(detail::ddl::begin_schema_change(config_.lock_timeout));
            // An older table first: conversion and new partitions need its columns.
            detail::upgrade_table(tx, detail::ddl::claims_kind, store_.schema(), store_.table());
            detail::migrate_claims_table(tx, store_, config_, existing, report);
            tx.commit();
        });
        detail::finish_claims_migration(conn, store_, config_, log_, clock_, report);
        return report;
    } catch (...) {
        rethrow_as_database_error("migrate");
    }
}

std::optional<std::chrono::milliseconds> Maintenance::register_group(pqxx::connection& conn,
                                                                     const std::string& consumer_group)
{
    const std::string& t = store_.qualified_name();
    try {
        pqxx::work tx(conn);
        if (!registry_exists(tx, store_))
            throw DatabaseError(fmt::format("{} has no retention registry {}: the table is older than schema version "
                                            "2; upgrade it with `idemkafka-admin migrate`",
                                            t, registry_of(store_)));
        tx.exec(
            fmt::format("SET LOCAL lock_timeout = '{}ms'", std::max<std::int64_t>(config_.lock_timeout.count(), 1)));
        const auto earlier = register_retention(tx, store_, consumer_group, config_.retention);
        tx.commit();
        if (!earlier)
            say(log_, LogLevel::info, "group {} registered its retention {} on {}", consumer_group,
                detail::duration_text(config_.retention), t);
        else if (*earlier != config_.retention)
            say(log_, LogLevel::warning,
                "group {} changed its registered retention on {} from {} to {}; maintenance keeps claims for "
                "the longest retention registered",
                consumer_group, t, detail::duration_text(*earlier), detail::duration_text(config_.retention));
        return earlier;
    } catch (const pqxx::insufficient_privilege& e) {
        throw ConfigError(fmt::format("registering group {}'s retention in {} needs SELECT, INSERT and UPDATE on "
                                      "it (see Least privilege in docs): {}",
                                      consumer_group, registry_of(store_), e.what()));
    } catch (...) {
        rethrow_as_database_error("retention registry");
    }
}

bool Maintenance::forget_group(pqxx::connection& conn, const std::string& consumer_group)
{
    try {
        pqxx::work tx(conn);
        if (!registry_exists(tx, store_))
            return false;
        const auto r = detail::pg::exec_params(
            tx, fmt::format("DELETE FROM {} WHERE consumer_group = $1", registry_of(store_)), consumer_group);
        tx.commit();
        const bool removed = r.affected_rows() > 0;
        if (removed)
            say(log_, LogLevel::info, "group {} removed from the retention registry of {}", consumer_group,
                store_.qualified_name());
        return removed;
    } catch (...) {
        rethrow_as_database_error("retention registry");
    }
}

namespace {

// What run_once() reads of the claims table before it acts.
struct TableState {
    TableKind kind;
    std::optional<int> version;
    bool registry = false;
    std::optional<RegisteredRetention> longest;
};

TableState table_state(pqxx::connection& conn, const ProcessedEventStore& store)
{
    TableState state;
    pqxx::work tx(conn);
    state.kind = table_kind(tx, store.qualified_name());
    state.version = detail::schema_version_of(tx, store.schema(), store.table());
    state.registry = registry_exists(tx, store);
    if (state.registry)
        state.longest = longest_in_registry(tx, store, false);
    return state;
}

// run_once() on a partitioned table `t`: new partitions, expired ones
// dropped, the default partition purged.
void maintain_partitions(pqxx::connection& conn, MaintenanceOps& ops, const std::string& t, const TableState& state,
                         bool dry_run, MaintenanceReport& report)
{
    if (!keyed_by_event_id(state.kind))
        throw ConfigError(fmt::format("table: {} is partitioned by {}, not RANGE (event_id); not maintaining it", t,
                                      state.kind.partkey));
    // A partition gets this version's columns, and PostgreSQL attaches only
    // a partition with exactly the parent's: a table not upgraded yet (or
    // upgraded by a newer release) gets no new partitions from here. Its
    // ids land in the default partition meanwhile, still deduplicated.
    if (state.version.value_or(1) != schema_version)
        ops.note(report.actions, LogLevel::warning,
                 fmt::format("no partitions created: {} has schema version {} and this library makes partitions "
                             "of version {}; upgrade it with `idemkafka-admin migrate` of the newer release",
                             t, state.version.value_or(1), schema_version));
    else
        ops.create_partitions(conn, report.now, dry_run, report.partitions_created, report.rows_moved, report.actions);
    ops.drop_expired(conn, report.now, report.cutoff, dry_run, report.partitions_dropped, report.partitions_kept,
                     report.actions);
    std::vector<Partition> parts;
    {
        pqxx::work tx(conn);
        parts = list_partitions(tx, t);
    }
    if (const Partition* def = find_default(parts))
        ops.purge(conn, def->qualified(), "the default partition " + def->qualified(), report.now, report.cutoff,
                  dry_run, report);
}

} // namespace

MaintenanceReport Maintenance::run_once(pqxx::connection& conn, bool dry_run)
{
    MaintenanceOps ops(store_, config_, log_, cancel_);
    MaintenanceReport report;
    report.dry_run = dry_run;
    report.now = clock_();
    report.retention = config_.retention;
    report.cutoff = report.now - config_.retention;
    const std::string& t = store_.qualified_name();
    try {
        SessionLock lock(conn, t);
        if (!lock.try_lock()) {
            ops.note(report.actions, LogLevel::info, "another session holds the maintenance lock; nothing done");
            return report;
        }
        report.acted = true;
        const TableState state = table_state(conn, store_);
        if (!state.kind.exists)
            throw DatabaseError(fmt::format("{} does not exist; run `idemkafka-admin migrate` (or start a consumer "
                                            "with create_schema) first",
                                            t));
        keep_for(config_, store_, report, state.registry, state.longest, ops);
        report.mode = state.kind.partitioned ? RetentionMode::partitioned : RetentionMode::purge;
        if (report.mode != config_.mode)
            ops.note(report.actions, LogLevel::warning,
                     fmt::format("{} is {} while the configured mode is {}; maintaining it as it is", t,
                                 state.kind.partitioned ? "partitioned" : "a plain table", to_string(config_.mode)));
        if (!state.kind.partitioned)
            ops.purge(conn, t, t, report.now, report.cutoff, dry_run, report);
        else
            maintain_partitions(conn, ops, t, state, dry_run, report);
        return report;
    } catch (...) {
        rethrow_as_database_error("maintenance");
    }
}

RetentionStatus Maintenance::status(pqxx::connection& conn) const
{
    RetentionStatus st;
    st.now = clock_();
    st.dedup_horizon = config_.dedup_horizon();
    st.horizon_cutoff = st.now - st.dedup_horizon;
    const std::string& t = store_.qualified_name();
    auto opt_time = [](const pqxx::field& f) -> std::optional<TimePoint> {
        if (f.is_null())
            return std::nullopt;
        return from_ms(f.as<std::int64_t>());
    };
    try {
        pqxx::work tx(conn);
        const TableKind kind = table_kind(tx, t);
        if (!kind.exists)
            return st;
        st.exists = true;
        st.mode = kind.partitioned ? RetentionMode::partitioned : RetentionMode::purge;
        st.registered = registrations(tx, store_);
        const auto groups = tx.exec(
            fmt::format("SELECT consumer_group, count(*), (extract(epoch FROM min(processed_at)) * 1000)::bigint, "
                        "(extract(epoch FROM max(processed_at)) * 1000)::bigint FROM {} GROUP BY consumer_group "
                        "ORDER BY consumer_group",
                        t));
        for (const auto& row : groups) {
            GroupInfo g;
            g.consumer_group = row[0].as<std::string>();
            g.rows = row[1].as<std::int64_t>();
            g.oldest_claim = opt_time(row[2]);
            g.newest_claim = opt_time(row[3]);
            st.rows += g.rows;
            if (g.oldest_claim && (!st.oldest_claim || *g.oldest_claim < *st.oldest_claim))
                st.oldest_claim = g.oldest_claim;
            if (g.newest_claim && (!st.newest_claim || *st.newest_claim < *g.newest_claim))
                st.newest_claim = g.newest_claim;
            st.groups.push_back(std::move(g));
        }
        if (kind.partitioned) {
            for (const auto& p : list_partitions(tx, t)) {
                PartitionInfo info;
                info.name = p.name;
                info.is_default = p.is_default;
                info.bound = p.bound;
                if (p.parsed && p.lo)
                    info.from = from_ms(bound_ms(*p.lo));
                if (p.parsed && p.hi)
                    info.to = from_ms(bound_ms(*p.hi));
                info.rows = tx.exec(fmt::format("SELECT count(*) FROM {}", p.qualified()))[0][0].as<std::int64_t>();
                if (!p.is_default && info.from && (!st.partitions_from || *info.from < *st.partitions_from))
                    st.partitions_from = info.from;
                if (!p.is_default && info.to && (!st.partitions_to || *st.partitions_to < *info.to))
                    st.partitions_to = info.to;
                st.partitions.push_back(std::move(info));
            }
        }
        return st;
    } catch (...) {
        rethrow_as_database_error("status");
    }
}

} // namespace idemkafka
