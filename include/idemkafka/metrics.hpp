#pragma once
/// \file
/// Counters of one consumer. Every failure path increments one of them.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "idemkafka/dead_letter.hpp"
#include "idemkafka/export.hpp"

namespace idemkafka {

namespace detail {
struct MetricsAccess;
} // namespace detail

/// A point-in-time copy of a histogram: cumulative counts per upper bound.
struct HistogramSnapshot {
    std::vector<double> bounds;         ///< bucket upper bounds (the +Inf bucket is implied)
    std::vector<std::uint64_t> buckets; ///< observations <= bounds[i] (cumulative), then +Inf
    std::uint64_t count = 0;            ///< observations in all
    double sum = 0;                     ///< sum of the observed values
};

/// Where a partition's lag figures come from.
enum class LagSource {
    /// The engine's own processed position and the high watermark the client
    /// learnt from its last fetch response (rd_kafka_get_watermark_offsets).
    watermarks,
    /// librdkafka's statistics (`statistics.interval.ms` set in
    /// ConsumerConfig::kafka): `consumer_lag`, `hi_offset` and `committed_offset`
    /// of the partition, as of the latest statistics event.
    statistics,
};

/// "watermarks", "statistics".
IDEMKAFKA_API const char* to_string(LagSource source) noexcept;

/// The lag of one assigned partition.
struct PartitionLag {
    std::string topic;          ///< the partition's topic
    std::int32_t partition = 0; ///< the partition's number
    /// Records between the consumer's position and the end of the partition;
    /// -1 while unknown (no fetch response and no statistics yet).
    std::int64_t lag = -1;
    /// Next offset to process: just past the last record whose transaction
    /// committed, or the start offset before this member processed any; -1 unknown.
    std::int64_t position = -1;
    /// Offset committed to Kafka: the last one this member committed (watermarks)
    /// or librdkafka's `committed_offset` (statistics); -1 unknown.
    std::int64_t committed = -1;
    /// High watermark (offset of the next record to be written); -1 unknown.
    std::int64_t high_watermark = -1;
    LagSource source = LagSource::watermarks; ///< where these figures come from
    /// Seconds behind: from the timestamp of the first record not yet processed
    /// (the one at `position`) to now; 0 when `lag` is 0; -1 while unknown (that
    /// record not polled yet, or without a timestamp).
    double lag_seconds = -1;
    /// Seconds the position has not moved while `lag` was above 0 (0 when
    /// caught up, or when it moved since the last update): what liveness
    /// (health_of()) judges a stuck partition by.
    double stalled_seconds = 0;
};

/// A point-in-time copy of a consumer's counters.
struct IDEMKAFKA_API MetricsSnapshot {
    std::uint64_t consumed = 0;               ///< records taken from Kafka into processing (again after a rewind)
    std::uint64_t claimed = 0;                ///< records whose handler ran and committed
    std::uint64_t duplicates = 0;             ///< records skipped: event id already claimed
    std::uint64_t decode_errors = 0;          ///< records the decoder rejected (skipped, logged)
    std::uint64_t invalid_event_ids = 0;      ///< records without a usable event id (skipped, logged)
    std::uint64_t handler_failures = 0;       ///< handler exceptions (the record is retried)
    std::uint64_t db_commits = 0;             ///< PostgreSQL transactions committed
    std::uint64_t db_failures = 0;            ///< PostgreSQL errors outside the handler (batch retried)
    std::uint64_t db_reconnects = 0;          ///< new PostgreSQL connections after a failure
    std::uint64_t offset_commits = 0;         ///< successful Kafka offset commits
    std::uint64_t offset_commit_failures = 0; ///< failed Kafka offset commits (logged, not fatal)
    std::uint64_t rebalances = 0;             ///< assignments and revocations
    std::uint64_t kafka_errors = 0;           ///< consumer error events from librdkafka
    std::uint64_t retries = 0;                ///< handler failures scheduled for another attempt
    std::uint64_t transaction_retries = 0;    ///< transactions re-run after 40001/40P01
    /// Claims of ids expected new (ConsumerConfig::optimistic_claims) that met
    /// an id claimed already: rolled back before any handler ran and made
    /// again with ON CONFLICT DO NOTHING.
    std::uint64_t optimistic_claim_fallbacks = 0;
    std::uint64_t batch_splits = 0;         ///< batch handler failures (re-run with one call per record)
    std::uint64_t dead_letter_failures = 0; ///< dead-letter produces not acknowledged (record retried)
    std::uint64_t fenced_writes = 0;        ///< position writes refused: a stale member was fenced off
    /// offsets_in_database: assignments whose stored position was behind
    /// Kafka's committed offset (PostgreSQL lost commits, or the group was
    /// reset in Kafka); the stored position decided.
    std::uint64_t positions_behind_kafka = 0;
    /// The records between those stored positions and Kafka's committed
    /// offsets, processed again (duplicates where their claims survived).
    std::uint64_t records_behind_kafka = 0;
    /// offsets_in_database: partitions that, after a reconnect, had no stored
    /// position at all although this member had processed some of their
    /// records (PostgreSQL lost the positions: a failover to a standby
    /// without them); each was processed again from where this member began it.
    std::uint64_t positions_lost = 0;
    std::uint64_t lock_timeouts = 0; ///< transactions that waited past ConsumerConfig::lock_timeout (retried)
    /// Sessions of frozen members (idle in a transaction past
    /// ConsumerConfig::frozen_member_timeout) this consumer ended.
    std::uint64_t frozen_members_ended = 0;
    /// This consumer's own earlier PostgreSQL sessions it ended at a
    /// reconnect: their connection was lost on the client's side only
    /// (packets that vanished, a cut at db_timeout), and the server still
    /// kept them, with what they held.
    std::uint64_t lost_sessions_ended = 0;
    /// Connections to PostgreSQL cut because one of the consumer's own steps
    /// waited past ConsumerConfig::db_timeout (a frozen or vanished server).
    std::uint64_t db_timeouts = 0;
    /// Handler calls that returned normally with their transaction aborted (a
    /// database error caught and not rethrown): failures of that record.
    std::uint64_t handler_aborted_transactions = 0;
    /// Waits for a handler call longer than the keep-alive point (a fifth of
    /// max.poll.interval.ms, at most 10 s): the assignment was paused and
    /// polled meanwhile, so the member stayed in the group.
    std::uint64_t long_call_waits = 0;
    /// Handler calls (or reconcile hook calls) still running past
    /// max.poll.interval.ms: counted once per call, logged as an error naming
    /// the record and again every max.poll.interval.ms while it runs. Such a
    /// call cannot be interrupted; its partitions stay with this member and
    /// stop() waits for it (see oldest_call_seconds).
    std::uint64_t stuck_calls = 0;
    /// Running transactions abandoned (rolled back when their handler call
    /// returned) because a rebalance took their partitions while the call ran
    /// past the revoke wait.
    std::uint64_t revoke_abandons = 0;
    /// Ordering::key: records parked behind a failed record of their key
    /// (each time one is parked; a record parked again counts again).
    std::uint64_t parked = 0;
    /// Ordering::key: times a partition had more parked records than fit
    /// (half of max_prefetch_records or max_prefetch_bytes) and was held as
    /// a whole instead: rewound to its first parked record and paused for
    /// the retry backoff.
    std::uint64_t parking_overflows = 0;
    /// Times a partition's fetch was paused because its records could not go
    /// to processing (they wait behind its running unit) while the records
    /// held filled the consumer's half of max_prefetch_records or
    /// max_prefetch_bytes; it resumes once half of the partition's held
    /// records have gone to processing (see prefetched_records).
    std::uint64_t prefetch_pauses = 0;
    /// Times the circuit breaker opened from closed: handler failures across
    /// keys judged an outage (see ConsumerConfig::circuit_breaker). A failed
    /// probe that opens it again does not count again.
    std::uint64_t circuit_opened = 0;
    /// Times the circuit breaker gave up telling poison from an outage: open
    /// for CircuitBreaker::give_up_after with no handler call succeeding, so
    /// the probes' failures counted toward max_attempts again.
    std::uint64_t circuit_gave_up = 0;
    /// Seconds the circuit was not closed (open or probing), over the
    /// consumer's life; the current opening counts as far as the last update
    /// (at most 200 ms old).
    double circuit_open_seconds = 0;
    std::uint64_t beyond_dedup_horizon = 0; ///< events older than the dedup horizon (any policy)
    std::uint64_t horizon_processed = 0;    ///< of those, handed on by policy or reconcile hook
    std::uint64_t key_window_closed = 0;    ///< records handled after their downstream key window
    std::uint64_t outbox_published = 0;     ///< outbox rows published by the consumer's relay
    std::uint64_t outbox_failures = 0;      ///< outbox rows not acknowledged (retried)
    /// Records dead-lettered, by DeadLetterReason.
    std::array<std::uint64_t, dead_letter_reason_count> dead_lettered{};
    /// Handler call duration in seconds.
    HistogramSnapshot handler_seconds;
    /// Records per committed batch.
    HistogramSnapshot batch_records;
    /// Seconds from the PostgreSQL commit to the Kafka offset commit request.
    HistogramSnapshot commit_delay_seconds;
    /// Sum of dead_lettered.
    std::uint64_t dead_lettered_total() const noexcept;
    /// Records dead-lettered with reason `r`.
    std::uint64_t dead_lettered_for(DeadLetterReason r) const noexcept
    {
        return dead_lettered[static_cast<std::size_t>(r)];
    }
    /// Gauges.
    std::int64_t assigned_partitions = 0; ///< partitions currently assigned
    /// Records not yet processed on the assigned partitions (high watermark
    /// minus position), -1 while unknown (no assignment or no fetch yet).
    std::int64_t lag = -1;
    /// Per assigned partition, ordered by topic and partition; revoked
    /// partitions are removed. The sum of the known lags is `lag`.
    std::vector<PartitionLag> partitions;
    /// Records taken from the Kafka client and not finished yet (committed,
    /// skipped as duplicates, dead-lettered or given back for redelivery): the
    /// running batch and, with the pipeline, the next one, and with
    /// Ordering::key the parked records. Bounded by 2 x max_batch, plus half
    /// of max_prefetch_records for the parked ones; what librdkafka
    /// prefetched is not included (that is bounded by max_prefetch_records
    /// and max_prefetch_bytes).
    std::int64_t in_flight_records = 0;
    /// Key and payload bytes of those records (bounded by about 2 x max_batch_bytes).
    std::int64_t in_flight_bytes = 0;
    /// Records taken from the Kafka client and held per partition for the
    /// round-robin, not handed to processing yet (those of a partition whose
    /// earlier records still run wait here). At most half of
    /// max_prefetch_records, plus one record per partition whose fetch is
    /// paused for it (prefetch_pauses); librdkafka's own queue, the other
    /// half of the cap, is not included.
    std::int64_t prefetched_records = 0;
    /// Key and payload bytes of those records: at most half of
    /// max_prefetch_bytes, plus one record per partition paused for it.
    std::int64_t prefetched_bytes = 0;
    /// Ordering::key: records parked now behind a failed record of their key
    /// (also counted in in_flight_records), and the keys parked now.
    std::int64_t parked_records = 0;
    std::int64_t parked_keys = 0; ///< Ordering::key: the keys parked now
    /// Creation time (Unix ms) of this group's oldest claim in the claims table:
    /// the UUIDv7 time of its smallest event id, or the oldest `processed_at`
    /// when that id is not a UUIDv7; -1 while unknown (no claim, not measured
    /// yet, or ConsumerConfig::oldest_claim_refresh is zero).
    std::int64_t oldest_claim_unix_ms = -1;
    /// Seconds from oldest_claim_unix_ms to the snapshot's time (0 for an id
    /// from the future); -1 while unknown.
    double oldest_claim_age_seconds = -1;
    /// Expired claim partitions the consumer's latest maintenance run could
    /// not drop (a DROP waited longer than the retention lock_timeout for some
    /// transaction on the claims table); they stay, and take disk, until a
    /// run drops them. 0 without in-consumer maintenance.
    std::int64_t expired_partitions_kept = 0;
    /// 1 while the circuit breaker holds the assignment (open or probing), else 0.
    std::int64_t circuit_open = 0;
    /// Assigned partitions, not paused by the consumer, from which no record
    /// has arrived for ConsumerConfig::fetch_stall_after while their leader
    /// has records past the consumer's position (each also an error line).
    std::int64_t stalled_partitions = 0;
    /// Seconds the oldest handler call (or reconcile hook call) running now
    /// has run, 0 when none runs (at most about 200 ms old). A call that never
    /// returns shows here growing without end.
    double oldest_call_seconds = 0;
    /// 1 while PostgreSQL is away and the assignment is paused (the database gate), else 0.
    std::int64_t db_paused = 0;
    /// When the consumer's loop last did its periodic work (Unix ms; at most
    /// 200 ms apart while it runs); -1 before run().
    std::int64_t loop_heartbeat_unix_ms = -1;

    /// Prometheus text exposition (metric names prefixed `idemkafka_`, one
    /// `group` label).
    std::string to_prometheus(const std::string& group) const;
};

/// Live counters, updated by the consumer thread and readable from any thread.
class IDEMKAFKA_API Metrics {
public:
    /// A monotonic count (relaxed atomics: a reader sees each counter on its own,
    /// not a consistent set; snapshot() is the one to read).
    struct Counter {
        std::atomic<std::uint64_t> value{0}; ///< the count
        /// Adds `n`.
        void add(std::uint64_t n = 1) noexcept { value.fetch_add(n, std::memory_order_relaxed); }
        /// The count now.
        std::uint64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
    };

    /// A value that goes up and down (relaxed atomics, as Counter).
    struct Gauge {
        std::atomic<std::int64_t> value{0}; ///< the value
        /// Replaces the value with `v`.
        void set(std::int64_t v) noexcept { value.store(v, std::memory_order_relaxed); }
        /// Adds `n` (negative to subtract).
        void add(std::int64_t n) noexcept { value.fetch_add(n, std::memory_order_relaxed); }
        /// The value now.
        std::int64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
    };

    /// \name Counters
    //@{
    /// Counts what the MetricsSnapshot field of the same name reports.
    Counter consumed, claimed, duplicates, decode_errors, invalid_event_ids, handler_failures, db_commits, db_failures,
        db_reconnects, offset_commits, offset_commit_failures, rebalances, kafka_errors, retries, transaction_retries,
        optimistic_claim_fallbacks, batch_splits, dead_letter_failures, fenced_writes, positions_behind_kafka,
        records_behind_kafka, positions_lost, frozen_members_ended, lost_sessions_ended, db_timeouts, lock_timeouts,
        handler_aborted_transactions, long_call_waits, stuck_calls, revoke_abandons, parked, parking_overflows,
        prefetch_pauses, circuit_opened, circuit_gave_up, beyond_dedup_horizon, horizon_processed, key_window_closed,
        outbox_published, outbox_failures;
    //@}
    /// Records dead-lettered, indexed by DeadLetterReason.
    std::array<Counter, dead_letter_reason_count> dead_lettered;
    /// Fixed-bucket histogram; observe() is lock-free.
    class IDEMKAFKA_API Histogram {
    public:
        /// Buckets with these upper bounds, ascending (the +Inf bucket is implied).
        explicit Histogram(std::vector<double> bounds);
        /// Counts `v` in the first bucket whose bound is at least `v`.
        void observe(double v) noexcept;
        /// A copy of the counts, cumulative as Prometheus has them.
        HistogramSnapshot snapshot() const;

    private:
        std::vector<double> bounds_;
        std::unique_ptr<std::atomic<std::uint64_t>[]> counts_; // per bucket, not cumulative
        std::atomic<std::uint64_t> count_{0};
        std::atomic<std::uint64_t> sum_micro_{0}; // sum in millionths, to stay lock-free
    };

    /// \name Histograms and gauges
    //@{
    /// Measures what the MetricsSnapshot field of the same name reports.
    Histogram handler_seconds{{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}};
    Histogram batch_records{{1, 10, 50, 100, 250, 500, 1000, 5000}};
    Histogram commit_delay_seconds{{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1}};
    Gauge assigned_partitions;
    Gauge lag{{-1}};
    Gauge in_flight_records;
    Gauge in_flight_bytes;
    Gauge prefetched_records;
    Gauge prefetched_bytes;
    Gauge parked_records;
    Gauge parked_keys;
    Gauge oldest_claim_unix_ms{{-1}};
    Gauge expired_partitions_kept;
    Gauge circuit_open;
    Gauge stalled_partitions;
    Gauge oldest_call_ms; ///< MetricsSnapshot::oldest_call_seconds, in milliseconds
    Gauge db_paused;
    Gauge loop_heartbeat_unix_ms{{-1}};
    //@}
    /// Milliseconds the circuit was not closed (MetricsSnapshot::circuit_open_seconds).
    Counter circuit_open_ms;

    /// A copy of the per-partition lags.
    std::vector<PartitionLag> partitions() const;

    /// Copies every counter.
    MetricsSnapshot snapshot() const;

private:
    friend struct detail::MetricsAccess; // the consumer sets the per-partition lags
    mutable std::mutex partitions_mu_;
    std::vector<PartitionLag> partitions_;
};

} // namespace idemkafka
