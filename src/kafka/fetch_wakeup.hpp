#pragma once
// Wakes librdkafka's fetchers once the prefetch queue has room again. Private
// to the library.

#include <librdkafka/rdkafka.h>

#include "core/periodic.hpp"

namespace idemkafka::detail::kafka {

/// librdkafka looks at a partition again only when its broker thread wakes
/// (on a response, a request to send, or after up to a second): a partition
/// resumed while no fetch of its broker is under way (GroupMember::resume()),
/// and before 2.1 a partition whose prefetch queue had reached
/// queued.min.messages or queued.max.messages.kbytes (2.1 added
/// fetch.queue.backoff.ms for that). Either would stall the consumer for up to
/// a second. wake() has a thread of its own ask the leaders of the assigned
/// partitions for their end offsets: the request wakes each leader's broker
/// thread, which fetches what is fetchable.
class FetchWakeup {
public:
    /// `rk` must outlive this object.
    explicit FetchWakeup(rd_kafka_t* rk);
    FetchWakeup(const FetchWakeup&) = delete;
    FetchWakeup& operator=(const FetchWakeup&) = delete;

    /// Returns at once; requests while one is under way coalesce.
    void wake() { thread_.wake(); }

private:
    void ask_end_offsets() noexcept;

    rd_kafka_t* rk_;
    PeriodicThread thread_; // last: stopped before rk_ may go
};

} // namespace idemkafka::detail::kafka
