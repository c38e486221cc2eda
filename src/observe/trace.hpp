#pragma once
// W3C trace context carried from a consumed record to its handler, its log
// lines and what the handler publishes. Private to the library.

#include <optional>
#include <string_view>
#include <vector>

#include "idemkafka/context.hpp"

namespace idemkafka::detail {

inline constexpr std::string_view traceparent_header = "traceparent";
inline constexpr std::string_view tracestate_header = "tracestate";

/// `value` when it is a well-formed W3C traceparent, else nothing.
std::optional<std::string_view> valid_traceparent(std::string_view value) noexcept;

/// The well-formed `traceparent` among `headers`, if any.
std::optional<std::string_view> trace_parent_of(const std::vector<Header>& headers) noexcept;

/// The trace id (32 hex digits) of a well-formed traceparent.
inline std::string_view trace_id_of(std::string_view traceparent) noexcept
{
    return traceparent.substr(3, 32);
}

/// Marks the record whose handler call runs on this thread, for the length
/// of the call: what the handler publishes through Outbox::enqueue() or a
/// Publisher carries its trace context. Null: no single record (a batch
/// call of several).
class TraceScope {
public:
    explicit TraceScope(const Record* record) noexcept;
    ~TraceScope();
    TraceScope(const TraceScope&) = delete;
    TraceScope& operator=(const TraceScope&) = delete;

private:
    const Record* previous_;
};

/// `headers` with the trace context of the record whose handler call runs
/// on this thread added, unless they carry a `traceparent` already or there
/// is none. Returns `headers` itself when nothing is added.
const std::vector<Header>& with_trace(const std::vector<Header>& headers, std::vector<Header>& storage);

} // namespace idemkafka::detail
