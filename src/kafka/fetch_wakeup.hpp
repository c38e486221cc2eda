#pragma once
// Wakes librdkafka's fetchers once the prefetch queue has room again. Private
// to the library.

#include <condition_variable>
#include <mutex>
#include <thread>

#include <librdkafka/rdkafka.h>

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
    explicit FetchWakeup(rd_kafka_t* rk);
    ~FetchWakeup();
    FetchWakeup(const FetchWakeup&) = delete;
    FetchWakeup& operator=(const FetchWakeup&) = delete;

    /// Returns at once; requests while one is under way coalesce.
    void wake();

private:
    void run();

    rd_kafka_t* rk_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool pending_ = false;
    bool stop_ = false;
    std::thread thread_;
};

} // namespace idemkafka::detail::kafka
