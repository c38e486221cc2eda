#pragma once
/// \file
/// Per-entity serialisation inside the handler's transaction, for handlers
/// that touch one entity from several topics, partitions or consumer groups
/// (where partition order alone does not keep them apart).

#include <string_view>

#include <pqxx/transaction_base>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// Takes a transaction-level PostgreSQL advisory lock on a key derived from
/// `entity_id` (pg_advisory_xact_lock(hashtextextended(entity_id, 0))). It is
/// held until `tx` commits or rolls back, so two transactions that lock the
/// same entity run one after the other. Distinct ids may share a lock (64-bit
/// hash): that costs waiting, never correctness. Blocks until the lock is
/// free; throws what libpqxx throws (e.g. pqxx::deadlock_detected when two
/// transactions lock entities in opposite orders, which the consumer retries).
IDEMKAFKA_API void lock_entity(pqxx::transaction_base& tx, std::string_view entity_id);

} // namespace idemkafka
