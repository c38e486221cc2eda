#pragma once
// The one doubling backoff of the library: base, 2 x base, 4 x base, ... up
// to a cap. Private to the library.

#include <algorithm>
#include <chrono>

namespace idemkafka::detail {

struct Backoff {
    std::chrono::milliseconds base;
    std::chrono::milliseconds cap;

    /// The wait after `failures` failures in a row (1 or more): base x 2^(failures-1), at most cap.
    std::chrono::milliseconds after(int failures) const noexcept
    {
        auto d = base;
        for (int i = 1; i < failures && d < cap; ++i)
            d *= 2;
        return std::min(d, cap);
    }
};

/// A Backoff that counts the failures itself: next() after each failure,
/// reset() after a success.
class GrowingBackoff {
public:
    explicit GrowingBackoff(Backoff shape) noexcept : shape_(shape) {}

    /// The wait after one more failure.
    std::chrono::milliseconds next() noexcept
    {
        if (failures_ < 64) // past the cap long before: no overflow
            ++failures_;
        return shape_.after(failures_);
    }
    /// The wait the next failure will get.
    std::chrono::milliseconds upcoming() const noexcept { return shape_.after(failures_ + 1); }
    /// After a success: the next failure waits `base` again.
    void reset() noexcept { failures_ = 0; }

private:
    Backoff shape_;
    int failures_ = 0;
};

} // namespace idemkafka::detail
