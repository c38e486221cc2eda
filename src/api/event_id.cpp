#include "idemkafka/event_id.hpp"

#include "core/hex.hpp"
#include "idemkafka/error.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <string_view>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#endif
#if defined(__linux__)
#include <sys/random.h>
#endif

namespace idemkafka {

namespace {

using detail::hex_value;

constexpr std::size_t text_length = 36;
constexpr std::uint64_t ms_mask = (std::uint64_t{1} << 48) - 1;
constexpr std::uint64_t rand_b_mask = (std::uint64_t{1} << 62) - 1;
constexpr std::uint16_t counter_max = 0x0FFF;
// Seeding below half the range guarantees at least 2048 increments per
// millisecond before the timestamp has to be pushed ahead of the clock.
constexpr std::uint16_t counter_seed_mask = 0x07FF;
// Keeps error messages readable when someone passes a whole payload as an id.
constexpr std::size_t max_quoted_chars = 48;

constexpr char hex_digits[] = "0123456789abcdef";

constexpr bool is_dash_position(std::size_t i) noexcept
{
    return i == 8 || i == 13 || i == 18 || i == 23;
}

enum class ParseProblem { none, length, dash, hex };

struct ParseResult {
    ParseProblem problem;
    std::size_t position;
};

// Where parse_into()'s fast path found a problem, to name it: the first
// wrong character.
ParseResult locate_problem(std::string_view text) noexcept
{
    for (std::size_t i = 0; i < text_length; ++i) {
        if (is_dash_position(i)) {
            if (text[i] != '-')
                return {ParseProblem::dash, i};
        } else if (hex_value(text[i]) < 0) {
            return {ParseProblem::hex, i};
        }
    }
    return {ParseProblem::none, 0};
}

// The text offset of each byte's first digit.
constexpr std::array<std::uint8_t, 16> digits_of_byte = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};

// Shared by parse() and try_parse() so that try_parse() never has to build a
// message (and therefore never allocates). Every id a claim returns is parsed
// here: the digits are looked up in a table, checked all at once, and only a
// bad text is walked again to name its first wrong character.
ParseResult parse_into(std::string_view text, EventId::Bytes& out) noexcept
{
    if (text.size() != text_length)
        return {ParseProblem::length, text.size()};
    std::uint8_t bad = 0;
    for (std::size_t k = 0; k < digits_of_byte.size(); ++k) {
        const std::uint8_t hi = detail::hex_nibble(text[digits_of_byte[k]]);
        const std::uint8_t lo = detail::hex_nibble(text[digits_of_byte[k] + 1u]);
        bad |= hi | lo;
        out[k] = static_cast<std::uint8_t>((hi << 4) | (lo & 0x0F));
    }
    if ((bad & 0xF0) != 0 || text[8] != '-' || text[13] != '-' || text[18] != '-' || text[23] != '-')
        return locate_problem(text);
    return {ParseProblem::none, 0};
}

void append_escaped(std::string& out, char c)
{
    switch (c) {
    case '"':
        out += "\\\"";
        return;
    case '\\':
        out += "\\\\";
        return;
    case '\n':
        out += "\\n";
        return;
    case '\r':
        out += "\\r";
        return;
    case '\t':
        out += "\\t";
        return;
    default:
        break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
        out += c;
    } else {
        out += "\\x";
        out += hex_digits[u >> 4];
        out += hex_digits[u & 0x0F];
    }
}

std::string quote(std::string_view text)
{
    std::string out = "\"";
    const std::size_t shown = text.size() < max_quoted_chars ? text.size() : max_quoted_chars;
    for (std::size_t i = 0; i < shown; ++i)
        append_escaped(out, text[i]);
    out += '"';
    if (shown < text.size())
        out += "...";
    return out;
}

std::string quote_char(char c)
{
    std::string out = "'";
    if (c == '\'') {
        out += "\\'";
    } else if (c == '"') {
        out += c;
    } else {
        append_escaped(out, c);
    }
    out += '\'';
    return out;
}

[[noreturn]] void throw_parse_error(std::string_view text, const ParseResult& result)
{
    std::string message = "invalid event id " + quote(text) + ": ";
    switch (result.problem) {
    case ParseProblem::length:
        message += "expected 36 characters, got " + std::to_string(text.size());
        break;
    case ParseProblem::dash:
        message += "expected '-' at position " + std::to_string(result.position) + ", got " +
                   quote_char(text[result.position]);
        break;
    case ParseProblem::hex:
    case ParseProblem::none:
        message += "expected a hex digit at position " + std::to_string(result.position) + ", got " +
                   quote_char(text[result.position]);
        break;
    }
    throw InvalidEventId(message);
}

std::uint64_t splitmix64(std::uint64_t& state) noexcept
{
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

std::uint64_t clock_entropy() noexcept
{
    const auto wall = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
    const auto mono = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return wall ^ (mono << 32) ^ (mono >> 32);
}

std::uint64_t device_entropy() noexcept
{
    // random_device can throw when no entropy source is available; the clock and
    // address mixed in by the caller still make generators distinct then.
    try {
        std::random_device device;
        const std::uint64_t a = device();
        const std::uint64_t b = device();
        return (a << 32) ^ b;
    } catch (...) {
        return 0;
    }
}

// A generator copied into a child by fork() carries its parent's RNG state, so
// parent and children (or sibling children) would emit identical ids in the same
// millisecond. The child handler replaces this salt, which is folded into every
// rand_b, so those streams diverge.
std::atomic<std::uint64_t> fork_salt{0};

#if defined(__unix__) || defined(__APPLE__)
void reseed_after_fork_child() noexcept
{
    // Only async-signal-safe calls are allowed here; the pid alone already
    // separates siblings, getrandom() adds unpredictability where available.
    std::uint64_t seed = fork_salt.load(std::memory_order_relaxed) ^ (static_cast<std::uint64_t>(getpid()) << 20);
    std::uint64_t extra = 0;
#if defined(__linux__)
    if (getrandom(&extra, sizeof extra, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof extra))
        extra = 0;
#endif
    seed ^= extra;
    std::uint64_t salt = splitmix64(seed);
    if (salt == 0)
        salt = 1;
    fork_salt.store(salt, std::memory_order_relaxed);
}
#endif

void register_fork_handler() noexcept
{
#if defined(__unix__) || defined(__APPLE__)
    static const bool registered = [] { return pthread_atfork(nullptr, nullptr, &reseed_after_fork_child) == 0; }();
    static_cast<void>(registered);
#endif
}

std::uint64_t now_unix_ms() noexcept
{
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    // A clock set before 1970 is treated as "not later than anything seen", which
    // makes the generator keep counting on its last timestamp.
    return ms > 0 ? static_cast<std::uint64_t>(ms) & ms_mask : 0;
}

} // namespace

EventId EventId::parse(std::string_view text)
{
    Bytes bytes{};
    const ParseResult result = parse_into(text, bytes);
    if (result.problem != ParseProblem::none)
        throw_parse_error(text, result);
    return EventId(bytes);
}

bool EventId::try_parse(std::string_view text, EventId& out) noexcept
{
    Bytes bytes{};
    if (parse_into(text, bytes).problem != ParseProblem::none)
        return false;
    out = EventId(bytes);
    return true;
}

EventId EventId::from_v7_parts(std::uint64_t unix_ms, std::uint16_t rand_a, std::uint64_t rand_b) noexcept
{
    Bytes b{};
    const std::uint64_t ms = unix_ms & ms_mask;
    for (std::size_t i = 0; i < 6; ++i) {
        b[i] = static_cast<std::uint8_t>(ms >> (8 * (5 - i)));
    }
    b[6] = static_cast<std::uint8_t>(0x70 | ((rand_a >> 8) & 0x0F));
    b[7] = static_cast<std::uint8_t>(rand_a & 0xFF);
    const std::uint64_t rb = rand_b & rand_b_mask;
    b[8] = static_cast<std::uint8_t>(0x80 | ((rb >> 56) & 0x3F));
    for (std::size_t i = 9; i < 16; ++i) {
        b[i] = static_cast<std::uint8_t>(rb >> (8 * (15 - i)));
    }
    return EventId(b);
}

void EventId::format_to(char* out) const noexcept
{
    std::size_t pos = 0;
    for (std::size_t i = 0; i < bytes_.size(); ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[pos++] = '-';
        out[pos++] = hex_digits[bytes_[i] >> 4];
        out[pos++] = hex_digits[bytes_[i] & 0x0F];
    }
}

std::string EventId::to_string() const
{
    std::string text(text_length, '\0');
    format_to(text.data());
    return text;
}

bool EventId::is_nil() const noexcept
{
    for (const std::uint8_t b : bytes_) {
        if (b != 0)
            return false;
    }
    return true;
}

std::uint64_t EventId::unix_ms() const
{
    if (version() != 7) {
        throw InvalidEventId("event id " + to_string() + " is version " + std::to_string(version()) +
                             ", not 7, so it carries no timestamp");
    }
    std::uint64_t ms = 0;
    for (std::size_t i = 0; i < 6; ++i)
        ms = (ms << 8) | bytes_[i];
    return ms;
}

std::chrono::system_clock::time_point EventId::timestamp() const
{
    const std::chrono::milliseconds since_epoch(static_cast<std::chrono::milliseconds::rep>(unix_ms()));
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
}

std::ostream& operator<<(std::ostream& os, const EventId& id)
{
    char text[text_length];
    id.format_to(text);
    // Through string_view so that stream width and fill are honoured.
    return os << std::string_view(text, text_length);
}

UuidV7Generator::UuidV7Generator()
{
    register_fork_handler();
    std::uint64_t seed = device_entropy() ^ clock_entropy();
    seed ^= static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(this)) * 0xD6E8FEB86659FD93ULL;
    rng_state_[0] = splitmix64(seed);
    rng_state_[1] = splitmix64(seed);
    // xorshift128+ is stuck at zero forever from an all-zero state.
    if (rng_state_[0] == 0 && rng_state_[1] == 0)
        rng_state_[1] = 0x9E3779B97F4A7C15ULL;
}

std::uint64_t UuidV7Generator::random() noexcept
{
    // xorshift128+: a handful of cycles per call. Ids need uniqueness, not
    // unpredictability, so a CSPRNG would only cost throughput.
    std::uint64_t s1 = rng_state_[0];
    const std::uint64_t s0 = rng_state_[1];
    const std::uint64_t result = s0 + s1;
    rng_state_[0] = s0;
    s1 ^= s1 << 23;
    rng_state_[1] = s1 ^ s0 ^ (s1 >> 18) ^ (s0 >> 5);
    return result;
}

EventId UuidV7Generator::next() noexcept
{
    const std::uint64_t now = now_unix_ms();
    std::lock_guard<std::mutex> lock(mutex_);
    if (now > last_ms_) {
        last_ms_ = now;
        // The low bits of xorshift128+ are its weakest; take the top ones.
        counter_ = static_cast<std::uint16_t>((random() >> 53) & counter_seed_mask);
    } else if (counter_ < counter_max) {
        // Same millisecond, or the clock went backwards: counting on from the
        // last timestamp is what keeps ids strictly increasing.
        ++counter_;
    } else {
        // Counter exhausted: borrow the next millisecond rather than wrap.
        last_ms_ = (last_ms_ + 1) & ms_mask;
        counter_ = static_cast<std::uint16_t>((random() >> 53) & counter_seed_mask);
    }
    const std::uint64_t rand_b = (random() ^ fork_salt.load(std::memory_order_relaxed)) >> 2;
    return EventId::from_v7_parts(last_ms_, counter_, rand_b);
}

EventId new_event_id() noexcept
{
    static UuidV7Generator generator;
    return generator.next();
}

} // namespace idemkafka
