#pragma once
/// \file
/// The library's schema as code: which tables a configuration uses, the one
/// definition of their DDL (shared by consumer start-up, `idemkafka-admin
/// migrate` and `migrate --print-sql`), a schema version, and the start-up
/// check for databases whose schema is managed by a DBA (create_schema = false).

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/connection>

#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/retention.hpp"

namespace idemkafka {

struct ConsumerConfig;

/// The version of the schema this library creates and expects. Stored as each
/// table's comment (`idemkafka <kind> table, schema version N`), so it survives
/// pg_dump and reviewed migrations. migrate_schema() upgrades a table of any
/// earlier version in place; a consumer refuses a table of a later one
/// (ConfigError), and with create_schema = false an earlier one too.
/// Version 1: idemkafka 0.1.0. Version 2: the claims table's
/// payload_fingerprint column (ConsumerConfig::payload_fingerprint) and its
/// retention registry (`<table>_retention`: each consumer group's retention,
/// maintenance keeps the longest).
inline constexpr int schema_version = 2;

/// The oldest PostgreSQL the DDL is written for (partitioned tables with a
/// DEFAULT partition and a primary key need 11; the project supports 13+).
inline constexpr int schema_min_postgres = 13;

/// Which tables a configuration uses, and their names: claims always; the
/// offsets table when `offsets_table` is set (ConsumerConfig::offsets_in_database);
/// the outbox when `outbox_table` is set (ConsumerConfig::outbox).
struct IDEMKAFKA_API SchemaSpec {
    std::string schema = "public";                ///< schema of the claims and offsets tables
    std::string claims_table = "processed_event"; ///< the claims table
    /// Layout of a new claims table and its initial partitions.
    RetentionConfig retention;
    std::optional<std::string> offsets_table; ///< the offsets table; nullopt when not used
    /// Schema of the outbox (OutboxConfig::schema); the outbox table when set.
    std::string outbox_schema = "public";
    std::optional<std::string> outbox_table; ///< nullopt when not used
    /// The dead-letter replay audit table (in `schema`; ReplayAuditTable, what
    /// replay_dead_letters() writes); nullopt when not used. Consumers never need it.
    std::optional<std::string> replay_audit_table;

    /// The tables `config` uses, as its consumer's start-up selects them. Never
    /// throws for a validated config.
    static SchemaSpec of(const ConsumerConfig& config);
};

/// What one table of a SchemaSpec looks like in a database.
struct TableCheck {
    /// "claims", "retention" (the claims table's retention registry),
    /// "offsets", "outbox" or "replay_audit".
    std::string kind;
    /// `"schema"."table"`, quoted.
    std::string qualified;
    bool exists = false; ///< the table exists
    /// From the table's comment; nullopt for a table without one (created
    /// before schema versions, or by hand).
    std::optional<int> version;
    /// Claims table: partitioned (by event id) or plain. Meaningful when it exists.
    RetentionMode mode = RetentionMode::partitioned;
    /// Missing table, missing or mistyped columns, missing keys, an older
    /// version: one line each. Empty when the library can use the table.
    std::vector<std::string> problems;
    /// True when the library can use the table (no problems).
    bool ok() const noexcept { return problems.empty(); }
};

/// What migrate_schema() did.
struct SchemaMigrationReport {
    MigrationReport claims;            ///< the claims table's migration
    bool offsets_created = false;      ///< the offsets table was created
    bool outbox_created = false;       ///< the outbox table was created
    bool replay_audit_created = false; ///< the replay audit table was created
    /// Tables whose version comment was written or raised.
    std::vector<std::string> versioned;
};

/// The statements migrate_schema() runs on a database that has none of the
/// spec's tables, in order, each ending in `;`, preceded by `--` comments that
/// say which PostgreSQL version they assume and, in partitioned mode, that
/// `idemkafka-admin maintain` (or the consumers' maintenance) must keep
/// creating partitions. `now` places the initial partitions; `command` is the
/// command line shown in the header. Ready for psql -f, Flyway, Liquibase or
/// sqitch. Throws ConfigError for a name quote_identifier() refuses or an
/// invalid retention config.
IDEMKAFKA_API std::string schema_sql(const SchemaSpec& spec, std::chrono::system_clock::time_point now,
                                     const std::string& command = {});

/// The statements migrate_schema() runs to upgrade the tables of `spec`
/// from schema version `from_version` to schema_version (under the same lock
/// and lock_timeout, ending with each table's new version comment), for a
/// DBA who applies reviewed SQL; `command` is the command line shown in the
/// header. Throws ConfigError for a version that is not 1 to schema_version,
/// a name quote_identifier() refuses or an invalid retention config.
IDEMKAFKA_API std::string schema_upgrade_sql(const SchemaSpec& spec, int from_version, const std::string& command = {});

/// Creates or upgrades every table of `spec` in one transaction under the
/// schema advisory lock: a table of an earlier schema version is upgraded in
/// place (every claim and position kept), the claims table is created or, with
/// Existing::convert, converted as Maintenance::migrate() does, missing
/// offsets and outbox tables are created, each table gets the version
/// comment; then a partitioned claims table gets its partitions. Each lock on
/// a table is waited for at most the retention's lock_timeout, and the
/// transaction runs again past it, as Maintenance::migrate() does. Idempotent,
/// safe to run concurrently. Throws ConfigError (impossible conversion, bad
/// name, an existing table without the columns and keys of its version, a
/// table of a newer schema version than this library's: both versions named),
/// DatabaseError (PostgreSQL failed; nothing changed).
IDEMKAFKA_API SchemaMigrationReport migrate_schema(pqxx::connection& conn, const SchemaSpec& spec,
                                                   Maintenance::Existing existing = Maintenance::Existing::keep,
                                                   const LogSink& log = {}, const Maintenance::WallClock& clock = {});

/// Inspects every table of `spec` (catalog queries only: needs no privilege
/// on the tables themselves). Throws DatabaseError when PostgreSQL fails.
IDEMKAFKA_API std::vector<TableCheck> check_schema(pqxx::connection& conn, const SchemaSpec& spec);

/// The `idemkafka-admin migrate ...` command that creates or upgrades the
/// tables of `spec` (the database from IDEMKAFKA_POSTGRES or --postgres, left
/// out so that no password is ever printed). Never throws but std::bad_alloc.
IDEMKAFKA_API std::string migrate_command(const SchemaSpec& spec);

/// check_schema(), and a ConfigError naming every table with a problem and
/// the migrate_command() that fixes it unless all are usable. What a consumer
/// with create_schema = false does at start-up. Returns the checks.
IDEMKAFKA_API std::vector<TableCheck> require_schema(pqxx::connection& conn, const SchemaSpec& spec);

} // namespace idemkafka
