// The retention enums as text.

#include <string_view>

#include <fmt/format.h>

#include "idemkafka/config.hpp"
#include "idemkafka/error.hpp"

namespace idemkafka {

std::string_view to_string(RetentionMode mode) noexcept
{
    return mode == RetentionMode::purge ? "purge" : "partitioned";
}

std::string_view to_string(HorizonPolicy policy) noexcept
{
    switch (policy) {
    case HorizonPolicy::reconcile:
        return "reconcile";
    case HorizonPolicy::process:
        return "process";
    case HorizonPolicy::dead_letter:
        break;
    }
    return "dead_letter";
}

std::string_view to_string(NonV7Policy policy) noexcept
{
    return policy == NonV7Policy::process ? "process" : "dead_letter";
}

RetentionMode parse_retention_mode(std::string_view text)
{
    if (text == "partitioned")
        return RetentionMode::partitioned;
    if (text == "purge")
        return RetentionMode::purge;
    throw ConfigError(fmt::format("mode: '{}' is not a retention mode (partitioned or purge)", text));
}

HorizonPolicy parse_horizon_policy(std::string_view text)
{
    if (text == "dead_letter")
        return HorizonPolicy::dead_letter;
    if (text == "reconcile")
        return HorizonPolicy::reconcile;
    if (text == "process")
        return HorizonPolicy::process;
    throw ConfigError(
        fmt::format("beyond_horizon: '{}' is not a horizon policy (dead_letter, reconcile or process)", text));
}

NonV7Policy parse_non_v7_policy(std::string_view text)
{
    if (text == "dead_letter")
        return NonV7Policy::dead_letter;
    if (text == "process")
        return NonV7Policy::process;
    throw ConfigError(fmt::format("non_v7: '{}' is not a policy for non-v7 ids (dead_letter or process)", text));
}

} // namespace idemkafka
