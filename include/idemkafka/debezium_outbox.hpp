#pragma once
/// \file
/// Event ids of records written by Debezium's outbox event router
/// (io.debezium.transforms.outbox.EventRouter): the outbox row's id travels in
/// a record header (`id` unless the connector's `table.field.event.id` and
/// placement say otherwise), the value is the row's payload, the key its
/// aggregate id.
///
///     IdempotentConsumer<Order> c{cfg, decode_order, DebeziumOutboxId{}, handle_order};

#include <string>
#include <string_view>

#include "idemkafka/context.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"

namespace idemkafka {

/// The event id in a Debezium outbox header value: a UUID in canonical text,
/// bare (Kafka Connect's SimpleHeaderConverter, the default) or as a JSON
/// string in double quotes (JsonConverter as the header converter). Throws
/// MissingEventId for an empty value (or `""`), InvalidEventId naming the
/// problem for anything else that is not a UUID.
IDEMKAFKA_API EventId parse_debezium_outbox_id(std::string_view header_value);

/// The id function for records of Debezium's outbox event router: the event
/// id in header `header` (the last one, when repeated). The id is used as
/// is: a UUIDv7 outbox id keeps its time for retention; any other version
/// is subject to RetentionConfig::non_v7.
class IDEMKAFKA_API DebeziumOutboxId {
public:
    /// Reads header `header` (Debezium's default: `id`). Throws ConfigError
    /// for an empty name.
    explicit DebeziumOutboxId(std::string header = "id");

    /// parse_debezium_outbox_id() of the header's value. Throws
    /// MissingEventId naming the header when the record has none (or a null
    /// or empty one), InvalidEventId when its value is not a UUID.
    EventId operator()(const Record& record) const;

    /// The header read.
    const std::string& header() const noexcept { return header_; }

private:
    std::string header_;
};

} // namespace idemkafka
