#pragma once
// RAII over the librdkafka C API. Private to the library.

#include <map>
#include <memory>
#include <string>

#include <librdkafka/rdkafka.h>

namespace idemkafka::detail::kafka {

struct HandleDeleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
};
struct ConfDeleter {
    void operator()(rd_kafka_conf_t* p) const noexcept { rd_kafka_conf_destroy(p); }
};
struct MessageDeleter {
    void operator()(rd_kafka_message_t* p) const noexcept { rd_kafka_message_destroy(p); }
};
struct PartitionListDeleter {
    void operator()(rd_kafka_topic_partition_list_t* p) const noexcept { rd_kafka_topic_partition_list_destroy(p); }
};
struct ErrorDeleter {
    void operator()(rd_kafka_error_t* p) const noexcept { rd_kafka_error_destroy(p); }
};
struct QueueDeleter {
    void operator()(rd_kafka_queue_t* p) const noexcept { rd_kafka_queue_destroy(p); }
};
struct EventDeleter {
    void operator()(rd_kafka_event_t* p) const noexcept { rd_kafka_event_destroy(p); }
};

using HandlePtr = std::unique_ptr<rd_kafka_t, HandleDeleter>;
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;
using PartitionListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionListDeleter>;
using ErrorPtr = std::unique_ptr<rd_kafka_error_t, ErrorDeleter>;
using QueuePtr = std::unique_ptr<rd_kafka_queue_t, QueueDeleter>;
using EventPtr = std::unique_ptr<rd_kafka_event_t, EventDeleter>;

/// Sets one property; throws ConfigError naming the property and librdkafka's reason.
void set(rd_kafka_conf_t* conf, const std::string& key, const std::string& value);

/// A new configuration with `props` applied in order.
ConfPtr make_conf(const std::map<std::string, std::string>& props);

/// A partition list of `capacity`.
inline PartitionListPtr make_list(int capacity)
{
    return PartitionListPtr(rd_kafka_topic_partition_list_new(capacity));
}

} // namespace idemkafka::detail::kafka
