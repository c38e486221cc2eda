#pragma once
// Helpers for the library's own log call sites. Private to the library.

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "idemkafka/log.hpp"
#include "idemkafka/redact.hpp"

namespace idemkafka::detail {

using LogFields = std::vector<LogField>;

/// Appends `text` as a JSON string literal: quotes, backslashes and control
/// characters escaped, well-formed UTF-8 kept, stray bytes as \u00XX.
void append_json_string(std::string& out, std::string_view text);

/// A sink that adds each of `defaults` that a record lacks (after its
/// component field) and masks the `secrets` known to the caller before the
/// record reaches `inner`. An empty `inner` gives an empty sink.
LogSink with_context(LogSink inner, LogFields defaults, Redactor secrets = {});

/// Sends one record to `sink` (nothing if it is empty), with `component`
/// first unless `fields` name one. Never throws.
void emit(const LogSink& sink, LogLevel level, std::string message, const char* component,
          LogFields fields = {}) noexcept;

/// Formats and sends one record of the consumer's (component "consumer"
/// unless `fields` name one). Never throws.
template <class... Args>
void say(const LogSink& sink, LogLevel level, LogFields fields, fmt::format_string<Args...> f, Args&&... args) noexcept
{
    try {
        emit(sink, level, fmt::format(f, std::forward<Args>(args)...), "consumer", std::move(fields));
    } catch (...) {
    }
}

/// `fields` with an error field added.
inline LogFields error_field(std::string_view error, LogFields fields = {})
{
    fields.push_back({log_field::error, std::string(error)});
    return fields;
}

/// "topic/partition@offset", as log lines name a record.
inline std::string coords(std::string_view topic, std::int32_t partition, std::int64_t offset)
{
    return fmt::format("{}/{}@{}", topic, partition, offset);
}

/// The fields of a line about one record.
inline LogFields coordinates(std::string_view topic, std::int32_t partition, std::int64_t offset)
{
    return {{log_field::topic, std::string(topic)},
            {log_field::partition, std::to_string(partition)},
            {log_field::offset, std::to_string(offset)}};
}

/// The secrets of a connection string and Kafka property maps (null entries are skipped).
inline Redactor secrets_of(const std::string& conninfo,
                           std::initializer_list<const std::map<std::string, std::string>*> kafka = {})
{
    Redactor r;
    r.add_conninfo(conninfo);
    for (const auto* m : kafka)
        if (m)
            r.add_settings(*m);
    return r;
}

} // namespace idemkafka::detail
