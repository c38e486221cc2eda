#include "kafka/fetch_wakeup.hpp"

namespace idemkafka::detail::kafka {

FetchWakeup::FetchWakeup(rd_kafka_t* rk) : rk_(rk), thread_([this] { run(); }) {}

FetchWakeup::~FetchWakeup()
{
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
}

void FetchWakeup::wake()
{
    {
        std::lock_guard<std::mutex> lk(mu_);
        pending_ = true;
    }
    cv_.notify_one();
}

void FetchWakeup::run()
{
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
        cv_.wait(lk, [this] { return stop_ || pending_; });
        if (stop_)
            return;
        pending_ = false;
        lk.unlock();
        rd_kafka_topic_partition_list_t* list = nullptr;
        if (rd_kafka_assignment(rk_, &list) == RD_KAFKA_RESP_ERR_NO_ERROR && list) {
            if (list->cnt > 0) {
                // A timestamp of -1 asks for the end offset; the answer is not needed.
                for (int i = 0; i < list->cnt; ++i)
                    list->elems[i].offset = RD_KAFKA_OFFSET_END;
                rd_kafka_offsets_for_times(rk_, list, 500);
            }
            rd_kafka_topic_partition_list_destroy(list);
        }
        lk.lock();
    }
}

} // namespace idemkafka::detail::kafka
