#pragma once
// What the consumer writes into Metrics besides its counters and gauges.
// Private to the library.

#include <utility>
#include <vector>

#include "idemkafka/metrics.hpp"

namespace idemkafka::detail {

struct MetricsAccess {
    /// Replaces the per-partition lags of `metrics` (the consumer thread, after
    /// each lag update).
    static void set_partitions(Metrics& metrics, std::vector<PartitionLag> partitions);
};

/// MetricsAccess::set_partitions().
inline void set_partitions(Metrics& metrics, std::vector<PartitionLag> partitions)
{
    MetricsAccess::set_partitions(metrics, std::move(partitions));
}

} // namespace idemkafka::detail
