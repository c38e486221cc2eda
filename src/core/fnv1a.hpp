#pragma once
// FNV-1a, 32 and 64 bits: a stable hash of a name, for advisory lock keys and short
// derived identifiers. Private to the library.

#include <cstdint>
#include <string_view>

namespace idemkafka::detail {

constexpr std::uint32_t fnv1a(std::string_view s) noexcept
{
    std::uint32_t h = 2166136261u;
    for (const char c : s) {
        h ^= static_cast<unsigned char>(c);
        h *= 16777619u;
    }
    return h;
}

/// FNV-1a, 64 bits.
constexpr std::uint64_t fnv1a64(std::string_view s) noexcept
{
    std::uint64_t h = 14695981039346656037ull;
    for (const char c : s) {
        h ^= static_cast<unsigned char>(c);
        h *= 1099511628211ull;
    }
    return h;
}

} // namespace idemkafka::detail
