#pragma once
/// \file
/// OffsetStore: consumer positions kept in PostgreSQL, written in the same
/// transaction as the claims and effects they cover (ConsumerConfig::
/// offsets_in_database). Kafka's committed offsets become an optimisation.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/transaction>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// The table `(consumer_group, topic, partition, next_offset, epoch,
/// updated_at, PRIMARY KEY (consumer_group, topic, partition))`.
///
/// `epoch` fences zombies: a member that is assigned a partition bumps its
/// epoch, and a position write carries the epoch its writer was assigned with,
/// so a member that lost the partition (and does not know it yet) cannot write
/// any more. A position never moves backwards through write().
class IDEMKAFKA_API OffsetStore {
public:
    /// A position to write: the next offset to process of one partition, under the
    /// epoch its writer acquired.
    struct Position {
        std::string topic;            ///< the partition's topic
        std::int32_t partition = 0;   ///< the partition's number
        std::int64_t next_offset = 0; ///< the offset after the last processed record
        std::int64_t epoch = 0;       ///< from acquire(); a stale epoch is refused
    };

    /// A stored position, as acquire() and read() return it.
    struct Stored {
        std::string topic;                       ///< the partition's topic
        std::int32_t partition = 0;              ///< the partition's number
        std::optional<std::int64_t> next_offset; ///< nullopt: nothing processed yet
        std::int64_t epoch = 0;                  ///< the row's epoch, bumped by every acquire() and set()
        std::string updated_at;                  ///< when the row last changed, PostgreSQL's text form
    };

    /// Names are quoted, never spliced in as they are; throws ConfigError for
    /// a name quote_identifier() refuses.
    OffsetStore(const std::string& schema, const std::string& table);

    /// `"schema"."table"`, quoted.
    const std::string& qualified_name() const noexcept { return qualified_; }

    /// Creates the schema and table if missing, from the one schema definition
    /// (idemkafka/schema.hpp); an existing table is left as it is
    /// (migrate_schema() upgrades one of an earlier schema version).
    /// Serialised with an advisory lock: safe concurrently. Throws DatabaseError.
    void ensure_schema(pqxx::work& tx) const;

    /// Takes ownership of `partitions` for `group`: creates missing rows and
    /// bumps every row's epoch. Returns the stored positions with their new
    /// epochs, in no particular order.
    std::vector<Stored> acquire(pqxx::transaction_base& tx, std::string_view group,
                                const std::vector<std::pair<std::string, std::int32_t>>& partitions) const;

    /// Raises the stored positions to `positions` (never lowers them), only
    /// where the row's epoch still equals the position's epoch. Returns the
    /// positions that were refused because their epoch is stale (the writer was
    /// fenced); the caller must then roll back its transaction.
    std::vector<Position> write(pqxx::transaction_base& tx, std::string_view group,
                                const std::vector<Position>& positions) const;

    /// All stored positions of `group` (all groups when empty), for tools.
    std::vector<std::pair<std::string, Stored>> read(pqxx::transaction_base& tx, std::string_view group) const;

    /// Sets a position to exactly `next_offset` (backwards too) and bumps the
    /// epoch so that a running member's next write is refused: the supported
    /// way for an operator to skip or replay. Returns the previous position.
    std::optional<std::int64_t> set(pqxx::transaction_base& tx, std::string_view group, std::string_view topic,
                                    std::int32_t partition, std::int64_t next_offset) const;

private:
    std::string schema_q_;
    std::string qualified_;
};

} // namespace idemkafka
