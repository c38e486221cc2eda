#pragma once
/// \file
/// EventId: the 16-byte dedup key carried in every event's payload, and the
/// UUIDv7 generator (RFC 9562) that producers use to mint it.

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <string_view>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// A 16-byte UUID value. Regular value type: copyable, comparable, hashable.
class IDEMKAFKA_API EventId {
public:
    /// The 16 bytes of a UUID, in network order.
    using Bytes = std::array<std::uint8_t, 16>;

    /// The nil UUID (all zero bytes).
    constexpr EventId() noexcept : bytes_{} {}
    /// Wraps 16 raw bytes (network order, as in the canonical text form).
    constexpr explicit EventId(const Bytes& bytes) noexcept : bytes_(bytes) {}

    /// Parses the canonical text form `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
    /// (hex digits in either case). Throws InvalidEventId naming the problem
    /// for any other input: no braces, no URN prefix, no missing dashes.
    static EventId parse(std::string_view text);

    /// Like parse(), but returns false instead of throwing.
    static bool try_parse(std::string_view text, EventId& out) noexcept;

    /// Builds a version 7 id from a Unix time in milliseconds and 74 bits of
    /// caller-supplied randomness/counter (`rand_a` 12 bits, `rand_b` 62 bits).
    static EventId from_v7_parts(std::uint64_t unix_ms, std::uint16_t rand_a, std::uint64_t rand_b) noexcept;

    /// Canonical lower-case text form (36 characters).
    std::string to_string() const;
    /// Writes the canonical text into `out` (exactly 36 characters, no terminator).
    void format_to(char* out) const noexcept;

    /// The version nibble (7 for UUIDv7, 4 for random UUIDs, 0 for nil).
    int version() const noexcept { return bytes_[6] >> 4; }
    /// True when the variant bits are the RFC 9562 variant (10xx).
    bool is_rfc_variant() const noexcept { return (bytes_[8] & 0xC0) == 0x80; }
    /// True for the all-zero id.
    bool is_nil() const noexcept;

    /// The embedded Unix timestamp in milliseconds. Meaningful only when
    /// version() == 7; throws InvalidEventId otherwise.
    std::uint64_t unix_ms() const;
    /// The embedded creation time as a system_clock time point (version 7 only;
    /// throws InvalidEventId otherwise).
    std::chrono::system_clock::time_point timestamp() const;

    /// The 16 bytes, in network order.
    const Bytes& bytes() const noexcept { return bytes_; }

    /// Equal bytes: the same event.
    friend bool operator==(const EventId& a, const EventId& b) noexcept { return a.bytes_ == b.bytes_; }
    /// Different bytes: different events.
    friend bool operator!=(const EventId& a, const EventId& b) noexcept { return a.bytes_ != b.bytes_; }
    /// Byte order, which for UUIDv7 ids is creation order.
    friend bool operator<(const EventId& a, const EventId& b) noexcept
    {
        // Two 64-bit compares, not a byte-by-byte one: claims sort and search ids.
        const std::uint64_t ah = a.half(0), bh = b.half(0);
        return ah != bh ? ah < bh : a.half(8) < b.half(8);
    }

private:
    // Bytes [at, at + 8) as a big-endian number.
    constexpr std::uint64_t half(std::size_t at) const noexcept
    {
        // Spelled out, so that compilers make it one load and a byte swap.
        const std::uint8_t* p = bytes_.data() + at;
        return std::uint64_t{p[0]} << 56 | std::uint64_t{p[1]} << 48 | std::uint64_t{p[2]} << 40 |
               std::uint64_t{p[3]} << 32 | std::uint64_t{p[4]} << 24 | std::uint64_t{p[5]} << 16 |
               std::uint64_t{p[6]} << 8 | std::uint64_t{p[7]};
    }

    Bytes bytes_;
};

/// Writes the canonical text form (to_string()).
IDEMKAFKA_API std::ostream& operator<<(std::ostream& os, const EventId& id);

/// Thread-safe UUIDv7 generator. Ids from one generator are strictly increasing
/// (byte order == creation order), also within one millisecond: RFC 9562
/// method 1, a 12-bit counter in rand_a seeded randomly each millisecond, plus
/// 62 random bits; when the counter would overflow, the timestamp is advanced.
class IDEMKAFKA_API UuidV7Generator {
public:
    UuidV7Generator();
    /// Returns the next id. Never throws.
    EventId next() noexcept;

private:
    std::mutex mutex_;
    std::uint64_t last_ms_ = 0;
    std::uint16_t counter_ = 0;
    std::uint64_t rng_state_[2];
    std::uint64_t random() noexcept;
};

/// Returns a new UUIDv7 from a process-wide generator (monotonic in this process).
IDEMKAFKA_API EventId new_event_id() noexcept;

} // namespace idemkafka

/// \cond std_hash
// Hides the specialisation from the API reference (its generator cannot place a
// member of namespace std declared from outside it); EventId's text says it is hashable.
template <> struct std::hash<idemkafka::EventId> {
    /// A hash of the id's bytes.
    std::size_t operator()(const idemkafka::EventId& id) const noexcept
    {
        // The low 8 bytes of a v7 id are random; mix both halves for other versions.
        std::uint64_t hi = 0, lo = 0;
        for (std::size_t i = 0; i < 8; ++i) {
            hi = (hi << 8) | id.bytes()[i];
            lo = (lo << 8) | id.bytes()[i + 8];
        }
        return static_cast<std::size_t>(lo ^ (hi * 0x9E3779B97F4A7C15ULL));
    }
};
/// \endcond
