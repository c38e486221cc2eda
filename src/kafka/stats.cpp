#include "kafka/stats.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace idemkafka::detail::kafka {
namespace {

// librdkafka writes -1001 (RD_KAFKA_OFFSET_INVALID) for an unknown offset.
std::int64_t offset_field(const nlohmann::json& p, const char* name)
{
    const auto it = p.find(name);
    if (it == p.end() || !it->is_number_integer())
        return -1;
    const auto v = it->get<std::int64_t>();
    return v < 0 ? -1 : v;
}

} // namespace

std::int64_t PartitionStats::lag() const noexcept
{
    if (consumer_lag >= 0)
        return consumer_lag;
    const std::int64_t end = ls_offset >= 0 ? ls_offset : hi_offset;
    if (end < 0 || committed_offset < 0)
        return -1;
    return std::max<std::int64_t>(0, end - committed_offset);
}

std::vector<PartitionStats> parse_partition_stats(std::string_view json)
{
    std::vector<PartitionStats> out;
    const auto doc = nlohmann::json::parse(json.begin(), json.end(), nullptr, false);
    if (!doc.is_object())
        return out;
    const auto topics = doc.find("topics");
    if (topics == doc.end() || !topics->is_object())
        return out;
    for (const auto& [name, topic] : topics->items()) {
        const auto parts = topic.find("partitions");
        if (parts == topic.end() || !parts->is_object())
            continue;
        for (const auto& [key, p] : parts->items()) {
            if (!p.is_object())
                continue;
            const auto id = p.find("partition");
            if (id == p.end() || !id->is_number_integer() || id->get<std::int64_t>() < 0)
                continue; // -1: the internal unassigned partition
            PartitionStats s;
            s.topic = name;
            s.partition = id->get<std::int32_t>();
            s.hi_offset = offset_field(p, "hi_offset");
            s.ls_offset = offset_field(p, "ls_offset");
            s.committed_offset = offset_field(p, "committed_offset");
            s.consumer_lag = offset_field(p, "consumer_lag");
            out.push_back(std::move(s));
        }
    }
    return out;
}

} // namespace idemkafka::detail::kafka
