#pragma once
// The one definition of every table's DDL. Consumer start-up, Maintenance::
// migrate(), the table classes' ensure_schema(), `idemkafka-admin migrate` and
// `migrate --print-sql` all build their statements here, so what a DBA
// reviews is what the library runs.

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idemkafka/event_id.hpp"
#include "idemkafka/retention.hpp"

namespace idemkafka::detail::ddl {

/// Key of the transaction-level advisory lock every schema change takes.
inline constexpr const char* schema_lock = "SELECT pg_advisory_xact_lock(hashtext('idemkafka.schema'))";

/// The start of a schema change the library runs itself, in one text:
/// schema_lock (waited for without a bound: schema changes run one after the
/// other), then pg::bound_transaction(`bound`). A conversion locks the whole
/// claims table: queued behind a long transaction on it, its lock request
/// would hold up every claim after it; idle in the transaction (a frozen
/// process), it would keep them out for as long as it stays frozen.
/// with_lock_retries() runs such a transaction again.
std::string begin_schema_change(std::chrono::milliseconds bound);

/// Table kinds as they appear in version comments and messages.
inline constexpr std::string_view claims_kind = "claims";
inline constexpr std::string_view offsets_kind = "offsets";
inline constexpr std::string_view outbox_kind = "outbox";
inline constexpr std::string_view replay_audit_kind = "replay_audit";
inline constexpr std::string_view retention_kind = "retention";

/// `CREATE SCHEMA IF NOT EXISTS "schema"`.
std::string create_schema(const std::string& schema_q);

/// The columns of the claims table and of each of its partitions.
std::string claim_columns();

/// A new claims table `qualified` (`schema`.`table` unquoted as given) in
/// `mode`: partitioned with its default partition and the processed_at index of
/// that partition, or plain with its processed_at index; then the version comment.
std::vector<std::string> claims_table(const std::string& schema, const std::string& table, RetentionMode mode);
/// `CREATE TABLE "schema"."<table>_default" PARTITION OF ... DEFAULT`.
std::string claims_default_partition(const std::string& schema, const std::string& table);
/// `CREATE INDEX <index> ON <target> (processed_at)`.
std::string processed_at_index(const std::string& index_name, const std::string& target);
/// Index names of the purge indexes (plain table, default partition).
std::string plain_index_name(const std::string& table);
std::string default_index_name(const std::string& table);
/// The two statements that make one range partition: CREATE TABLE, ATTACH.
std::string claims_partition_table(const std::string& partition_q);
std::string claims_attach(const std::string& parent_q, const std::string& partition_q, const EventId& lo,
                          const EventId& hi);
/// The [lo, hi) unix-ms ranges maintenance keeps partitions for at `now_ms`:
/// from now - retention to partitions_ahead widths ahead.
std::vector<std::pair<std::int64_t, std::int64_t>> partition_ranges(const RetentionConfig& cfg, std::int64_t now_ms);

/// The retention registry of a claims table (`qualified`): each consumer
/// group's retention, so that maintenance of the shared table keeps every
/// claim for the longest of them. Then its version comment. `if_not_exists`
/// for the upgrade script, which must be safe on a database that has it.
std::vector<std::string> retention_table(const std::string& qualified, bool if_not_exists = false);

/// A new offsets table `qualified`, then its version comment.
std::vector<std::string> offsets_table(const std::string& qualified);
/// A new outbox table `qualified` with its two partial indexes, then its version comment.
std::vector<std::string> outbox_table(const std::string& qualified);

/// A new dead-letter replay audit table `qualified` with its index, then its version comment.
std::vector<std::string> replay_audit_table(const std::string& qualified);

/// The statements that bring a table of `kind` (`qualified`) from schema
/// version `to - 1` to `to`; none when that version did not change it. Each
/// is safe on a table that already has what it adds.
std::vector<std::string> upgrade_statements(std::string_view kind, const std::string& qualified, int to);

/// Every column of the claims table, in order, for statements that copy claims.
inline constexpr const char* claim_column_names = "event_id, consumer_group, processed_at, payload_fingerprint";

/// `COMMENT ON TABLE ... IS 'idemkafka <kind> table, schema version N'`.
std::string version_comment(const std::string& qualified, std::string_view kind);

} // namespace idemkafka::detail::ddl
