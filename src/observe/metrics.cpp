#include "idemkafka/metrics.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "observe/metrics_access.hpp"

namespace idemkafka {
namespace {

struct CounterDesc {
    const char* name;
    const char* help;
    std::uint64_t MetricsSnapshot::*field;
};

constexpr CounterDesc counters[] = {
    {"consumed", "Records polled from Kafka.", &MetricsSnapshot::consumed},
    {"claimed", "Records whose handler ran and committed.", &MetricsSnapshot::claimed},
    {"duplicates", "Records skipped because their event id was already claimed.", &MetricsSnapshot::duplicates},
    {"decode_errors", "Records the decoder rejected.", &MetricsSnapshot::decode_errors},
    {"invalid_event_ids", "Records without a usable event id.", &MetricsSnapshot::invalid_event_ids},
    {"handler_failures", "Handler exceptions.", &MetricsSnapshot::handler_failures},
    {"db_commits", "PostgreSQL transactions committed.", &MetricsSnapshot::db_commits},
    {"db_failures", "PostgreSQL errors outside the handler.", &MetricsSnapshot::db_failures},
    {"db_reconnects", "PostgreSQL reconnections after a failure.", &MetricsSnapshot::db_reconnects},
    {"offset_commits", "Successful Kafka offset commits.", &MetricsSnapshot::offset_commits},
    {"offset_commit_failures", "Failed Kafka offset commits.", &MetricsSnapshot::offset_commit_failures},
    {"rebalances", "Partition assignments and revocations.", &MetricsSnapshot::rebalances},
    {"kafka_errors", "Consumer error events from the Kafka client.", &MetricsSnapshot::kafka_errors},
    {"retries", "Handler failures scheduled for another attempt.", &MetricsSnapshot::retries},
    {"batch_splits", "Batch handler failures followed by one call per record to find the failing one.",
     &MetricsSnapshot::batch_splits},
    {"transaction_retries", "Transactions re-run after a serialization failure or deadlock.",
     &MetricsSnapshot::transaction_retries},
    {"optimistic_claim_fallbacks",
     "Claims of ids expected new that met a claimed id and were made again with ON CONFLICT DO NOTHING.",
     &MetricsSnapshot::optimistic_claim_fallbacks},
    {"dead_letter_failures", "Dead-letter records the broker did not acknowledge.",
     &MetricsSnapshot::dead_letter_failures},
    {"beyond_dedup_horizon", "Events older than the dedup horizon.", &MetricsSnapshot::beyond_dedup_horizon},
    {"horizon_processed", "Events beyond the dedup horizon handed on by policy or reconcile hook.",
     &MetricsSnapshot::horizon_processed},
    {"key_window_closed", "Records handled after their downstream idempotency-key window.",
     &MetricsSnapshot::key_window_closed},
    {"outbox_published", "Outbox rows published by the consumer's relay.", &MetricsSnapshot::outbox_published},
    {"outbox_failures", "Outbox rows the broker did not acknowledge.", &MetricsSnapshot::outbox_failures},
    {"fenced_writes", "Position writes refused because another member owns the partition.",
     &MetricsSnapshot::fenced_writes},
    {"positions_behind_kafka",
     "Assignments whose stored position was behind Kafka's committed offset (offsets_in_database; lost commits).",
     &MetricsSnapshot::positions_behind_kafka},
    {"records_behind_kafka", "Records between such stored positions and Kafka's committed offsets, processed again.",
     &MetricsSnapshot::records_behind_kafka},
    {"positions_lost",
     "Partitions found without any stored position after a reconnect, though this member had stored some "
     "(offsets_in_database; lost commits); processed again from where it began them.",
     &MetricsSnapshot::positions_lost},
    {"frozen_members_ended", "Sessions of frozen members (idle in a transaction past frozen_member_timeout) ended.",
     &MetricsSnapshot::frozen_members_ended},
    {"lost_sessions_ended",
     "Own PostgreSQL sessions ended at a reconnect: lost on the client's side only, kept by the server.",
     &MetricsSnapshot::lost_sessions_ended},
    {"db_timeouts", "Connections to PostgreSQL cut after a step of the consumer waited past db_timeout.",
     &MetricsSnapshot::db_timeouts},
    {"lock_timeouts", "Transactions that waited for a lock longer than lock_timeout (retried after a backoff).",
     &MetricsSnapshot::lock_timeouts},
    {"handler_aborted_transactions",
     "Handler calls that returned with their transaction aborted (a database error caught and not rethrown).",
     &MetricsSnapshot::handler_aborted_transactions},
    {"long_call_waits", "Handler calls waited for past the keep-alive point, with the assignment paused and polled.",
     &MetricsSnapshot::long_call_waits},
    {"stuck_calls", "Handler calls still running past max.poll.interval.ms (logged as errors naming the record).",
     &MetricsSnapshot::stuck_calls},
    {"revoke_abandons", "Running transactions abandoned because a rebalance took their partitions during a long call.",
     &MetricsSnapshot::revoke_abandons},
    {"parked", "Records parked behind a failed record of their key (Ordering::key).", &MetricsSnapshot::parked},
    {"parking_overflows", "Partitions held as a whole because their parked records did not fit (Ordering::key).",
     &MetricsSnapshot::parking_overflows},
    {"prefetch_pauses",
     "Times a partition's fetch was paused because the records held for it reached the prefetch caps' share.",
     &MetricsSnapshot::prefetch_pauses},
    {"circuit_opened", "Times the circuit breaker opened: handler failures across keys judged an outage.",
     &MetricsSnapshot::circuit_opened},
    {"circuit_gave_up",
     "Times the circuit breaker, open past give_up_after with no handler success, counted failures again.",
     &MetricsSnapshot::circuit_gave_up},
};

template <class T>
void render_gauge(std::string& out, const char* name, const char* help, const std::string& label, T value)
{
    out += fmt::format("# HELP idemkafka_{0} {1}\n# TYPE idemkafka_{0} gauge\nidemkafka_{0}{{group=\"{2}\"}} {3}\n",
                       name, help, label, value);
}

void render_histogram(std::string& out, const char* name, const char* help, const std::string& label,
                      const HistogramSnapshot& h)
{
    out += fmt::format("# HELP idemkafka_{} {}\n# TYPE idemkafka_{} histogram\n", name, help, name);
    for (std::size_t i = 0; i < h.bounds.size(); ++i)
        out +=
            fmt::format("idemkafka_{}_bucket{{group=\"{}\",le=\"{}\"}} {}\n", name, label, h.bounds[i], h.buckets[i]);
    out += fmt::format("idemkafka_{}_bucket{{group=\"{}\",le=\"+Inf\"}} {}\n", name, label, h.count);
    out += fmt::format("idemkafka_{}_sum{{group=\"{}\"}} {}\n", name, label, h.sum);
    out += fmt::format("idemkafka_{}_count{{group=\"{}\"}} {}\n", name, label, h.count);
}

std::string escape_label(const std::string& v)
{
    std::string out;
    out.reserve(v.size());
    for (char c : v) {
        if (c == '\\' || c == '"')
            out.push_back('\\');
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out.push_back(c);
    }
    return out;
}

// The counters: those of the table, the histograms and the dead letters by reason.
void render_counters(std::string& out, const MetricsSnapshot& s, const std::string& label)
{
    for (const auto& c : counters) {
        out += fmt::format("# HELP idemkafka_{}_total {}\n# TYPE idemkafka_{}_total counter\n"
                           "idemkafka_{}_total{{group=\"{}\"}} {}\n",
                           c.name, c.help, c.name, c.name, label, s.*c.field);
    }
    render_histogram(out, "handler_seconds", "Handler call duration.", label, s.handler_seconds);
    render_histogram(out, "batch_records", "Records per committed batch.", label, s.batch_records);
    render_histogram(out, "commit_delay_seconds", "From the PostgreSQL commit to the Kafka offset commit.", label,
                     s.commit_delay_seconds);
    out += "# HELP idemkafka_dead_lettered_total Records sent to the dead-letter topic.\n"
           "# TYPE idemkafka_dead_lettered_total counter\n";
    for (std::size_t i = 0; i < dead_letter_reason_count; ++i)
        out += fmt::format("idemkafka_dead_lettered_total{{group=\"{}\",reason=\"{}\"}} {}\n", label,
                           to_string(static_cast<DeadLetterReason>(i)), s.dead_lettered[i]);
}

// The assignment and its lag, as a whole and per partition.
void render_lag(std::string& out, const MetricsSnapshot& s, const std::string& label)
{
    render_gauge(out, "assigned_partitions", "Partitions currently assigned.", label, s.assigned_partitions);
    render_gauge(out, "lag", "Records not yet processed on the assigned partitions (-1: unknown).", label, s.lag);
    out += "# HELP idemkafka_consumer_lag Records not yet processed on one assigned partition (-1: unknown).\n"
           "# TYPE idemkafka_consumer_lag gauge\n";
    for (const auto& p : s.partitions)
        out += fmt::format("idemkafka_consumer_lag{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {}\n", label,
                           escape_label(p.topic), p.partition, p.lag);
    out += "# HELP idemkafka_lag_seconds Seconds from the timestamp of the first record not yet processed on one "
           "assigned partition to now (0: caught up, -1: unknown).\n"
           "# TYPE idemkafka_lag_seconds gauge\n";
    for (const auto& p : s.partitions)
        out += fmt::format("idemkafka_lag_seconds{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {:.3f}\n", label,
                           escape_label(p.topic), p.partition, p.lag_seconds);
}

// What the consumer holds in memory: records in flight, prefetched and parked.
void render_held(std::string& out, const MetricsSnapshot& s, const std::string& label)
{
    render_gauge(out, "in_flight_records", "Records taken from Kafka and not yet committed or skipped.", label,
                 s.in_flight_records);
    render_gauge(out, "in_flight_bytes", "Key and payload bytes of the records in flight.", label, s.in_flight_bytes);
    render_gauge(out, "prefetched_records",
                 "Records taken from the Kafka client and held per partition, not handed to processing yet.", label,
                 s.prefetched_records);
    render_gauge(out, "prefetched_bytes", "Key and payload bytes of the prefetched records held.", label,
                 s.prefetched_bytes);
    render_gauge(out, "parked_records", "Records parked now behind a failed record of their key.", label,
                 s.parked_records);
    render_gauge(out, "parked_keys", "Keys parked now after a failed record.", label, s.parked_keys);
}

} // namespace

std::string MetricsSnapshot::to_prometheus(const std::string& group) const
{
    std::string out;
    const std::string label = escape_label(group);
    render_counters(out, *this, label);
    render_lag(out, *this, label);
    render_held(out, *this, label);
    render_gauge(out, "oldest_claim_age_seconds", "Age of the group's oldest claim in the claims table (-1: unknown).",
                 label, oldest_claim_age_seconds);
    render_gauge(out, "expired_partitions_kept",
                 "Expired claim partitions the latest maintenance run could not drop (lock_timeout).", label,
                 expired_partitions_kept);
    render_gauge(out, "stalled_partitions",
                 "Assigned partitions not paused that have fetched nothing for fetch_stall_after though records wait.",
                 label, stalled_partitions);
    render_gauge(out, "db_paused", "1 while PostgreSQL is away and the assignment is paused.", label, db_paused);
    out += "# HELP idemkafka_partition_stalled_seconds Seconds one assigned partition's position has not moved while "
           "records wait.\n# TYPE idemkafka_partition_stalled_seconds gauge\n";
    for (const auto& p : partitions)
        out += fmt::format("idemkafka_partition_stalled_seconds{{group=\"{}\",topic=\"{}\",partition=\"{}\"}} {:.3f}\n",
                           label, escape_label(p.topic), p.partition, p.stalled_seconds);
    render_gauge(out, "circuit_open", "1 while the circuit breaker holds the assignment (open or probing).", label,
                 circuit_open);
    render_gauge(out, "oldest_call_seconds", "Seconds the oldest handler call running now has run (0: none).", label,
                 oldest_call_seconds);
    out += fmt::format("# HELP idemkafka_circuit_open_seconds_total Seconds the circuit breaker was open or probing.\n"
                       "# TYPE idemkafka_circuit_open_seconds_total counter\n"
                       "idemkafka_circuit_open_seconds_total{{group=\"{}\"}} {}\n",
                       label, circuit_open_seconds);
    return out;
}

const char* to_string(LagSource source) noexcept
{
    return source == LagSource::statistics ? "statistics" : "watermarks";
}

Metrics::Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<std::uint64_t>[bounds_.size() + 1])
{
    for (std::size_t i = 0; i <= bounds_.size(); ++i)
        counts_[i].store(0);
}

void Metrics::Histogram::observe(double v) noexcept
{
    std::size_t i = 0;
    while (i < bounds_.size() && v > bounds_[i])
        ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
    sum_micro_.fetch_add(static_cast<std::uint64_t>(v < 0 ? 0 : v * 1e6), std::memory_order_relaxed);
}

HistogramSnapshot Metrics::Histogram::snapshot() const
{
    HistogramSnapshot h;
    h.bounds = bounds_;
    std::uint64_t running = 0;
    for (std::size_t i = 0; i < bounds_.size(); ++i) {
        running += counts_[i].load(std::memory_order_relaxed);
        h.buckets.push_back(running);
    }
    h.count = count_.load(std::memory_order_relaxed);
    h.sum = static_cast<double>(sum_micro_.load(std::memory_order_relaxed)) / 1e6;
    return h;
}

namespace {

// The counters, the dead letters by reason among them.
void copy_counters(const Metrics& m, MetricsSnapshot& s)
{
    s.consumed = m.consumed.get();
    s.claimed = m.claimed.get();
    s.duplicates = m.duplicates.get();
    s.decode_errors = m.decode_errors.get();
    s.invalid_event_ids = m.invalid_event_ids.get();
    s.handler_failures = m.handler_failures.get();
    s.db_commits = m.db_commits.get();
    s.db_failures = m.db_failures.get();
    s.db_reconnects = m.db_reconnects.get();
    s.offset_commits = m.offset_commits.get();
    s.offset_commit_failures = m.offset_commit_failures.get();
    s.rebalances = m.rebalances.get();
    s.kafka_errors = m.kafka_errors.get();
    s.retries = m.retries.get();
    s.transaction_retries = m.transaction_retries.get();
    s.optimistic_claim_fallbacks = m.optimistic_claim_fallbacks.get();
    s.batch_splits = m.batch_splits.get();
    s.dead_letter_failures = m.dead_letter_failures.get();
    s.fenced_writes = m.fenced_writes.get();
    s.positions_behind_kafka = m.positions_behind_kafka.get();
    s.records_behind_kafka = m.records_behind_kafka.get();
    s.positions_lost = m.positions_lost.get();
    s.lock_timeouts = m.lock_timeouts.get();
    s.frozen_members_ended = m.frozen_members_ended.get();
    s.lost_sessions_ended = m.lost_sessions_ended.get();
    s.db_timeouts = m.db_timeouts.get();
    s.handler_aborted_transactions = m.handler_aborted_transactions.get();
    s.long_call_waits = m.long_call_waits.get();
    s.stuck_calls = m.stuck_calls.get();
    s.revoke_abandons = m.revoke_abandons.get();
    s.parked = m.parked.get();
    s.parking_overflows = m.parking_overflows.get();
    s.prefetch_pauses = m.prefetch_pauses.get();
    s.circuit_opened = m.circuit_opened.get();
    s.circuit_gave_up = m.circuit_gave_up.get();
    s.circuit_open_seconds = static_cast<double>(m.circuit_open_ms.get()) / 1000.0;
    s.beyond_dedup_horizon = m.beyond_dedup_horizon.get();
    s.horizon_processed = m.horizon_processed.get();
    s.key_window_closed = m.key_window_closed.get();
    s.outbox_published = m.outbox_published.get();
    s.outbox_failures = m.outbox_failures.get();
    for (std::size_t i = 0; i < dead_letter_reason_count; ++i)
        s.dead_lettered[i] = m.dead_lettered[i].get();
}

// The histograms and the gauges.
void copy_gauges(const Metrics& m, MetricsSnapshot& s)
{
    s.handler_seconds = m.handler_seconds.snapshot();
    s.batch_records = m.batch_records.snapshot();
    s.commit_delay_seconds = m.commit_delay_seconds.snapshot();
    s.assigned_partitions = m.assigned_partitions.get();
    s.lag = m.lag.get();
    s.partitions = m.partitions();
    s.in_flight_records = m.in_flight_records.get();
    s.in_flight_bytes = m.in_flight_bytes.get();
    s.prefetched_records = m.prefetched_records.get();
    s.prefetched_bytes = m.prefetched_bytes.get();
    s.parked_records = m.parked_records.get();
    s.parked_keys = m.parked_keys.get();
    s.oldest_claim_unix_ms = m.oldest_claim_unix_ms.get();
    s.expired_partitions_kept = m.expired_partitions_kept.get();
    s.stalled_partitions = m.stalled_partitions.get();
    s.circuit_open = m.circuit_open.get();
    s.oldest_call_seconds = static_cast<double>(m.oldest_call_ms.get()) / 1000.0;
    s.db_paused = m.db_paused.get();
    s.loop_heartbeat_unix_ms = m.loop_heartbeat_unix_ms.get();
}

} // namespace

MetricsSnapshot Metrics::snapshot() const
{
    MetricsSnapshot s;
    copy_counters(*this, s);
    copy_gauges(*this, s);
    if (s.oldest_claim_unix_ms >= 0) {
        const auto now_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count();
        s.oldest_claim_age_seconds =
            static_cast<double>(std::max<std::int64_t>(0, now_ms - s.oldest_claim_unix_ms)) / 1000.0;
    }
    return s;
}

void detail::MetricsAccess::set_partitions(Metrics& metrics, std::vector<PartitionLag> partitions)
{
    std::lock_guard<std::mutex> lock(metrics.partitions_mu_);
    metrics.partitions_.swap(partitions);
}

std::vector<PartitionLag> Metrics::partitions() const
{
    std::lock_guard<std::mutex> lock(partitions_mu_);
    return partitions_;
}

std::uint64_t MetricsSnapshot::dead_lettered_total() const noexcept
{
    std::uint64_t n = 0;
    for (auto v : dead_lettered)
        n += v;
    return n;
}

} // namespace idemkafka
