#pragma once
// The steps of a schema migration that consumer start-up, Maintenance::
// migrate() and `idemkafka-admin migrate` share, each in the caller's
// transaction, which holds ddl::schema_lock: so that creating, converting and
// upgrading every table is one transaction, and concurrent start-ups run one
// after the other. Private to the library.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <pqxx/pqxx>

#include "idemkafka/log.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka::detail {

/// Brings an existing table of `kind` from the schema version its comment
/// records (a table without one counts as version 1) to schema_version, with
/// the statements of ddl::upgrade_statements(), in a transaction begun with
/// ddl::begin_schema_change() (each lock waited for at most its
/// lock_timeout), and writes the new version comment. Returns
/// true when it changed the table or its comment; false for a missing table
/// or one already current. Throws ConfigError naming both versions for a
/// table newer than this library, and naming what is missing for a table
/// without the layout of its version (then nothing is changed).
bool upgrade_table(pqxx::work& tx, std::string_view kind, const std::string& schema, const std::string& table);

/// The schema version in the comment of `schema`.`table`; nullopt for a
/// table without one or a missing table. Catalog only.
std::optional<int> schema_version_of(pqxx::transaction_base& tx, const std::string& schema, const std::string& table);

/// The claims table's part of Maintenance::migrate(): creates it in
/// `cfg.mode` if missing (with its default partition or its processed_at
/// index), converts a plain one with Existing::convert, adds what an existing
/// one lacks (default partition, indexes). Fills `report` but logs nothing
/// (a rolled-back transaction changed nothing). Throws ConfigError for a
/// conversion it cannot do.
void migrate_claims_table(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg,
                          Maintenance::Existing existing, MigrationReport& report);

/// Runs `attempt` (one schema change transaction, begun with
/// ddl::begin_schema_change(`lock_timeout`)) again after it failed waiting
/// for a lock past `lock_timeout`, 5 times in all, with a pause
/// between two (1 s, doubling), in which the claims its lock request held up
/// go on; each retry is a warning line of `log`. After the last one, throws
/// DatabaseError naming `what`, the attempts and what to do.
void with_lock_retries(const LogSink& log, std::string_view what, std::chrono::milliseconds lock_timeout,
                       const std::function<void()>& attempt);

/// After the migration's transaction committed: logs report.notes and, for a
/// partitioned claims table, creates its range partitions under the
/// maintenance lock (unless a maintenance run holds it: it makes them).
void finish_claims_migration(pqxx::connection& conn, const ProcessedEventStore& store, const RetentionConfig& cfg,
                             const LogSink& log, const Maintenance::WallClock& clock, MigrationReport& report);

} // namespace idemkafka::detail
