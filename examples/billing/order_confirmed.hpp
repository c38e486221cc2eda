#pragma once
// The order.confirmed.v1 event and its JSON wire format. The event id (a
// UUIDv7 minted by the producer) is the first field of the payload.

#include <cstdint>
#include <string>
#include <string_view>

#include <idemkafka/event_id.hpp>

namespace billing {

struct OrderConfirmed {
    idemkafka::EventId event_id;
    std::string order_id;
    std::string customer_id;
    std::int64_t amount_cents = 0;
    std::string currency;
    std::int64_t occurred_at_ms = 0;
};

/// JSON with "event_id" first.
std::string encode(const OrderConfirmed& e);

/// Strict decoder: throws idemkafka::DecodeError for anything that is not a
/// complete order.confirmed.v1 object, idemkafka::MissingEventId (an
/// InvalidEventId) when there is no "event_id", idemkafka::InvalidEventId for a
/// malformed one.
OrderConfirmed decode(std::string_view payload);

inline idemkafka::EventId event_id_of(const OrderConfirmed& e)
{
    return e.event_id;
}

} // namespace billing
