#pragma once
/// \file
/// Event ids of CloudEvents (https://cloudevents.io, spec 1.0, Kafka protocol
/// binding): the id function for records in binary or structured mode, a
/// decoder helper for both modes, and the mapping of an event's identity
/// (`source` + `id`) to the UUID the claims table keys on.
///
///     // binary mode: the payload is the data, the attributes are ce_* headers
///     IdempotentConsumer<Order> c{cfg, decode_order, cloud_event_record_id, handle_order};
///     // either mode, the attributes and the data decoded by the library
///     IdempotentConsumer<CloudEvent> c{cfg, decode_cloud_event, &CloudEvent::event_id, handle};
///
/// Retention: cloud_event_id() keeps the time of an id that is a UUIDv7; any
/// other id maps to a name-based UUIDv5 without a time, to which
/// RetentionConfig::non_v7 applies (see docs/event-ids.md, "Producers' event ids").

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "idemkafka/context.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"

namespace idemkafka {

/// Header names of the CloudEvents Kafka binding (binary mode), and the
/// content type of structured mode.
namespace cloud_event_header {
inline constexpr const char* id = "ce_id";                   ///< `id` (with `source`, the identity)
inline constexpr const char* source = "ce_source";           ///< `source`
inline constexpr const char* type = "ce_type";               ///< `type`
inline constexpr const char* specversion = "ce_specversion"; ///< `specversion`
inline constexpr const char* time = "ce_time";               ///< `time`
inline constexpr const char* subject = "ce_subject";         ///< `subject`
inline constexpr const char* dataschema = "ce_dataschema";   ///< `dataschema`
/// Prefix of every attribute header; other `ce_*` headers are extensions.
inline constexpr const char* prefix = "ce_";
/// The record's content type: `datacontenttype` in binary mode,
/// `application/cloudevents+json` in structured mode.
inline constexpr const char* content_type = "content-type";
/// The media type of a structured-mode record (parameters such as
/// `; charset=utf-8` may follow; compared case-insensitively).
inline constexpr const char* structured_media_type = "application/cloudevents+json";
} // namespace cloud_event_header

/// The namespace of cloud_event_id()'s UUIDv5:
/// UUIDv5(NAMESPACE_URL, "urn:idemkafka:cloudevents") =
/// 9d340a48-9e6d-5ad6-9ea3-d51fd47669b9.
IDEMKAFKA_API EventId cloud_event_namespace() noexcept;

/// The dedup key of the CloudEvent with these `source` and `id` attributes:
/// the same pair always gives the same UUID, on every platform and in every
/// version of the library, and different pairs different ones. The name
/// hashed is `<bytes of source, in decimal>:<source><id>` (so no pair is
/// another's in disguise); the UUID is UUIDv5(cloud_event_namespace(), name),
/// except for an `id` that is a UUIDv7 in canonical text: then its first 48
/// bits (its time) are kept, with version 7, and the other 74 bits are that
/// UUIDv5's, so the time-partitioned claims table and the dedup-horizon guard
/// work as for any UUIDv7. A UUIDv4 `id` is hashed with its source like any
/// other string: per the spec, two sources may use the same id. Throws
/// MissingEventId for an empty `source` or `id`.
IDEMKAFKA_API EventId cloud_event_id(std::string_view source, std::string_view id);

/// A CloudEvent as decode_cloud_event() reads it from a record.
struct CloudEvent {
    std::string id;                             ///< `id`: never empty
    std::string source;                         ///< `source`: never empty
    std::string type;                           ///< `type`: never empty
    std::string specversion;                    ///< `specversion` as sent (e.g. "1.0")
    std::optional<std::string> time;            ///< `time` as sent (RFC 3339 text; not checked)
    std::optional<std::string> subject;         ///< `subject`
    std::optional<std::string> datacontenttype; ///< `datacontenttype` (binary mode: the `content-type` header)
    std::optional<std::string> dataschema;      ///< `dataschema`
    /// Extension attributes by name. Structured mode: a JSON string as its
    /// text, a number or boolean as its JSON text.
    std::map<std::string, std::string> extensions;
    /// The event data, nothing when there is none (or it is JSON `null`).
    /// Binary mode: the record's value, byte for byte. Structured mode:
    /// `data_base64` decoded; a string `data` whose datacontenttype is not
    /// JSON, as the string; any other `data` as its JSON text, byte for byte
    /// as the producer wrote it (every digit of a number kept).
    std::optional<std::string> data;
    /// True when the record was in structured mode.
    bool structured = false;

    /// cloud_event_id(source, id). Throws MissingEventId if either is empty.
    EventId event_id() const { return cloud_event_id(source, id); }
};

/// Reads a structured-mode envelope (`application/cloudevents+json`, spec
/// 1.0 JSON format): a JSON object with string attributes `specversion`,
/// `id`, `source`, `type` (required) and `time`, `subject`,
/// `datacontenttype`, `dataschema` (optional), extensions (strings, numbers,
/// booleans), and at most one of `data` and `data_base64`. Throws
/// MissingEventId when `id` or `source` is absent, null or empty;
/// InvalidEventId when either is not a string; DecodeError for anything else
/// (not JSON, not an object, a required
/// attribute missing, an attribute of the wrong type, both data members,
/// `data_base64` not base64), each naming what is wrong.
IDEMKAFKA_API CloudEvent parse_cloud_event(std::string_view json);

/// Decodes a record in either mode of the Kafka binding: structured when its
/// `content-type` header is `application/cloudevents+json` (parameters
/// allowed, any case): parse_cloud_event() of the value; binary otherwise:
/// the attributes from the `ce_*` headers (the last of a repeated header
/// counts), the value as the data. Throws as parse_cloud_event(), and in
/// binary mode MissingEventId when `ce_id` or `ce_source` is absent, null or
/// empty, DecodeError when `ce_specversion` or `ce_type` is, and for a
/// content type of another CloudEvents format (batch, Avro, Protobuf).
IDEMKAFKA_API CloudEvent decode_cloud_event(const Record& record);

/// The id function for CloudEvents records, whatever the decoder:
/// cloud_event_id() of the `ce_source` and `ce_id` headers (binary mode),
/// or, for a structured-mode record, of the envelope's attributes (which
/// parses the envelope again: with structured records, decode with
/// decode_cloud_event() and take &CloudEvent::event_id instead). Throws
/// MissingEventId when the id or source is absent or empty, and as
/// decode_cloud_event() for a malformed envelope.
IDEMKAFKA_API EventId cloud_event_record_id(const Record& record);

} // namespace idemkafka
