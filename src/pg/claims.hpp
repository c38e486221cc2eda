#pragma once
// The claim statement and its parameters, shared by the consumer's claim
// transaction and ProcessedEventStore::claim(). Private to the library.

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

/// The stored fingerprints of `$2` (a uuid[] literal) claimed by group `$1`:
/// rows (event_id, payload_fingerprint), claims without one left out.
std::string stored_fingerprints_sql(const ProcessedEventStore& store);

/// `{uuid,uuid,...}`: the array literal `$1` of claim_sql() takes.
std::string uuid_array(const std::vector<EventId>& ids);

/// The `event_id` column of the claim statement's result. Throws
/// InvalidEventId for a value that is not a UUID (never from PostgreSQL).
std::vector<EventId> claimed_ids(const pqxx::result& r);

} // namespace idemkafka::detail::pg
