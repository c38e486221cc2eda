#pragma once
// Wakes librdkafka's fetchers once the prefetch queue has room again. Private
// to the library.

#include <librdkafka/rdkafka.h>

#include "core/periodic.hpp"

namespace idemkafka::detail::kafka {

/// librdkafka before 2.1 looks at a partition whose prefetch queue reached
/// queued.min.messages (or queued.max.messages.kbytes) again only when its
/// broker thread wakes: on a response, a request to send, or after up to a
/// second (2.1 added fetch.queue.backoff.ms for this). A prefetch cap smaller
/// than a second of consumption then stalls the consumer. wake() has a thread
/// of its own ask the leaders of the assigned partitions for their end
/// offsets: the request wakes each leader's broker thread, which fetches again
/// if the queue is below its caps.
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
