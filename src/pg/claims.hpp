#pragma once
// The claim statement and its parameters, shared by the consumer's claim
// transaction and ProcessedEventStore::claim(). Private to the library.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idemkafka/event_id.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka::detail::pg {

/// The claim statement of `store`'s table: `$1` a uuid[] literal (uuid_array()),
/// `$2` the consumer group; returns the ids that were not claimed before.
std::string claim_sql(const ProcessedEventStore& store);

/// The claim statement that also stores each claim's payload fingerprint:
/// as claim_sql(), with `$3` a bigint[] literal (int_array()) of the
/// fingerprints in the order of `$1`.
std::string fingerprint_claim_sql(const ProcessedEventStore& store);

/// The claim of ids expected new (ConsumerConfig::optimistic_claims):
/// claim_sql()'s rows (fingerprint_claim_sql()'s with `fingerprints`) in a
/// plain INSERT, without ON CONFLICT or RETURNING. It fails with
/// unique_violation where an id is claimed already; else it claimed every
/// id. PostgreSQL makes an ON CONFLICT insert look each key up before it
/// inserts the row (a second descent of the primary key, and a speculative
/// insertion lock per row): this one does neither.
std::string new_claim_sql(const ProcessedEventStore& store, bool fingerprints);

/// The stored fingerprints of `$2` (a uuid[] literal) claimed by group `$1`:
/// rows (event_id, payload_fingerprint), claims without one left out.
std::string stored_fingerprints_sql(const ProcessedEventStore& store);

/// `{uuid,uuid,...}`: the array literal `$1` of claim_sql() takes.
std::string uuid_array(const std::vector<EventId>& ids);

/// The `event_id` column of the claim statement's result. Throws
/// InvalidEventId for a value that is not a UUID (never from PostgreSQL).
std::vector<EventId> claimed_ids(const pqxx::result& r);

/// The ids a claim took, for "was this record's id claimed?" on every record
/// of a transaction: kept sorted (the claim returns them in the order it was
/// given, sorted, so that is one pass), a lookup is a binary search, and there
/// is no allocation per id.
class ClaimedIds {
public:
    ClaimedIds() = default;
    /// Takes `ids` (claimed_ids()'s result), sorting them if they are not.
    explicit ClaimedIds(std::vector<EventId> ids) : ids_(std::move(ids))
    {
        if (!std::is_sorted(ids_.begin(), ids_.end()))
            std::sort(ids_.begin(), ids_.end());
    }
    /// True when the claim took `id`.
    bool contains(const EventId& id) const noexcept { return std::binary_search(ids_.begin(), ids_.end(), id); }
    /// How many ids the claim took.
    std::size_t size() const noexcept { return ids_.size(); }

private:
    std::vector<EventId> ids_;
};

} // namespace idemkafka::detail::pg
