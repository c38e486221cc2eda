#pragma once
// Hex digits, as event ids and the outbox's bytea columns spell bytes.
// Private to the library.

#include <array>
#include <cstdint>

namespace idemkafka::detail {

/// The value of hex digit `c` (either case), or -1 if it is not one.
constexpr int hex_value(char c) noexcept
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/// hex_value() of every char, by its unsigned value, with 0xFF for a char
/// that is not a hex digit: a lookup instead of three range tests, and a
/// batch of digits is checked at once by OR-ing their values (bad when the
/// result has a high bit).
inline constexpr std::array<std::uint8_t, 256> hex_nibbles = [] {
    std::array<std::uint8_t, 256> t{};
    for (int c = 0; c < 256; ++c) {
        const int v = hex_value(static_cast<char>(c));
        t[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(v < 0 ? 0xFF : v);
    }
    return t;
}();

/// The table's value of `c`.
constexpr std::uint8_t hex_nibble(char c) noexcept
{
    return hex_nibbles[static_cast<unsigned char>(c)];
}

} // namespace idemkafka::detail
