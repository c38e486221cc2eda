#pragma once
// The event the kit's own tests run through a consumer or a HandlerHarness:
// the payload "charge:<event id>:<amount>".

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>

namespace kit_test {

struct Charge {
    idemkafka::EventId id;
    std::int64_t amount = 0;
};

inline std::string encode(const Charge& c)
{
    return fmt::format("charge:{}:{}", c.id.to_string(), c.amount);
}

inline Charge decode(std::string_view payload)
{
    constexpr std::string_view prefix = "charge:";
    const auto colon = payload.rfind(':');
    if (payload.substr(0, prefix.size()) != prefix || colon == std::string_view::npos || colon < prefix.size())
        throw idemkafka::DecodeError("not a charge");
    Charge c;
    c.id = idemkafka::EventId::parse(payload.substr(prefix.size(), colon - prefix.size()));
    c.amount = std::stoll(std::string(payload.substr(colon + 1)));
    return c;
}

inline idemkafka::EventId event_id_of(const Charge& c)
{
    return c.id;
}

} // namespace kit_test
