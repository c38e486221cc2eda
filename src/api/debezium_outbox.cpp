#include "idemkafka/debezium_outbox.hpp"

#include <string>

#include "api/record_headers.hpp"
#include "idemkafka/error.hpp"

namespace idemkafka {

EventId parse_debezium_outbox_id(std::string_view header_value)
{
    // JsonConverter writes the header as a JSON string: one pair of quotes
    // around the UUID, nothing to unescape in a UUID.
    if (header_value.size() >= 2 && header_value.front() == '"' && header_value.back() == '"')
        header_value = header_value.substr(1, header_value.size() - 2);
    if (header_value.empty())
        throw MissingEventId("Debezium outbox id header is empty");
    EventId id;
    if (!EventId::try_parse(header_value, id))
        EventId::parse(header_value); // throws InvalidEventId naming the problem
    return id;
}

DebeziumOutboxId::DebeziumOutboxId(std::string header) : header_(std::move(header))
{
    if (header_.empty())
        throw ConfigError("DebeziumOutboxId: the header name is empty (Debezium's default is \"id\")");
}

EventId DebeziumOutboxId::operator()(const Record& record) const
{
    const auto* found = detail::last_header(record, header_);
    if (!found)
        throw MissingEventId("record has no '" + header_ + "' header (Debezium outbox event id)");
    if (!found->value)
        throw MissingEventId("record's '" + header_ + "' header (Debezium outbox event id) is null");
    try {
        return parse_debezium_outbox_id(*found->value);
    } catch (const MissingEventId&) {
        throw MissingEventId("record's '" + header_ + "' header (Debezium outbox event id) is empty");
    } catch (const InvalidEventId& e) {
        throw InvalidEventId("record's '" + header_ + "' header (Debezium outbox event id): " + e.what());
    }
}

} // namespace idemkafka
