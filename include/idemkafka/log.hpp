#pragma once
/// \file
/// Logging: every failure path of the library writes one record here, with
/// structured fields next to the message. No record carries a secret.

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// Severity of a log record.
enum class LogLevel { debug, info, warning, error };

/// Returns "debug", "info", "warning" or "error".
IDEMKAFKA_API std::string_view to_string(LogLevel level) noexcept;

/// One key/value field of a log record.
struct LogField {
    std::string key;   ///< the field's name, e.g. log_field::topic
    std::string value; ///< its value, as text
};

/// Keys of the fields the library attaches where they are known. A record may
/// carry others (`reason`, `attempt`, `facility`, `code`, ...).
namespace log_field {
/// consumer, relay, maintenance, publisher or librdkafka.
inline constexpr const char* component = "component";
/// The consumer group (on every record of a consumer and of what it runs:
/// maintenance, outbox relay, dead-letter producer, librdkafka).
inline constexpr const char* group = "group";
inline constexpr const char* topic = "topic";         ///< the record's topic
inline constexpr const char* partition = "partition"; ///< the record's partition, in decimal
inline constexpr const char* offset = "offset";       ///< the record's offset, in decimal
inline constexpr const char* event_id = "event_id";   ///< the record's event id, canonical text
/// The error text, also part of the message.
inline constexpr const char* error = "error";
/// The W3C trace id of the record a line is about (from its `traceparent`
/// header), when it has one.
inline constexpr const char* trace_id = "trace_id";
} // namespace log_field

/// One log line: level, message and fields, in the order they were attached
/// (component first).
struct IDEMKAFKA_API LogRecord {
    LogLevel level = LogLevel::info; ///< the record's severity
    std::string message;             ///< the text, redacted
    std::vector<LogField> fields;    ///< log_field keys and others, component first

    /// The value of the first field named `key`, if any. Never throws.
    std::optional<std::string_view> field(std::string_view key) const noexcept;
};

/// Receives the library's log records. Any callable taking `(const
/// LogRecord&)`, or `(LogLevel, std::string_view message)` as before
/// structured fields (that form gets the message only), converts to it.
/// Every record passes through redact() on its way to the callable, so a
/// password-looking value never reaches it. A sink may be called from several
/// threads at once (workers, librdkafka's threads, relay and maintenance
/// threads) and must not throw (an exception from a sink is swallowed).
class IDEMKAFKA_API LogSink {
public:
    /// An empty sink: `bool(sink)` is false. Components treat it as "default".
    LogSink() noexcept = default;
    /// An empty sink, as LogSink(): lets `nullptr` stand for "no sink".
    LogSink(std::nullptr_t) noexcept {}

    /// Wraps `f`, callable as `f(const LogRecord&)` or `f(LogLevel,
    /// std::string_view)` (the first when both work). An empty std::function
    /// or null function pointer gives an empty sink. Throws what copying `f` throws.
    template <class F, std::enable_if_t<!std::is_same_v<std::decay_t<F>, LogSink> &&
                                            (std::is_invocable_v<std::decay_t<F>&, const LogRecord&> ||
                                             std::is_invocable_v<std::decay_t<F>&, LogLevel, std::string_view>),
                                        int> = 0>
    LogSink(F&& f)
    {
        if constexpr (std::is_constructible_v<bool, const std::decay_t<F>&>) {
            if (!static_cast<bool>(f))
                return;
        }
        if constexpr (std::is_invocable_v<std::decay_t<F>&, const LogRecord&>)
            fn_ = std::forward<F>(f);
        else
            fn_ = [g = std::forward<F>(f)](const LogRecord& r) mutable { g(r.level, std::string_view(r.message)); };
    }

    /// Passes `record` on, redacted. No-op on an empty sink. Throws what the
    /// callable throws.
    void operator()(const LogRecord& record) const;
    /// A record with no fields.
    void operator()(LogLevel level, std::string_view message) const;

    /// False for an empty sink. Never throws.
    explicit operator bool() const noexcept { return static_cast<bool>(fn_); }

private:
    std::function<void(const LogRecord&)> fn_;
};

/// `message key=value ...`: a value is double-quoted (with `\"`, `\\`, `\n`
/// escapes) when it is empty or holds a space, `"`, `=` or a control
/// character. Trailing newlines of the message are dropped. Throws only std::bad_alloc.
IDEMKAFKA_API std::string format_text(const LogRecord& record);

/// One JSON object without a newline: `{"level":"error","message":"...",
/// "component":"consumer",...}`, fields as string members in their order (a
/// field named level or message is written as field.level, field.message).
/// Bytes that are not UTF-8 are escaped, so the line is always valid JSON.
/// Throws only std::bad_alloc.
IDEMKAFKA_API std::string format_json(const LogRecord& record);

/// The default sink: one line on stderr, `idemkafka <level>: ` + format_text().
/// Records below `min_level` are dropped. One write per line.
IDEMKAFKA_API LogSink stderr_sink(LogLevel min_level = LogLevel::info);

/// One JSON object per line on stderr (format_json()), for log shippers.
/// Records below `min_level` are dropped. One write per line.
IDEMKAFKA_API LogSink json_sink(LogLevel min_level = LogLevel::info);

} // namespace idemkafka
