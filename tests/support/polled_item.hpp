#pragma once
// A polled record for the unit tests of the consumer's parts, with no Kafka
// message behind it: key and value point into storage the test keeps.

#include <cstdint>
#include <optional>
#include <string_view>

#include "consumer/item.hpp"

namespace idemkafka::test {

inline detail::Item polled(detail::PartitionState& ps, std::int64_t offset,
                           std::optional<std::string_view> key = std::nullopt,
                           std::optional<std::string_view> value = std::nullopt)
{
    detail::Item it;
    it.record.topic = ps.tp.topic;
    it.record.partition = ps.tp.partition;
    it.record.offset = offset;
    it.record.key = key;
    it.record.value = value;
    it.part = &ps;
    return it;
}

} // namespace idemkafka::test
