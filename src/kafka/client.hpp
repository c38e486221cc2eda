#pragma once
// RAII over the librdkafka C API. Private to the library.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <librdkafka/rdkafka.h>

#include "idemkafka/log.hpp"
#include "idemkafka/redact.hpp"

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

/// Whoever owns a client: librdkafka's opaque points to it, and the client's
/// own log lines (component "librdkafka", from librdkafka's threads) go to
/// its sink, read under `log_mu`.
struct ClientOwner {
    LogSink log;
    std::mutex log_mu;

    /// Drops the client's later lines: for a client destroyed in the
    /// background, past the life of the sink its owner was given.
    void silence() noexcept
    {
        std::lock_guard<std::mutex> lock(log_mu);
        log = LogSink();
    }
};

/// librdkafka's syslog level as a LogLevel.
LogLevel log_level(int syslog_level) noexcept;

/// Creates a client of `type` with `props` applied in order, `owner` as its
/// opaque and its log going to owner.log; `setup` adds the caller's
/// callbacks to the configuration. Throws ConfigError for a refused
/// property and KafkaError (masked by `secrets`) when librdkafka refuses
/// the client.
HandlePtr make_client(rd_kafka_type_t type, const std::map<std::string, std::string>& props, ClientOwner& owner,
                      const std::function<void(rd_kafka_conf_t*)>& setup, const Redactor& secrets);

/// The settings that another client of the same cluster (a dead-letter or
/// outbox producer) takes over from `kafka`: security.*, sasl.*, ssl.*,
/// client.id and client.rack.
std::map<std::string, std::string> connection_settings(const std::map<std::string, std::string>& kafka);

/// What is wrong with `props` (a consumer's client settings) on librdkafka
/// `version` (rd_kafka_version()'s form): a warning naming the problem and
/// its fix, or empty when nothing known is. Before 2.3.0, a
/// cooperative-sticky member closed after joining its group and before its
/// first assignment aborts the process: the sticky assignor's state is still
/// null and its destructor asserts it is not (librdkafka issue 4312).
std::string client_bug_warning(const std::map<std::string, std::string>& props, int version);

} // namespace idemkafka::detail::kafka
