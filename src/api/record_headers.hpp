#pragma once

#include <string_view>

#include "idemkafka/context.hpp"

namespace idemkafka::detail {

// The last header called `name`, as the Java clients' lastHeader() reads a
// repeated one (Kafka Connect and the CloudEvents SDK write through them).
inline const Header* last_header(const Record& record, std::string_view name) noexcept
{
    const Header* found = nullptr;
    for (const auto& h : record.headers)
        if (h.name == name)
            found = &h;
    return found;
}

} // namespace idemkafka::detail
