#pragma once
// The steady state of a claims table: days of claims already in it when the
// measured runs start (--prefill).

#include <chrono>
#include <cstdint>
#include <string>

#include <idemkafka/config.hpp>
#include <idemkafka/event_id.hpp>

namespace idemkafka::bench {

/// What prefill_claims() made.
struct Prefill {
    std::string table;          ///< unquoted, in the bench schema
    std::uint64_t rows = 0;     ///< rows written
    std::int64_t window_ms = 0; ///< the ids' times span [end - window, end)
    std::int64_t end_ms = 0;    ///< unix ms: every prefilled id was minted before
    EventId run_ids_from;       ///< the lowest id a run can claim: partition_bound(end_ms)
    int partitions = 0;         ///< range partitions of the table (the default one not counted)
    double fill_seconds = 0;    ///< the INSERT statements
    double vacuum_seconds = 0;  ///< VACUUM ANALYZE afterwards
    std::int64_t heap_bytes = 0;
    std::int64_t total_bytes = 0; ///< heap, indexes and TOAST of every partition
};

/// Creates claims table `schema`.`table` as the consumer's default
/// configuration creates it (partitioned, RetentionConfig's defaults) and
/// fills it with `rows` claims of group `group` whose UUIDv7 times are spread
/// evenly over `retention` up to now, written as the consumer writes them
/// (processed_at just after the id's time, no fingerprint), with a few big
/// INSERT ... SELECT statements in time order, then VACUUM ANALYZE (what
/// autovacuum would have done by then). Progress goes to stderr. Throws on a
/// database error.
Prefill prefill_claims(const std::string& conninfo, const std::string& schema, const std::string& table,
                       const std::string& group, std::uint64_t rows, const RetentionConfig& retention);

} // namespace idemkafka::bench
