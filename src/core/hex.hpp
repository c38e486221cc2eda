#pragma once
// Hex digits, as event ids and the outbox's bytea columns spell bytes.
// Private to the library.

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

} // namespace idemkafka::detail
