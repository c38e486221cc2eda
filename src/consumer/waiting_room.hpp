#pragma once
// The waiting room: records polled (and taken in the ledger) but not yet
// handed to a worker. Private to the library.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "consumer/item.hpp"
#include "core/ledger.hpp"

namespace idemkafka::detail {

/// Records polled but not yet in a unit of work, in poll order. A record
/// waits here while its lane (its partition, or its key with Ordering::key)
/// is in a unit a worker runs.
///
/// Invariants: bytes() is the sum of the records' key and payload bytes;
/// the poll stops filling once full() (limit() records or max_bytes);
/// since() is when the oldest record came, or when what waits was last
/// passed over by a dispatch (a merge frees its lanes). Poll thread only.
class WaitingRoom {
public:
    explicit WaitingRoom(std::size_t max_bytes) : max_bytes_(max_bytes) {}

    /// At start: the room's own record limit (restored after a probe).
    void size_to(std::size_t records) noexcept { own_limit_ = limit_ = records; }
    /// The circuit's probe polls fewer records; at least one.
    void limit_to(std::size_t records) noexcept { limit_ = std::max<std::size_t>(1, records); }
    void restore_limit() noexcept { limit_ = own_limit_; }
    std::size_t limit() const noexcept { return limit_; }

    bool full() const noexcept { return records_.size() >= limit_ || bytes_ >= max_bytes_; }
    bool empty() const noexcept { return records_.empty(); }
    std::size_t size() const noexcept { return records_.size(); }
    std::size_t bytes() const noexcept { return bytes_; }
    Clock::time_point since() const noexcept { return since_; }

    /// What waits was passed over: it waits on from `now` (for max_batch_wait).
    void passed_over(Clock::time_point now) noexcept { since_ = now; }

    /// A record comes in last; returns it where it waits.
    Item& add(Item&& it, Clock::time_point now)
    {
        if (records_.empty())
            since_ = now;
        bytes_ += it.bytes();
        records_.push_back(std::move(it));
        return records_.back();
    }

    /// `fill(records)` appends to the records (Parking::take_due); returns
    /// the index of the first one it added.
    template <class Fill> std::size_t add_from(Fill&& fill, Clock::time_point now)
    {
        const auto before = records_.size();
        fill(records_);
        if (before == 0 && !records_.empty())
            since_ = now;
        for (auto i = before; i < records_.size(); ++i)
            bytes_ += records_[i].bytes();
        return before;
    }

    /// Removes the records `drop(record)` names (they come again from Kafka).
    template <class Pred> void drop_if(Pred&& drop)
    {
        records_.erase(std::remove_if(records_.begin(), records_.end(), drop), records_.end());
        recount();
    }

    /// Moves out the records `take(record)` names, in order; the others keep theirs.
    template <class Pred> std::vector<Item> take_if(Pred&& take)
    {
        auto first = std::stable_partition(records_.begin(), records_.end(), [&](const Item& it) { return !take(it); });
        std::vector<Item> taken(std::make_move_iterator(first), std::make_move_iterator(records_.end()));
        records_.erase(first, records_.end());
        recount();
        return taken;
    }

    /// Offers each record in order to `take(record)`, which moves it out and
    /// returns true, or leaves it waiting (in order) and returns false.
    template <class Take> void hand_out(Take&& take)
    {
        scratch_.clear();
        for (auto& it : records_) {
            const auto b = it.bytes();
            if (take(it))
                bytes_ -= b;
            else
                scratch_.push_back(std::move(it));
        }
        records_.swap(scratch_);
        scratch_.clear();
    }

    void clear() noexcept
    {
        records_.clear();
        bytes_ = 0;
    }

    Item& operator[](std::size_t i) noexcept { return records_[i]; }
    std::vector<Item>::const_iterator begin() const noexcept { return records_.begin(); }
    std::vector<Item>::const_iterator end() const noexcept { return records_.end(); }

private:
    void recount() noexcept
    {
        bytes_ = 0;
        for (const auto& it : records_)
            bytes_ += it.bytes();
    }

    std::vector<Item> records_;
    std::vector<Item> scratch_; // hand_out()'s: the records that stay
    std::size_t bytes_ = 0;
    std::size_t max_bytes_;
    std::size_t limit_ = 1;
    std::size_t own_limit_ = 1;
    Clock::time_point since_{};
};

} // namespace idemkafka::detail
