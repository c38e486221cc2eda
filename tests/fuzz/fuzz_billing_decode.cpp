// Properties of billing::decode on arbitrary bytes: it either throws
// idemkafka::DecodeError / idemkafka::InvalidEventId, or returns an event that
//  - has a non-empty order id, a positive amount and an id whose text parses back;
//  - carries exactly the values of the payload's fields (no silent wrap-around or
//    truncation of numbers, the event_id taken from "event_id");
//  - survives encode() -> decode() with every field unchanged, with "event_id" first
//    on the wire.

#include "fuzz_check.hpp"
#include "order_confirmed.hpp"

#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <string_view>

using billing::OrderConfirmed;

namespace {

enum class Outcome { decoded, rejected };

Outcome decode_checked(std::string_view payload, OrderConfirmed& out, const char* what)
{
    try {
        out = billing::decode(payload);
        return Outcome::decoded;
    } catch (const idemkafka::DecodeError&) {
        return Outcome::rejected;
    } catch (const idemkafka::InvalidEventId&) {
        return Outcome::rejected;
    } catch (const std::exception& e) {
        FUZZ_CHECK(false, "decode(%s) threw an exception outside the contract: %s", what, e.what());
    } catch (...) {
        FUZZ_CHECK(false, "decode(%s) threw a non-std exception", what);
    }
    return Outcome::rejected;
}

// The payload's own value of an integer field, when it fits the event's int64.
bool json_int64(const nlohmann::json& j, const char* field, std::int64_t& out)
{
    const auto it = j.find(field);
    if (it == j.end())
        return false;
    if (it->is_number_unsigned()) {
        const auto u = it->get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
            return false;
        out = static_cast<std::int64_t>(u);
        return true;
    }
    if (!it->is_number_integer())
        return false;
    out = it->get<std::int64_t>();
    return true;
}

void check_matches_payload(std::string_view payload, const OrderConfirmed& e)
{
    const auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
    FUZZ_CHECK(!j.is_discarded() && j.is_object(), "decode() accepted a payload that is not a JSON object");

    auto string_field = [&](const char* field, const std::string& decoded) {
        const auto it = j.find(field);
        FUZZ_CHECK(it != j.end() && it->is_string(), "decoded without a string \"%s\"", field);
        FUZZ_CHECK(it->get<std::string>() == decoded, "\"%s\" decoded as \"%s\"", field, decoded.c_str());
    };
    string_field("order_id", e.order_id);
    string_field("customer_id", e.customer_id);
    string_field("currency", e.currency);
    FUZZ_CHECK(j.at("type") == "order.confirmed.v1", "decoded an event of another type");

    auto int_field = [&](const char* field, std::int64_t decoded) {
        std::int64_t expected = 0;
        FUZZ_CHECK(json_int64(j, field, expected), "decoded \"%s\" as %lld although the payload's %s is no int64",
                   field, static_cast<long long>(decoded),
                   j.find(field) == j.end() ? "(missing)" : j.at(field).dump().c_str());
        FUZZ_CHECK(expected == decoded, "\"%s\" is %lld in the payload, %lld decoded", field,
                   static_cast<long long>(expected), static_cast<long long>(decoded));
    };
    int_field("amount_cents", e.amount_cents);
    int_field("occurred_at_ms", e.occurred_at_ms);

    const auto id = j.find("event_id");
    FUZZ_CHECK(id != j.end() && id->is_string(), "decoded without a string \"event_id\"");
    idemkafka::EventId from_payload;
    FUZZ_CHECK(idemkafka::EventId::try_parse(id->get<std::string>(), from_payload) && from_payload == e.event_id,
               "event_id decoded as %s, payload has %s", e.event_id.to_string().c_str(), id->dump().c_str());
}

bool same_fields(const OrderConfirmed& a, const OrderConfirmed& b)
{
    return a.event_id == b.event_id && a.order_id == b.order_id && a.customer_id == b.customer_id &&
           a.amount_cents == b.amount_cents && a.currency == b.currency && a.occurred_at_ms == b.occurred_at_ms;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    // An exactly-sized heap copy lets ASan catch reads past the end of the payload.
    const std::string owned(reinterpret_cast<const char*>(data), size);

    OrderConfirmed event;
    if (decode_checked(owned, event, "fuzz input") == Outcome::rejected)
        return 0;

    FUZZ_CHECK(!event.order_id.empty(), "decoded an empty order_id");
    FUZZ_CHECK(event.amount_cents > 0, "decoded amount_cents %lld", static_cast<long long>(event.amount_cents));
    idemkafka::EventId reparsed;
    FUZZ_CHECK(idemkafka::EventId::try_parse(event.event_id.to_string(), reparsed) && reparsed == event.event_id,
               "decoded event id %s does not parse back", event.event_id.to_string().c_str());
    check_matches_payload(owned, event);

    std::string wire;
    try {
        wire = billing::encode(event);
    } catch (const std::exception& e) {
        FUZZ_CHECK(false, "encode() of a decoded event threw: %s", e.what());
    }
    constexpr std::string_view first_field = "{\"event_id\":";
    FUZZ_CHECK(wire.compare(0, first_field.size(), first_field) == 0, "encode() does not start with event_id: %s",
               wire.c_str());

    OrderConfirmed again;
    FUZZ_CHECK(decode_checked(wire, again, "re-encoded event") == Outcome::decoded,
               "the re-encoded event was rejected: %s", wire.c_str());
    FUZZ_CHECK(same_fields(event, again), "fields changed through encode() -> decode(): %s", wire.c_str());
    return 0;
}
