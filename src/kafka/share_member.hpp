#pragma once
// The librdkafka share consumer (KIP-932, a preview in librdkafka 2.15) as
// one member of a share group, in explicit acknowledgement mode: poll a
// batch of acquired records, acknowledge each, send the acknowledgements
// and read the broker's answer per partition. Knows nothing of PostgreSQL.
// One thread uses a ShareMember (librdkafka refuses concurrent calls on a
// share handle). Private to the library.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <librdkafka/rdkafka.h>

#include "idemkafka/log.hpp"
#include "idemkafka/redact.hpp"
#include "kafka/client.hpp"

namespace idemkafka::detail::kafka {

struct ShareDeleter {
    void operator()(rd_kafka_share_t* p) const noexcept;
};
struct MessagesDeleter {
    void operator()(rd_kafka_messages_t* p) const noexcept { rd_kafka_messages_destroy(p); }
};
using SharePtr = std::unique_ptr<rd_kafka_share_t, ShareDeleter>;
using MessagesPtr = std::unique_ptr<rd_kafka_messages_t, MessagesDeleter>;

enum class Ack { accept, release, reject };

class ShareMember {
public:
    struct Settings {
        std::string brokers;
        std::string group;
        std::vector<std::string> topics;
        std::map<std::string, std::string> kafka; // passed through, before the library's own
        std::size_t max_poll_records = 500;
    };

    /// Creates the share consumer (explicit acknowledgements) and subscribes.
    /// Throws ConfigError for a refused property, KafkaError otherwise.
    ShareMember(const Settings& settings, LogSink log, Redactor secrets);
    ~ShareMember();
    ShareMember(const ShareMember&) = delete;
    ShareMember& operator=(const ShareMember&) = delete;

    /// The records of one poll, acquired for this member; they stay valid
    /// until the batch is destroyed.
    struct Batch {
        MessagesPtr messages;
        bool failed = false; // the poll itself failed (logged)
        std::size_t size() const noexcept { return messages ? rd_kafka_messages_count(messages.get()) : 0; }
        const rd_kafka_message_t* at(std::size_t i) const { return rd_kafka_messages_get(messages.get(), i); }
    };

    /// Waits up to `timeout` for records. An error of the poll itself is
    /// logged and returns an empty batch marked `failed`.
    Batch poll(std::chrono::milliseconds timeout);

    /// Records the acknowledgement of `m` (sent by commit()). False, logged,
    /// when librdkafka refused it.
    bool acknowledge(const rd_kafka_message_t* m, Ack type);

    /// A partition whose acknowledgements failed.
    struct Refused {
        std::string topic;
        std::int32_t partition = 0;
        std::string error;
    };
    /// Sends the recorded acknowledgements and waits up to `timeout` for the
    /// answers; returns the partitions whose acknowledgements were refused
    /// (or not answered: then every partition is reported, topic empty).
    std::vector<Refused> commit(std::chrono::milliseconds timeout);

    /// Sends what is recorded and leaves the group (bounded by librdkafka's
    /// socket.timeout.ms).
    void close();

    /// The broker's count of deliveries of `m` (1 on the first).
    static int delivery_count(const rd_kafka_message_t& m) noexcept { return rd_kafka_message_delivery_count(&m); }

private:
    ClientOwner owner_;
    Redactor secrets_;
    SharePtr share_;
    bool closed_ = false;
};

} // namespace idemkafka::detail::kafka
