#pragma once
/// \file
/// Counters of one consumer. Every failure path increments one of them.

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "idemkafka/dead_letter.hpp"

namespace idemkafka {

/// A point-in-time copy of a histogram: cumulative counts per upper bound.
struct HistogramSnapshot {
    std::vector<double> bounds;          ///< bucket upper bounds (the +Inf bucket is implied)
    std::vector<std::uint64_t> buckets;  ///< observations <= bounds[i] (cumulative), then +Inf
    std::uint64_t count = 0;
    double sum = 0;
};

/// A point-in-time copy of a consumer's counters.
struct MetricsSnapshot {
    std::uint64_t consumed = 0;          ///< records polled from Kafka
    std::uint64_t claimed = 0;           ///< records whose handler ran and committed
    std::uint64_t duplicates = 0;        ///< records skipped: event id already claimed
    std::uint64_t decode_errors = 0;     ///< records the decoder rejected (skipped, logged)
    std::uint64_t invalid_event_ids = 0; ///< records without a usable event id (skipped, logged)
    std::uint64_t handler_failures = 0;  ///< handler exceptions (the record is retried)
    std::uint64_t db_commits = 0;        ///< PostgreSQL transactions committed
    std::uint64_t db_failures = 0;       ///< PostgreSQL errors outside the handler (batch retried)
    std::uint64_t db_reconnects = 0;     ///< new PostgreSQL connections after a failure
    std::uint64_t offset_commits = 0;    ///< successful Kafka offset commits
    std::uint64_t offset_commit_failures = 0; ///< failed Kafka offset commits (logged, not fatal)
    std::uint64_t rebalances = 0;        ///< assignments and revocations
    std::uint64_t kafka_errors = 0;      ///< consumer error events from librdkafka
    std::uint64_t retries = 0;           ///< handler failures scheduled for another attempt
    std::uint64_t transaction_retries = 0; ///< transactions re-run after 40001/40P01
    std::uint64_t batch_splits = 0;      ///< batch handler failures (re-run with one call per record)
    std::uint64_t dead_letter_failures = 0; ///< dead-letter produces not acknowledged (record retried)
    std::uint64_t fenced_writes = 0;     ///< position writes refused: a stale member was fenced off
    std::uint64_t beyond_dedup_horizon = 0; ///< events older than the dedup horizon (any policy)
    std::uint64_t horizon_processed = 0; ///< of those, handed on by policy or reconcile hook
    std::uint64_t key_window_closed = 0; ///< records handled after their downstream key window
    std::uint64_t outbox_published = 0;  ///< outbox rows published by the consumer's relay
    std::uint64_t outbox_failures = 0;   ///< outbox rows not acknowledged (retried)
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
    std::uint64_t dead_lettered_for(DeadLetterReason r) const noexcept
    {
        return dead_lettered[static_cast<std::size_t>(r)];
    }
    /// Gauges.
    std::int64_t assigned_partitions = 0; ///< partitions currently assigned
    /// Records not yet processed on the assigned partitions (high watermark
    /// minus position), -1 while unknown (no assignment or no fetch yet).
    std::int64_t lag = -1;

    /// Prometheus text exposition (metric names prefixed `idemkafka_`, one
    /// `group` label).
    std::string to_prometheus(const std::string& group) const;
};

/// Live counters, updated by the consumer thread and readable from any thread.
class Metrics {
public:
    struct Counter {
        std::atomic<std::uint64_t> value{0};
        void add(std::uint64_t n = 1) noexcept { value.fetch_add(n, std::memory_order_relaxed); }
        std::uint64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
    };

    struct Gauge {
        std::atomic<std::int64_t> value{0};
        void set(std::int64_t v) noexcept { value.store(v, std::memory_order_relaxed); }
        std::int64_t get() const noexcept { return value.load(std::memory_order_relaxed); }
    };

    Counter consumed, claimed, duplicates, decode_errors, invalid_event_ids, handler_failures,
        db_commits, db_failures, db_reconnects, offset_commits, offset_commit_failures,
        rebalances, kafka_errors, retries, transaction_retries, batch_splits, dead_letter_failures, fenced_writes,
        beyond_dedup_horizon, horizon_processed, key_window_closed, outbox_published, outbox_failures;
    std::array<Counter, dead_letter_reason_count> dead_lettered;
    /// Fixed-bucket histogram; observe() is lock-free.
    class Histogram {
    public:
        explicit Histogram(std::vector<double> bounds);
        void observe(double v) noexcept;
        HistogramSnapshot snapshot() const;

    private:
        std::vector<double> bounds_;
        std::unique_ptr<std::atomic<std::uint64_t>[]> counts_; // per bucket, not cumulative
        std::atomic<std::uint64_t> count_{0};
        std::atomic<std::uint64_t> sum_micro_{0}; // sum in millionths, to stay lock-free
    };

    Histogram handler_seconds{{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}};
    Histogram batch_records{{1, 10, 50, 100, 250, 500, 1000, 5000}};
    Histogram commit_delay_seconds{{0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1}};
    Gauge assigned_partitions;
    Gauge lag{{-1}};

    /// Copies every counter.
    MetricsSnapshot snapshot() const;
};

} // namespace idemkafka
