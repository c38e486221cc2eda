#pragma once
/// \file
/// The dead-letter record format. A dead-letter record carries the original
/// key, value and headers unchanged, plus `idemkafka.*` headers saying why it
/// was dead-lettered and where it came from, so it can be inspected and
/// replayed to its source topic (its event id, in the payload, is unchanged, so
/// dedup still protects a replayed event). A record too large for the
/// dead-letter producer goes without its value (then, if still too large,
/// without its headers and key), with `original_value_bytes` and friends
/// saying what was left out: a dead letter always fits.

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// Why a record was dead-lettered; the `idemkafka.reason` header value.
enum class DeadLetterReason {
    decode_error,         ///< the decoder threw
    empty_payload,        ///< null or empty value
    payload_too_large,    ///< value larger than ConsumerConfig::max_payload_bytes
    missing_event_id,     ///< the decoder found no event id (MissingEventId)
    invalid_event_id,     ///< malformed or nil event id (InvalidEventId)
    handler_failed,       ///< the handler threw on every one of max_attempts attempts
    non_retryable,        ///< the handler threw an error classified as not retryable
    beyond_dedup_horizon, ///< the event is older than the dedup retention can protect
    non_v7_event_id,      ///< the event id is not a UUIDv7 where one is required
    event_id_reused,      ///< the event id was processed before with a different payload
                          ///< (ConsumerConfig::payload_fingerprint)
};

/// How many DeadLetterReason values there are (the size of MetricsSnapshot::dead_lettered).
inline constexpr std::size_t dead_letter_reason_count = 10;

/// The header value of a reason, e.g. "decode_error".
IDEMKAFKA_API std::string_view to_string(DeadLetterReason reason) noexcept;
/// The reason of a header value; nullopt for an unknown one.
IDEMKAFKA_API std::optional<DeadLetterReason> parse_dead_letter_reason(std::string_view text) noexcept;

/// Header names of a dead-letter record. Like every header and field name of
/// the library (log_field, outbox_event_id_header), a `const char*`.
namespace dead_letter_header {
inline constexpr const char* reason = "idemkafka.reason"; ///< DeadLetterReason as text (to_string())
inline constexpr const char* error = "idemkafka.error";   ///< what the handler or the check threw, redacted
inline constexpr const char* original_topic = "idemkafka.original.topic";         ///< the record's source topic
inline constexpr const char* original_partition = "idemkafka.original.partition"; ///< its partition, in decimal
inline constexpr const char* original_offset = "idemkafka.original.offset";       ///< its offset, in decimal
inline constexpr const char* original_timestamp = "idemkafka.original.timestamp"; ///< its timestamp (Unix ms)
inline constexpr const char* event_id = "idemkafka.event_id";                     ///< its event id, if decoded
inline constexpr const char* attempts = "idemkafka.attempts";                     ///< failed handler attempts before it
inline constexpr const char* consumer_group = "idemkafka.consumer_group"; ///< the consumer group that dead-lettered it
/// Present when the original value was left out because the dead letter would
/// not fit the dead-letter producer's `message.max.bytes`: its size in bytes.
/// The value is then null; read it at the original coordinates.
inline constexpr const char* original_value_bytes = "idemkafka.original.value_bytes";
/// Present when the original headers were left out too: how many there were.
inline constexpr const char* original_headers_dropped = "idemkafka.original.headers_dropped";
/// Present when the original key was left out too: its size in bytes.
inline constexpr const char* original_key_bytes = "idemkafka.original.key_bytes";
/// Prefix of every header the library adds; strip these when replaying.
inline constexpr const char* prefix = "idemkafka.";
} // namespace dead_letter_header

} // namespace idemkafka
