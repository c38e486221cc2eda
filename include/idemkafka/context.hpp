#pragma once
/// \file
/// Record (a consumed Kafka record, as the decoder sees it) and Context (what
/// the handler is told about the record it is processing).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"

namespace idemkafka {

/// One Kafka record header. A header may have a null value.
struct Header {
    std::string name;                 ///< the header's name
    std::optional<std::string> value; ///< nullopt for a null value
};

/// A consumed record. Views stay valid while the record's batch is processed
/// (during decode and handler calls); copy what must outlive them.
struct Record {
    std::string_view topic;     ///< the record's topic
    std::int32_t partition = 0; ///< the record's partition
    std::int64_t offset = 0;    ///< the record's offset
    /// Broker or producer timestamp in Unix milliseconds, -1 if unknown.
    std::int64_t timestamp_ms = -1;
    /// Null key and null value are distinct from empty ones.
    std::optional<std::string_view> key;
    std::optional<std::string_view> value; ///< the payload, for the decoder
    std::vector<Header> headers;           ///< in record order; names may repeat
};

/// Per-record context handed to the handler.
class IDEMKAFKA_API Context {
public:
    /// Built by the consumer for each record: `attempt` counts from 1, `key_window_open`
    /// is idempotency_key_window_open(). Keeps a pointer to `record`, which must outlive it.
    Context(const Record& record, const EventId& id, int attempt, bool key_window_open = true) noexcept
        : record_(&record), id_(id), attempt_(attempt), key_window_open_(key_window_open)
    {
    }

    /// The record's event id (the dedup key).
    const EventId& event_id() const noexcept { return id_; }
    /// The event id in canonical text form: pass it as the `Idempotency-Key` of a
    /// downstream call, so a call repeated after a rolled-back transaction is
    /// recognised by the callee.
    std::string idempotency_key() const { return id_.to_string(); }
    /// False when the event is older than RetentionConfig::downstream_key_window:
    /// the downstream service may have forgotten the idempotency key, so check
    /// the outcome of an earlier attempt before calling it again. Always true
    /// when no window is configured.
    bool idempotency_key_window_open() const noexcept { return key_window_open_; }
    /// The record's topic.
    std::string_view topic() const noexcept { return record_->topic; }
    /// The record's partition.
    std::int32_t partition() const noexcept { return record_->partition; }
    /// The record's offset.
    std::int64_t offset() const noexcept { return record_->offset; }
    /// The record's timestamp in Unix milliseconds, -1 if unknown.
    std::int64_t timestamp_ms() const noexcept { return record_->timestamp_ms; }
    /// The record's key; nullopt for a null key.
    std::optional<std::string_view> key() const noexcept { return record_->key; }
    /// The record's headers, in record order.
    const std::vector<Header>& headers() const noexcept { return record_->headers; }
    /// Returns the value of the first header called `name`, if any (a header with
    /// a null value reads as empty).
    std::optional<std::string_view> header(std::string_view name) const noexcept;
    /// 1 on the first delivery to the handler, 2 on the first retry after the
    /// handler threw, and so on: also across rebalances and restarts, as far
    /// as the failures were committed with the partition's offset (see the
    /// failure table in docs/failures.md). Failures the circuit breaker took for an
    /// outage's do not count (ConsumerConfig::circuit_breaker).
    int attempt() const noexcept { return attempt_; }

    /// The record's W3C trace context (https://www.w3.org/TR/trace-context/):
    /// the value of its `traceparent` header when that is well formed
    /// (`00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, ids not all
    /// zero; a later version's longer form is taken too), else nothing. Start a
    /// span from it with your tracing library; idemkafka itself has no
    /// tracing dependency.
    std::optional<std::string_view> trace_parent() const noexcept;
    /// The record's `tracestate` header, only when trace_parent() is there.
    std::optional<std::string_view> trace_state() const noexcept;
    /// The 32 hex digits of the trace id of trace_parent(); empty without one.
    std::string_view trace_id() const noexcept;
    /// `traceparent` (and `tracestate`, when present) to put on a record this
    /// handler publishes. Outbox::enqueue() and Publisher add them by
    /// themselves inside a handler call for one record; a batch handler
    /// passes each event's own.
    std::vector<Header> trace_headers() const;
    /// The whole record.
    const Record& record() const noexcept { return *record_; }

private:
    const Record* record_;
    EventId id_;
    int attempt_;
    bool key_window_open_;
};

} // namespace idemkafka
