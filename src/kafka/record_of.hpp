#pragma once
// A consumed librdkafka message as the library's Record: the one conversion
// for the consumer, the test kit and idemkafka-admin. Header-only: the test
// kit links only the public library, whose internals are hidden.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <librdkafka/rdkafka.h>

#include "idemkafka/context.hpp"

namespace idemkafka::detail::kafka {

/// The record of message `m` (not an error): topic, partition, offset,
/// timestamp (-1 when unknown), key and value as views into `m` (a null key
/// or value is nullopt, distinct from an empty one), and the headers in
/// record order (a null header value is nullopt). `m` must outlive the views.
inline Record record_of(const rd_kafka_message_t& m)
{
    Record record;
    record.topic = rd_kafka_topic_name(m.rkt);
    record.partition = m.partition;
    record.offset = m.offset;
    rd_kafka_timestamp_type_t tstype;
    record.timestamp_ms = rd_kafka_message_timestamp(&m, &tstype);
    if (m.key)
        record.key = std::string_view(static_cast<const char*>(m.key), m.key_len);
    if (m.payload)
        record.value = std::string_view(static_cast<const char*>(m.payload), m.len);
    rd_kafka_headers_t* hdrs = nullptr; // owned by the message
    if (rd_kafka_message_headers(&m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR && hdrs) {
        const char* name = nullptr;
        const void* val = nullptr;
        std::size_t size = 0;
        for (std::size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
             ++i) {
            Header h{name, std::nullopt};
            if (val)
                h.value.emplace(static_cast<const char*>(val), size);
            record.headers.push_back(std::move(h));
        }
    }
    return record;
}

/// An owned copy of a view of record_of(): nullopt stays nullopt.
inline std::optional<std::string> owned(const std::optional<std::string_view>& v)
{
    return v ? std::optional<std::string>(std::in_place, *v) : std::nullopt;
}

} // namespace idemkafka::detail::kafka
