#pragma once
// When to wake librdkafka's fetchers (before 2.1) around the filling of a
// batch: pure logic, no client. Private to the library.

#include <chrono>
#include <cstddef>

namespace idemkafka::detail::kafka {

/// Decides when FetchWakeup is to wake the fetchers. A prefetch queue at half
/// a cap or more before a batch may have stopped them (librdkafka before 2.1
/// looks again only when its broker thread wakes); once the batch took it
/// below both halves, they are woken, at most every 20 ms. So may a queue
/// that filled and was emptied between two checks (a fetch response of
/// thousands of records, taken whole while a batch filled, as at the start
/// of a backlog): a run of records taken without the queue running empty
/// (pulled(), emptied()) that reaches half a cap shows it held that many.
///
/// Invariant: `armed_` is true from a check before a batch that saw the queue
/// at half a cap or more, or from a run that reached half a cap, until the
/// wake that follows it; `next_wake_` is the earliest time of the next wake.
/// The queue's bytes are estimated from the mean size of the records the last
/// batch took (`record_bytes_`); a run counts its records' own bytes.
class WakePacer {
public:
    using Clock = std::chrono::steady_clock;

    /// Half of queued.min.messages and half of queued.max.messages.kbytes in
    /// bytes: the queue is half full at either.
    WakePacer(std::size_t below_records, std::size_t below_bytes) noexcept
        : below_records_(below_records), below_bytes_(below_bytes)
    {
    }

    /// Called before a batch (`before_batch`) and after it with what it took;
    /// `queued` is the records in librdkafka's queue now. True when the
    /// fetchers are to be woken now.
    bool check(bool before_batch, std::size_t queued, std::size_t batch_records, std::size_t batch_bytes,
               Clock::time_point now) noexcept
    {
        if (!before_batch && batch_records > 0)
            record_bytes_ = batch_bytes / batch_records;
        const bool half_full = queued >= below_records_ || queued * record_bytes_ >= below_bytes_;
        if (before_batch) {
            armed_ = armed_ || half_full;
            return false;
        }
        if (!armed_ || half_full || now < next_wake_)
            return false;
        armed_ = false;
        run_records_ = run_bytes_ = 0; // a run arms again only with as many more
        next_wake_ = now + std::chrono::milliseconds(20);
        return true;
    }

    /// A record taken from librdkafka's queue (`bytes` its size) without the
    /// queue running empty since the last emptied().
    void pulled(std::size_t bytes) noexcept
    {
        ++run_records_;
        run_bytes_ += bytes;
        if (run_records_ >= below_records_ || run_bytes_ >= below_bytes_)
            armed_ = true;
    }

    /// librdkafka's queue was found empty: the next record starts a new run.
    void emptied() noexcept { run_records_ = run_bytes_ = 0; }

private:
    std::size_t below_records_;
    std::size_t below_bytes_;
    std::size_t record_bytes_ = 0; // mean per record, to estimate the queue's bytes
    std::size_t run_records_ = 0;  // taken since the queue was last found empty
    std::size_t run_bytes_ = 0;
    bool armed_ = false;
    Clock::time_point next_wake_{};
};

} // namespace idemkafka::detail::kafka
