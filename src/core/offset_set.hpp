#pragma once
// A set of one partition's Kafka offsets, for offsets that come in ascending
// order and mostly leave in that order too: the ledger's records taken for
// processing. A sorted vector whose removed offsets are only marked until
// they reach either end; adding after the highest, reading the lowest and
// removing the lowest cost O(1) (amortised), removing another a binary
// search. Once the vector has grown to the most offsets held at once,
// nothing is allocated. Offsets out of order or added twice are handled as a
// std::set would (a sorted insert), only slower. Private to the library.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace idemkafka::detail {

class OffsetSet {
public:
    bool empty() const noexcept { return live_ == 0; }
    std::size_t size() const noexcept { return live_; }
    /// The lowest offset held; only when not empty.
    std::int64_t lowest() const noexcept { return slots_[head_].offset; }

    bool contains(std::int64_t offset) const noexcept
    {
        const auto s = find(offset);
        return s != slots_.end() && s->offset == offset && s->live;
    }

    void insert(std::int64_t offset)
    {
        if (empty() || offset > slots_.back().offset) {
            slots_.push_back({offset, true});
            ++live_;
            return;
        }
        auto at = std::lower_bound(slots_.begin() + static_cast<std::ptrdiff_t>(head_), slots_.end(), offset, before);
        if (at != slots_.end() && at->offset == offset) {
            live_ += at->live ? 0 : 1;
            at->live = true;
            return;
        }
        slots_.insert(at, {offset, true});
        ++live_;
    }

    /// Removes `offset`; false when it was not held.
    bool erase(std::int64_t offset) noexcept
    {
        if (empty())
            return false;
        auto s = slots_.begin() + static_cast<std::ptrdiff_t>(head_);
        if (s->offset != offset) {
            s = std::lower_bound(s, slots_.end(), offset, before);
            if (s == slots_.end() || s->offset != offset || !s->live)
                return false;
        }
        s->live = false;
        --live_;
        trim();
        return true;
    }

    /// Removes every offset at or after `offset`.
    void erase_from(std::int64_t offset) noexcept
    {
        const auto from = find(offset);
        for (auto s = from; s != slots_.end(); ++s)
            live_ -= s->live ? 1 : 0;
        slots_.erase(from, slots_.end());
        trim();
    }

    void clear() noexcept
    {
        slots_.clear();
        head_ = 0;
        live_ = 0;
    }

private:
    struct Slot {
        std::int64_t offset;
        bool live; // false: removed, dropped once it reaches either end
    };
    static bool before(const Slot& s, std::int64_t offset) noexcept { return s.offset < offset; }

    std::vector<Slot>::const_iterator find(std::int64_t offset) const noexcept
    {
        return std::lower_bound(slots_.begin() + static_cast<std::ptrdiff_t>(head_), slots_.end(), offset, before);
    }

    // Drops removed offsets at both ends, so that the first and the last
    // slot are live (or there are none); moves the live ones to the front
    // once the dropped front is as long as they are.
    void trim() noexcept
    {
        if (live_ == 0) {
            clear();
            return;
        }
        while (!slots_.back().live)
            slots_.pop_back();
        while (!slots_[head_].live)
            ++head_;
        if (head_ >= 32 && head_ * 2 >= slots_.size()) {
            slots_.erase(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(head_));
            head_ = 0;
        }
    }

    std::vector<Slot> slots_; // [head_, end) ascending by offset, each offset once
    std::size_t head_ = 0;    // slots before it are dropped
    std::size_t live_ = 0;    // offsets held
};

} // namespace idemkafka::detail
