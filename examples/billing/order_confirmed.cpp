#include "order_confirmed.hpp"

#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include <idemkafka/error.hpp>

namespace billing {

std::string encode(const OrderConfirmed& e)
{
    // nlohmann::ordered_json keeps insertion order, so event_id stays first.
    nlohmann::ordered_json j;
    j["event_id"] = e.event_id.to_string();
    j["type"] = "order.confirmed.v1";
    j["order_id"] = e.order_id;
    j["customer_id"] = e.customer_id;
    j["amount_cents"] = e.amount_cents;
    j["currency"] = e.currency;
    j["occurred_at_ms"] = e.occurred_at_ms;
    return j.dump();
}

OrderConfirmed decode(std::string_view payload)
{
    const auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
    if (j.is_discarded() || !j.is_object())
        throw idemkafka::DecodeError("payload is not a JSON object");
    auto text = [&](const char* field) -> std::string {
        auto it = j.find(field);
        if (it == j.end() || !it->is_string())
            throw idemkafka::DecodeError(std::string("missing or non-string field \"") + field + "\"");
        return it->get<std::string>();
    };
    auto integer = [&](const char* field) -> std::int64_t {
        auto it = j.find(field);
        if (it == j.end() || !it->is_number_integer())
            throw idemkafka::DecodeError(std::string("missing or non-integer field \"") + field + "\"");
        // nlohmann stores 2^63..2^64-1 as unsigned; get<int64_t> would wrap them to negatives.
        if (it->is_number_unsigned() &&
            it->get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            throw idemkafka::DecodeError(std::string("field \"") + field + "\" is out of range");
        return it->get<std::int64_t>();
    };
    auto id = j.find("event_id");
    // Told apart so the dead letter says which: a producer that forgot the id
    // needs a different fix from one that sends a malformed id.
    if (id == j.end())
        throw idemkafka::MissingEventId("missing event_id");
    if (!id->is_string())
        throw idemkafka::InvalidEventId("event_id is not a string");
    if (text("type") != "order.confirmed.v1")
        throw idemkafka::DecodeError("unexpected event type \"" + text("type") + "\"");
    OrderConfirmed e;
    e.event_id = idemkafka::EventId::parse(id->get<std::string>());
    e.order_id = text("order_id");
    e.customer_id = text("customer_id");
    e.amount_cents = integer("amount_cents");
    e.currency = text("currency");
    e.occurred_at_ms = integer("occurred_at_ms");
    if (e.order_id.empty())
        throw idemkafka::DecodeError("empty order_id");
    if (e.amount_cents <= 0)
        throw idemkafka::DecodeError("amount_cents must be positive");
    return e;
}

} // namespace billing
