#pragma once
// The group member's share of the prefetch caps: what it holds for the
// round-robin, against half of max_prefetch_records and max_prefetch_bytes.
// Pure logic, no client. Private to the library.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace idemkafka::detail::kafka {

/// The prefetch caps split between the records the group member holds
/// (its round-robin) and librdkafka's queue, and the count of what is held.
///
/// Invariant: the held share is half of each cap, at least 1; librdkafka's
/// share is the rest (at least one record), so together they stay within
/// the caps. `records()` and `bytes()` are the sums over the records held
/// (payload and key bytes): each add() is undone by one remove() of the same
/// bytes, or by clear(). Lines about fetches paused for the caps are
/// rate-limited: at most one every 10 s, counting the pauses not logged.
class PrefetchCaps {
public:
    using Clock = std::chrono::steady_clock;

    /// max_prefetch_records and max_prefetch_bytes as configured.
    PrefetchCaps(std::size_t max_records, std::size_t max_bytes) noexcept
        : hold_max_records_(std::max<std::size_t>(1, max_records / 2)),
          hold_max_bytes_(std::max<std::size_t>(1, max_bytes / 2)), max_records_(max_records), max_bytes_(max_bytes)
    {
    }

    /// librdkafka's share (queued.min.messages, and queued.max.messages.kbytes in bytes).
    std::size_t queue_records() const noexcept { return std::max<std::size_t>(1, max_records_ - hold_max_records_); }
    std::size_t queue_bytes() const noexcept { return max_bytes_ - std::min(max_bytes_, hold_max_bytes_); }
    /// The caps as configured, for log lines.
    std::size_t max_records() const noexcept { return max_records_; }
    std::size_t max_bytes() const noexcept { return max_bytes_; }

    /// What is held now.
    std::size_t records() const noexcept { return held_records_; }
    std::size_t bytes() const noexcept { return held_bytes_; }
    /// True while both are below the held share: more may be taken from librdkafka.
    bool room() const noexcept { return held_records_ < hold_max_records_ && held_bytes_ < hold_max_bytes_; }

    /// A record of `bytes` is held, or goes (out or dropped).
    void add(std::size_t bytes) noexcept
    {
        held_records_ += 1;
        held_bytes_ += bytes;
    }
    void remove(std::size_t bytes) noexcept
    {
        held_records_ -= 1;
        held_bytes_ -= bytes;
    }
    /// Nothing is held any more.
    void clear() noexcept { held_records_ = held_bytes_ = 0; }

    /// A fetch was paused for the caps at `now`: when a line is due, the
    /// number of pauses since the last line that were not logged; nullopt
    /// when this one is not logged either.
    std::optional<std::uint64_t> pause_to_log(Clock::time_point now) noexcept
    {
        ++pauses_unlogged_;
        if (now < next_log_)
            return std::nullopt;
        next_log_ = now + std::chrono::seconds(10);
        return std::exchange(pauses_unlogged_, 0) - 1;
    }

private:
    std::size_t held_records_ = 0;
    std::size_t held_bytes_ = 0;
    std::size_t hold_max_records_; // the share of the prefetch caps held here
    std::size_t hold_max_bytes_;
    std::size_t max_records_; // as configured
    std::size_t max_bytes_;
    std::uint64_t pauses_unlogged_ = 0;
    Clock::time_point next_log_{};
};

} // namespace idemkafka::detail::kafka
