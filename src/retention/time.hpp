#pragma once
// Time as retention counts it: Unix milliseconds, clamped to what a UUIDv7
// timestamp holds, and the UTC text of reports and logs. Private to the library.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

#include <fmt/format.h>

#include "idemkafka/event_id.hpp"

namespace idemkafka::detail::retention {

using TimePoint = std::chrono::system_clock::time_point;

/// 48 bits of milliseconds: the most a UUIDv7 timestamp can hold.
constexpr std::int64_t max_uuid_ms = (std::int64_t{1} << 48) - 1;

inline std::int64_t to_ms(TimePoint t)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

inline TimePoint from_ms(std::int64_t ms)
{
    return TimePoint(std::chrono::milliseconds(ms));
}

/// a / b rounded toward negative infinity.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b)
{
    const std::int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

inline std::int64_t clamp_ms(std::int64_t ms)
{
    return std::clamp<std::int64_t>(ms, 0, max_uuid_ms);
}

/// The timestamp of a UUIDv7 (or of a partition bound): its first 48 bits.
inline std::int64_t bound_ms(const EventId& id)
{
    std::int64_t ms = 0;
    for (std::size_t i = 0; i < 6; ++i)
        ms = (ms << 8) | id.bytes()[i];
    return ms;
}

/// "YYYY-MM-DDTHH:MM:SS[.mmm]Z".
inline std::string iso_utc(TimePoint t)
{
    const std::int64_t ms = to_ms(t);
    const auto secs = static_cast<std::time_t>(floor_div(ms, 1000));
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    const std::int64_t frac = ms - floor_div(ms, 1000) * 1000;
    return frac ? fmt::format("{}.{:03}Z", buf, frac) : fmt::format("{}Z", buf);
}

} // namespace idemkafka::detail::retention
