#include "kafka/fetch_wakeup.hpp"

namespace idemkafka::detail::kafka {

FetchWakeup::FetchWakeup(rd_kafka_t* rk) : rk_(rk)
{
    // Interval zero: only when woken (the first run, at start, finds no assignment yet).
    thread_.start(std::chrono::milliseconds(0), [this] { ask_end_offsets(); });
}

void FetchWakeup::ask_end_offsets() noexcept
{
    rd_kafka_topic_partition_list_t* list = nullptr;
    if (rd_kafka_assignment(rk_, &list) != RD_KAFKA_RESP_ERR_NO_ERROR || !list)
        return;
    if (list->cnt > 0) {
        // A timestamp of -1 asks for the end offset; the answer is not needed.
        for (int i = 0; i < list->cnt; ++i)
            list->elems[i].offset = RD_KAFKA_OFFSET_END;
        rd_kafka_offsets_for_times(rk_, list, 500);
    }
    rd_kafka_topic_partition_list_destroy(list);
}

} // namespace idemkafka::detail::kafka
