#pragma once
// The lag gauges. Private to the library.

#include "core/ledger.hpp"
#include "idemkafka/metrics.hpp"
#include "kafka/group_member.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail {

/// Sets the lag gauges: per assigned partition and in total, and the number
/// of assigned partitions. From the client's cached watermarks and the
/// processed position: before this member processed anything on a partition,
/// its position is where it started, the committed offset, fetched once per
/// assignment (the only broker round trip here). With
/// statistics.interval.ms set, from librdkafka's consumer_lag instead (end
/// offset minus committed offset) once a statistics event of this assignment
/// has it; the watermarks fill in until then.
void update_lag(PartitionLedger& ledger, kafka::GroupMember& consumer, Metrics& metrics);

/// The fetch-stall guard: an assigned partition that is not paused, deferred
/// or busy, from which no record arrived for `bound` although its leader has
/// records past the consumer's position (asked of it once per `bound`), is
/// an error line and counts in the stalled_partitions gauge until a record
/// arrives. Nothing the consumer owns goes unfetched in silence.
void watch_fetch_stalls(PartitionLedger& ledger, kafka::GroupMember& consumer, Metrics& metrics, const LogSink& log,
                        std::chrono::milliseconds bound);

} // namespace idemkafka::detail
