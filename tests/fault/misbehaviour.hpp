#pragma once
// Which orders the torture test's chaos listener mishandles, and how: a rule on
// the order id and a seed that the listener (which misbehaves) and the driver
// (which checks the outcome) both compute.

#include <cstdint>
#include <string_view>

namespace idemkafka::torture {

enum class Misbehaviour {
    none,
    /// Inserts its charge, runs a statement that fails, catches the
    /// pqxx::sql_error and goes on with one more write: the library fails the
    /// record (transaction aborted inside the handler), then dead-letters it.
    swallow,
    /// Throws on every attempt: dead-lettered (handler_failed) after max_attempts.
    throw_always,
    /// Throws on the first attempt only: charged once, after a retry.
    throw_once,
};

/// The chaos listener's max_attempts, below the default 5 so that a record's
/// attempts fit between two kills more often: the attempt count starts again
/// in each process, and with every partition held at a failing record the
/// kill phase would make no progress. The idemkafka.attempts header says it.
inline constexpr int max_attempts = 3;

/// The exception message of throw_always and throw_once.
inline constexpr std::string_view thrown_message = "chaos listener: handler refuses this order";

/// `per_mille` of all orders misbehave in each of the three ways (0: none).
inline Misbehaviour misbehaviour_of(std::string_view order_id, std::uint64_t seed, int per_mille)
{
    if (per_mille <= 0)
        return Misbehaviour::none;
    std::uint64_t h = 14695981039346656037ull ^ seed; // FNV-1a over the id, seeded
    for (const char c : order_id) {
        h ^= static_cast<unsigned char>(c);
        h *= 1099511628211ull;
    }
    const auto slot = static_cast<int>((h ^ (h >> 29)) % 1000);
    if (slot < per_mille)
        return Misbehaviour::swallow;
    if (slot < 2 * per_mille)
        return Misbehaviour::throw_always;
    if (slot < 3 * per_mille)
        return Misbehaviour::throw_once;
    return Misbehaviour::none;
}

} // namespace idemkafka::torture
