#pragma once
// The latest per-partition statistics of the group member's client
// (statistics.interval.ms). Pure logic, no client. Private to the library.

#include <chrono>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

#include "core/ledger.hpp"
#include "kafka/stats.hpp"

namespace idemkafka::detail::kafka {

/// A partition's figures from the latest statistics event.
struct StatsEntry {
    PartitionStats stats;
    std::chrono::steady_clock::time_point at;
};

/// The figures of the latest statistics event, per partition.
///
/// Invariant: empty until enable() (statistics not configured); each
/// update() replaces the whole map, so a partition gone from the assignment
/// goes from it with the next event, and a text that is not a statistics
/// document empties it. Updates and reads hold one mutex: the event may be
/// served on any thread.
class LatestStats {
public:
    /// Statistics are configured: update() keeps what it is given.
    void enable() noexcept { enabled_ = true; }
    bool enabled() const noexcept { return enabled_; }

    /// A statistics event's JSON, received at `now`. Out of memory, the
    /// previous figures stay.
    void update(std::string_view json, std::chrono::steady_clock::time_point now) noexcept
    {
        if (!enabled_)
            return;
        try {
            std::map<TopicPartition, StatsEntry> latest;
            for (auto& fig : parse_partition_stats(json)) {
                TopicPartition tp{fig.topic, fig.partition};
                latest[std::move(tp)] = StatsEntry{std::move(fig), now};
            }
            std::lock_guard<std::mutex> lock(mu_);
            latest_.swap(latest);
        } catch (...) {
            // Out of memory: the lag keeps its previous figures.
        }
    }

    /// A copy of the latest figures (empty when not enabled).
    std::map<TopicPartition, StatsEntry> snapshot()
    {
        if (!enabled_)
            return {};
        std::lock_guard<std::mutex> lock(mu_);
        return latest_;
    }

private:
    bool enabled_ = false; // set before the client exists, read-only after
    std::mutex mu_;
    std::map<TopicPartition, StatsEntry> latest_; // under mu_
};

} // namespace idemkafka::detail::kafka
