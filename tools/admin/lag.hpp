#pragma once
// Lag per partition of consumer groups: the committed offset, the log end, the
// records behind and, where the first unconsumed record can be read, the
// seconds behind (its timestamp against now). For `serve`.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace idemkafka::detail::admin {

struct PartitionLag {
    std::string group, topic;
    std::int32_t partition = 0;
    std::int64_t committed = -1; ///< -1: nothing committed
    std::int64_t log_start = -1, log_end = -1;
    std::optional<std::int64_t> records_behind; ///< nullopt without a committed offset
    std::optional<double> seconds_behind;       ///< 0 when caught up; nullopt when unknown
};

/// The lag of every partition of `topics` for each of `groups` (when `topics`
/// is empty: the topics each group has committed offsets for, as Kafka lists
/// them). Throws KafkaError when Kafka cannot be reached.
std::vector<PartitionLag> partition_lag(const std::string& brokers, const std::map<std::string, std::string>& kafka,
                                        const std::vector<std::string>& groups, const std::vector<std::string>& topics,
                                        std::chrono::milliseconds timeout);

/// The rows as a JSON array of {group, topic, partition, committed, log_start,
/// log_end, records_behind, seconds_behind} (null where unknown).
nlohmann::json lag_json(const std::vector<PartitionLag>& rows);
/// The rows as a table, one line each, with a header line.
std::vector<std::string> lag_lines(const std::vector<PartitionLag>& rows);

} // namespace idemkafka::detail::admin
