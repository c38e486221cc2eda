#pragma once
/// \file
/// ProcessedEventStore: the dedup claims table, `processed_event` by default.

#include <string>
#include <string_view>
#include <vector>

#include <pqxx/transaction>

#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"

namespace idemkafka {

/// Quotes `name` as a PostgreSQL identifier: wraps it in double quotes and
/// doubles any double quote inside, so `a"; drop table x; --` stays one
/// (odd) name. Throws ConfigError for an empty name, a name with a NUL byte or
/// one longer than PostgreSQL's 63-byte identifier limit.
IDEMKAFKA_API std::string quote_identifier(std::string_view name);

/// The claims table `(event_id uuid, consumer_group text, processed_at
/// timestamptz, payload_fingerprint bigint, PRIMARY KEY (event_id,
/// consumer_group))`.
class IDEMKAFKA_API ProcessedEventStore {
public:
    /// Names are quoted, never spliced into SQL as they are. Throws ConfigError
    /// for a name quote_identifier() refuses.
    ProcessedEventStore(std::string schema, std::string table);

    /// `"schema"."table"`, quoted.
    const std::string& qualified_name() const noexcept { return qualified_; }
    /// The schema name as configured (unquoted).
    const std::string& schema() const noexcept { return schema_; }
    /// The table name as configured (unquoted).
    const std::string& table() const noexcept { return table_; }
    /// `"schema"`, quoted.
    const std::string& quoted_schema() const noexcept { return schema_q_; }

    /// Creates the schema and table if they do not exist, from the one schema
    /// definition (idemkafka/schema.hpp), in the layout of RetentionMode::purge:
    /// a plain table with an index on processed_at. The consumer (with
    /// create_schema), `idemkafka-admin migrate` and migrate_schema() create
    /// the layout RetentionConfig::mode names, by default
    /// RetentionMode::partitioned (partitioned by range of event id, with a
    /// default partition); Maintenance maintains either as it finds it.
    /// An existing table is left as it is, whatever its layout or schema
    /// version: migrate_schema() upgrades one. Safe to run from several
    /// processes at once (serialised with a transaction-level advisory lock).
    /// Throws DatabaseError (wrapping the PostgreSQL error) on failure.
    void ensure_schema(pqxx::work& tx) const;
    /// Same, in a connection and transaction of its own.
    void ensure_schema(const std::string& conninfo) const;

    /// Claims `ids` for `group` in `tx` with one statement and returns the ones
    /// that were new (the rest are duplicates). The claims become durable only
    /// when `tx` commits. Order of the result is unspecified.
    std::vector<EventId> claim(pqxx::transaction_base& tx, std::string_view group,
                               const std::vector<EventId>& ids) const;

private:
    std::string schema_;
    std::string table_;
    std::string schema_q_;
    std::string table_q_;
    std::string qualified_;
};

} // namespace idemkafka
