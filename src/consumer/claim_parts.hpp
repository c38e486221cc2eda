#pragma once
// What the claim transaction's files (claim_*.cpp) share: the statements
// prepare() names, the exceptions that end a transaction early, and the
// pieces that need no PostgreSQL (unit tests in
// tests/unit/test_claim_parts.cpp). Private to the library.

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "consumer/claim_transaction.hpp"
#include "consumer/item.hpp"
#include "consumer/worker.hpp"
#include "core/fingerprint.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/offset_store.hpp"

namespace idemkafka::detail {

inline constexpr const char* claim_statement = "idemkafka_claim";
inline constexpr const char* new_claim_statement = "idemkafka_claim_new"; // optimistic_claims only
// optimistic_claims: after a claim of ids expected new met a claimed one,
// the claims that keep to ON CONFLICT, counted from the last that met one.
inline constexpr std::size_t claims_before_optimism = 16;
inline constexpr const char* fingerprints_statement = "idemkafka_stored_fingerprints"; // payload_fingerprint only

// Thrown inside the transaction to abandon it on a forced stop.
struct Abandon {};

// Thrown before COMMIT when the transaction is not the one the claim began.
struct Replaced {};

// The circuit breaker's identity of a record's key: the key within its
// partition; a record without a key is a key of its own.
inline std::uint64_t circuit_key(const Item& it)
{
    constexpr std::uint64_t mix = 0x9e3779b97f4a7c15ull;
    const std::uint64_t own = it.record.key ? std::hash<std::string_view>{}(*it.record.key)
                                            : static_cast<std::uint64_t>(it.record.offset) * mix + 1;
    return own ^ (reinterpret_cast<std::uintptr_t>(it.part) * mix);
}

// payload_fingerprint: the fingerprint of a record's payload (a null one is empty).
inline std::int64_t fingerprint_of(const Item& it)
{
    return fingerprint(it.record.value ? *it.record.value : std::string_view());
}

// The skeleton (claim_transaction.cpp): the worker's pending records that
// are not held, each id once, in id order (see the definition); from
// position `from` of the worker's records, at most `most` of them (a
// transaction's share of a unit of several).
ClaimTransaction::Attempt collect(const BatchOutcome& w, const std::vector<Item>& items, bool fingerprints,
                                  std::size_t most = SIZE_MAX, std::size_t from = 0);

// Handler calls (claim_handler_calls.cpp): whether a handler's exception
// leaves its record another try (NonRetryableError, then
// ConsumerConfig::is_retryable).
bool retryable(const ConsumerConfig& cfg, const std::exception& e);

// What ended a transaction early (claim_faults.cpp): what an exception means.
// `in_handler`: a handler call was running. Rethrows what is none of the
// library's (not a std::exception).
ClaimTransaction::Classified classify(const std::exception_ptr& error, bool in_handler);

// Stored positions (claim_positions.cpp): the next offset per partition of
// the worker's records that are not held, up to the record at index `upto`
// of the batch (several transactions per unit: the later ones have not run
// yet);
// `of` (when not null) gets each partition's state and next offset too.
std::vector<OffsetStore::Position> positions_of(const BatchOutcome& w, const std::vector<Item>& items,
                                                std::vector<std::pair<PartitionState*, std::int64_t>>* of,
                                                std::size_t upto = SIZE_MAX);

// Reused ids (claim_reuse.cpp): the payload an event id was claimed with.
struct PayloadReference {
    std::int64_t fingerprint;
    const Item* by; // the record of this transaction that claimed it; null: claimed before
};

// Reused ids: marks for the dead letter (event_id_reused) each pending,
// not held record of the worker, at positions [from, end) of its records,
// whose id was claimed with another payload (`reference`), and returns them.
std::vector<Item*> mark_reused(const BatchOutcome& w, std::vector<Item>& items,
                               const std::unordered_map<EventId, PayloadReference>& reference, std::size_t from = 0,
                               std::size_t end = SIZE_MAX);

} // namespace idemkafka::detail
