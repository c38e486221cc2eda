#include "consumer/lag.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "observe/metrics_access.hpp"

namespace idemkafka::detail {
namespace {

using kafka::offset_invalid;

void learn_start_offsets(PartitionLedger& ledger, kafka::GroupMember& consumer)
{
    std::vector<std::pair<TopicPartition, std::int64_t>> wanted;
    for (const auto& [tp, ps] : ledger)
        if (ps.processed_next < 0 && !ps.lag.start_known)
            wanted.push_back({tp, offset_invalid});
    if (wanted.empty() || !consumer.committed(wanted, std::chrono::milliseconds(2000)))
        return; // none, or try again at the next update
    for (const auto& [tp, offset] : wanted)
        if (auto* ps = ledger.find(tp.topic, tp.partition); ps && offset != kafka::offset_unknown) {
            ps->lag.start_offset = offset;
            ps->lag.start_known = true;
        }
}

} // namespace

void update_lag(PartitionLedger& ledger, kafka::GroupMember& consumer, Metrics& metrics)
{
    metrics.assigned_partitions.set(static_cast<std::int64_t>(ledger.size()));
    if (ledger.empty()) {
        metrics.lag.set(-1);
        set_partitions(metrics, {});
        return;
    }
    learn_start_offsets(ledger, consumer);
    const auto latest = consumer.statistics();
    std::vector<PartitionLag> rows;
    rows.reserve(ledger.size());
    std::int64_t total = 0;
    bool known = true;
    const auto now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    for (auto& [tp, ps] : ledger) {
        PartitionLag row;
        row.topic = tp.topic;
        row.partition = tp.partition;
        row.committed = ps.committed_next >= 0 ? ps.committed_next
                        : ps.lag.start_known   ? std::max<std::int64_t>(-1, ps.lag.start_offset)
                                               : -1;
        const auto [lo, hi] = consumer.watermarks(tp);
        std::int64_t pos = ps.processed_next >= 0 ? ps.processed_next : ps.lag.start_offset;
        if (pos == offset_invalid)
            pos = consumer.reset_to_latest() ? hi : lo;
        row.position = std::max<std::int64_t>(-1, pos);
        row.high_watermark = std::max<std::int64_t>(-1, hi);
        if (hi >= 0 && pos >= 0)
            row.lag = std::max<std::int64_t>(0, hi - std::max(pos, lo));
        auto st = latest.find(tp);
        if (st != latest.end() && st->second.at > ps.lag.assigned_at && st->second.stats.lag() >= 0) {
            const auto& fig = st->second.stats;
            row.source = LagSource::statistics;
            row.lag = fig.lag();
            row.committed = fig.committed_offset;
            row.high_watermark = fig.hi_offset;
        }
        row.lag_seconds = PartitionLedger::lag_seconds(ps, row.lag, now_ms);
        if (ps.position() != ps.lag.seen_position || row.lag <= 0) {
            ps.lag.seen_position = ps.position();
            ps.lag.seen_position_at = Clock::now();
        }
        row.stalled_seconds = std::chrono::duration<double>(Clock::now() - ps.lag.seen_position_at).count();
        if (row.lag < 0)
            known = false;
        else
            total += row.lag;
        rows.push_back(std::move(row));
    }
    std::sort(rows.begin(), rows.end(), [](const PartitionLag& a, const PartitionLag& b) {
        return a.topic != b.topic ? a.topic < b.topic : a.partition < b.partition;
    });
    metrics.lag.set(known ? total : -1);
    set_partitions(metrics, std::move(rows));
}

namespace {

// True when `ps` has records waiting past its position (asked of the leader);
// the error line the first time.
bool stalled_now(PartitionState& ps, kafka::GroupMember& consumer, const LogSink& log, std::chrono::milliseconds bound)
{
    const auto marks = consumer.query_watermarks(ps.tp, std::chrono::milliseconds(1000));
    if (!marks)
        return false; // the leader did not answer: asked again after another bound
    const std::int64_t pos = ps.processed_next >= 0                           ? ps.processed_next
                             : ps.lag.start_known && ps.lag.start_offset >= 0 ? ps.lag.start_offset
                                                                              : marks->first;
    if (marks->second <= std::max(pos, marks->first))
        return false;
    emit(log, LogLevel::error,
         fmt::format("{}/{} is assigned and not paused, but no record of it has arrived for {} ms although the "
                     "partition has {} record(s) past this member's position {}: its fetch never started or "
                     "stopped (stalled_partitions counts it until a record arrives)",
                     ps.tp.topic, ps.tp.partition, bound.count(), marks->second - std::max(pos, marks->first), pos),
         "consumer",
         {{log_field::topic, ps.tp.topic},
          {log_field::partition, std::to_string(ps.tp.partition)},
          {"position", std::to_string(pos)},
          {"high_watermark", std::to_string(marks->second)}});
    return true;
}

} // namespace

void watch_fetch_stalls(PartitionLedger& ledger, kafka::GroupMember& consumer, Metrics& metrics, const LogSink& log,
                        std::chrono::milliseconds bound)
{
    const auto now = Clock::now();
    std::int64_t stalled = 0;
    for (auto& [tp, ps] : ledger) {
        if (consumer.held_back(tp) || ps.unit != 0 || !ps.in_flight.empty() || !ps.parked.empty())
            ps.lag.fetched_at = now; // not expected to fetch now
        if (now - ps.lag.fetched_at < bound) {
            ps.lag.stalled = false;
            continue;
        }
        if (!ps.lag.stalled) {
            ps.lag.stalled = stalled_now(ps, consumer, log, bound);
            if (!ps.lag.stalled)
                ps.lag.fetched_at = now; // nothing to fetch: looked at again after another bound
        }
        if (ps.lag.stalled)
            ++stalled;
    }
    metrics.stalled_partitions.set(stalled);
}

} // namespace idemkafka::detail
