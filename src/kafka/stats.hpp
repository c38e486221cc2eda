#pragma once
// The per-partition part of librdkafka's statistics JSON
// (statistics.interval.ms). Private to the library.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace idemkafka::detail::kafka {

/// One partition's figures from a statistics event; -1 where librdkafka has
/// none (it reports -1 or -1001 for an unknown offset).
struct PartitionStats {
    std::string topic;
    std::int32_t partition = 0;
    std::int64_t hi_offset = -1;        ///< high watermark
    std::int64_t ls_offset = -1;        ///< last stable offset (the end under read_committed)
    std::int64_t committed_offset = -1; ///< last committed offset known to the client
    std::int64_t consumer_lag = -1;     ///< librdkafka's lag: end - max(stored, committed)

    /// consumer_lag, else end (ls_offset, or hi_offset without one) minus
    /// committed_offset, else -1.
    std::int64_t lag() const noexcept;
};

/// The real partitions (not librdkafka's internal partition -1) of every topic
/// in a statistics document. Returns an empty list for text that is not such a
/// document; never throws except std::bad_alloc.
std::vector<PartitionStats> parse_partition_stats(std::string_view json);

} // namespace idemkafka::detail::kafka
