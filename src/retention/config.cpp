// RetentionConfig's checks.

#include <chrono>
#include <string>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/retention.hpp"

namespace idemkafka {
namespace {

// The most partitions retention keeps at once.
constexpr std::size_t max_partitions = 1000;

} // namespace

void RetentionConfig::validate() const
{
    auto require = [](bool ok, const std::string& what) {
        if (!ok)
            throw ConfigError(what);
    };
    const std::chrono::milliseconds minute = std::chrono::minutes(1);
    require(retention >= minute, "retention: must be at least one minute");
    require(partition_width >= minute, "partition_width: must be at least one minute");
    require(partition_width.count() % minute.count() == 0,
            "partition_width: must be a whole number of minutes (partition names carry the start minute)");
    require(partition_width <= retention, "partition_width: must not exceed retention");
    require(partitions_ahead >= 1, "partitions_ahead: must be at least 1");
    require(static_cast<std::size_t>(retention / partition_width) + partitions_ahead <= max_partitions,
            fmt::format("partition_width: retention / partition_width + partitions_ahead must not exceed {} "
                        "partitions; use wider partitions",
                        max_partitions));
    require(purge_batch >= 1 && purge_batch <= 1000000, "purge_batch: must be between 1 and 1000000");
    require(purge_pause.count() >= 0, "purge_pause: must not be negative");
    require(purge_max_batches >= 1, "purge_max_batches: must be at least 1");
    require(lock_timeout.count() > 0, "lock_timeout: must be positive");
    require(horizon_margin.count() >= 0, "horizon_margin: must not be negative");
    require(horizon_margin < retention, "horizon_margin: must be less than retention (the dedup horizon is "
                                        "retention - horizon_margin)");
    require(downstream_key_window.count() >= 0, "downstream_key_window: must not be negative (0 = not configured)");
    require(beyond_horizon != HorizonPolicy::reconcile || static_cast<bool>(reconcile),
            "reconcile: must be set when beyond_horizon is reconcile");
    require(maintenance_interval.count() > 0, "maintenance_interval: must be positive");
}

} // namespace idemkafka
