// The retention enums as text: each enum's names in one table that serves
// both directions.

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "idemkafka/config.hpp"
#include "idemkafka/error.hpp"

namespace idemkafka {
namespace {

template <class Enum, std::size_t N> using Names = std::array<std::pair<std::string_view, Enum>, N>;

// The first name is also the one of a value outside the enum's list.
constexpr Names<RetentionMode, 2> retention_modes{{
    {"partitioned", RetentionMode::partitioned},
    {"purge", RetentionMode::purge},
}};
constexpr Names<HorizonPolicy, 3> horizon_policies{{
    {"dead_letter", HorizonPolicy::dead_letter},
    {"reconcile", HorizonPolicy::reconcile},
    {"process", HorizonPolicy::process},
}};
constexpr Names<NonV7Policy, 2> non_v7_policies{{
    {"dead_letter", NonV7Policy::dead_letter},
    {"process", NonV7Policy::process},
}};

template <class Enum, std::size_t N> std::string_view name_of(Enum value, const Names<Enum, N>& names) noexcept
{
    for (const auto& [name, v] : names)
        if (v == value)
            return name;
    return names[0].first;
}

// The value named `text`; a ConfigError naming the option (`field`), what it
// takes (`kind`) and every name otherwise.
template <class Enum, std::size_t N>
Enum parse_name(std::string_view text, const Names<Enum, N>& names, std::string_view field, std::string_view kind)
{
    std::string choices;
    for (std::size_t i = 0; i < N; ++i) {
        if (names[i].first == text)
            return names[i].second;
        choices += i == 0 ? "" : i + 1 == N ? " or " : ", ";
        choices += names[i].first;
    }
    throw ConfigError(fmt::format("{}: '{}' is not {} ({})", field, text, kind, choices));
}

} // namespace

std::string_view to_string(RetentionMode mode) noexcept
{
    return name_of(mode, retention_modes);
}

std::string_view to_string(HorizonPolicy policy) noexcept
{
    return name_of(policy, horizon_policies);
}

std::string_view to_string(NonV7Policy policy) noexcept
{
    return name_of(policy, non_v7_policies);
}

RetentionMode parse_retention_mode(std::string_view text)
{
    return parse_name(text, retention_modes, "mode", "a retention mode");
}

HorizonPolicy parse_horizon_policy(std::string_view text)
{
    return parse_name(text, horizon_policies, "beyond_horizon", "a horizon policy");
}

NonV7Policy parse_non_v7_policy(std::string_view text)
{
    return parse_name(text, non_v7_policies, "non_v7", "a policy for non-v7 ids");
}

} // namespace idemkafka
