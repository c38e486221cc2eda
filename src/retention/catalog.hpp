#pragma once
// What PostgreSQL's catalog says of a claims table: whether it exists, how it
// is partitioned, its partitions and their bounds. Private to the library.

#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idemkafka/event_id.hpp"

namespace idemkafka::detail::retention {

struct TableKind {
    bool exists = false;
    bool partitioned = false;
    std::string partkey; // pg_get_partkeydef, e.g. "RANGE (event_id)"
};

TableKind table_kind(pqxx::transaction_base& tx, const std::string& qualified);

/// Partitioned the way retention partitions: by range of the event id.
bool keyed_by_event_id(const TableKind& k);

/// Creates an index on processed_at of `target` unless one leads with it
/// already; returns whether it did. The purge finds its batches through it
/// instead of scanning the table once per batch.
bool ensure_processed_at_index(pqxx::transaction_base& tx, const std::string& target, const std::string& index_name);

struct Partition {
    std::string schema;
    std::string name;
    std::string bound; // pg_get_expr(relpartbound)
    bool is_default = false;
    std::optional<EventId> lo; // nullopt: MINVALUE
    std::optional<EventId> hi; // nullopt: MAXVALUE
    bool parsed = false;       // the bound is a single-column uuid range we understood

    std::string qualified() const;
};

/// The partitions of `qualified`: ranges in id order (MINVALUE first), the
/// default partition last.
std::vector<Partition> list_partitions(pqxx::transaction_base& tx, const std::string& qualified);

/// The default partition of `parts`, or null.
const Partition* find_default(const std::vector<Partition>& parts);

/// [lo, hi) overlaps an existing range partition. A bound we cannot parse
/// counts as overlapping everything: better a missing partition (claims go to
/// the default one) than a failed ATTACH every run.
bool overlaps(const std::vector<Partition>& parts, const EventId& lo, const EventId& hi);

} // namespace idemkafka::detail::retention
