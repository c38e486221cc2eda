// Properties of the CloudEvents envelope parser (parse_cloud_event) and of the
// record id function (cloud_event_record_id) on arbitrary bytes:
//  - a rejection is MissingEventId, InvalidEventId or DecodeError only, with a
//    bounded message (the envelope never leaks into a log line whole);
//  - an accepted envelope has a non-empty id, source, type and specversion, and
//    its dedup key is cloud_event_id(source, id): version 5, or 7 with the
//    id's own time when the id is a UUIDv7, always of the RFC variant;
//  - what it reads agrees with nlohmann's own document of the input: the id,
//    the source, and the data (its JSON text parses to the document's `data`);
//  - the record id function agrees with the parser on every envelope (the same
//    key, or a rejection of the same kind), and the same bytes as a binary-mode
//    ce_id header give the key of (ce_source, those bytes).

#include "fuzz_check.hpp"

#include <idemkafka/cloud_events.hpp>
#include <idemkafka/error.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

using namespace idemkafka;

namespace {

// The longest message names an attribute, a JSON type and up to 64 quoted
// characters; nlohmann's parse errors quote what they read last.
constexpr std::size_t max_message_length = 600;

enum class Outcome { accepted, missing, invalid, decode };

template <class F> Outcome run(F&& f, EventId& key)
{
    try {
        key = f();
        return Outcome::accepted;
    } catch (const MissingEventId& e) {
        FUZZ_CHECK(std::string_view(e.what()).size() < max_message_length, "message: %s", e.what());
        return Outcome::missing;
    } catch (const InvalidEventId& e) {
        FUZZ_CHECK(std::string_view(e.what()).size() < max_message_length, "message: %s", e.what());
        return Outcome::invalid;
    } catch (const DecodeError& e) {
        FUZZ_CHECK(std::string_view(e.what()).size() < max_message_length, "message: %s", e.what());
        return Outcome::decode;
    } catch (const std::exception& e) {
        FUZZ_CHECK(false, "unexpected exception: %s", e.what());
    }
    return Outcome::decode;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    const std::string_view input(reinterpret_cast<const char*>(data), size);

    EventId parsed_key;
    CloudEvent ev;
    const auto parsed = run(
        [&] {
            ev = parse_cloud_event(input);
            return ev.event_id();
        },
        parsed_key);
    if (parsed == Outcome::accepted) {
        FUZZ_CHECK(!ev.id.empty() && !ev.source.empty() && !ev.type.empty() && !ev.specversion.empty(),
                   "empty required attribute");
        FUZZ_CHECK(ev.structured, "structured not set");
        FUZZ_CHECK(parsed_key == cloud_event_id(ev.source, ev.id), "key is not a function of source and id");
        FUZZ_CHECK(parsed_key.is_rfc_variant(), "variant");
        EventId given;
        const bool v7 = EventId::try_parse(ev.id, given) && given.version() == 7 && given.is_rfc_variant();
        FUZZ_CHECK(parsed_key.version() == (v7 ? 7 : 5), "version %d", parsed_key.version());
        if (v7)
            FUZZ_CHECK(parsed_key.unix_ms() == given.unix_ms(), "time of a UUIDv7 id not kept");
        const auto doc = nlohmann::json::parse(input.begin(), input.end());
        FUZZ_CHECK(doc.is_object() && doc.at("id") == ev.id && doc.at("source") == ev.source,
                   "id or source differs from the document's");
        const auto data = doc.find("data");
        if (data != doc.end() && !data->is_null()) {
            FUZZ_CHECK(ev.data.has_value(), "data lost");
            const bool as_text = data->is_string() && *ev.data == data->get<std::string>();
            if (!as_text)
                FUZZ_CHECK(nlohmann::json::accept(*ev.data) && nlohmann::json::parse(*ev.data) == *data,
                           "data differs from the document's: %s", ev.data->c_str());
        }
    }

    Record structured;
    structured.topic = "fuzz";
    structured.value = input;
    structured.headers.push_back({"content-type", std::string("application/cloudevents+json; charset=utf-8")});
    EventId record_key;
    const auto by_record = run([&] { return cloud_event_record_id(structured); }, record_key);
    // The record id function reads only id and source: it may accept an envelope
    // the parser refuses for another attribute, never the other way round.
    if (parsed == Outcome::accepted)
        FUZZ_CHECK(by_record == Outcome::accepted && record_key == parsed_key, "record id disagrees with the parser");
    if (parsed == Outcome::missing || parsed == Outcome::invalid)
        FUZZ_CHECK(by_record == parsed, "record id rejects the identity differently");

    Record binary;
    binary.topic = "fuzz";
    binary.value = input;
    binary.headers.push_back({"ce_source", std::string("/fuzz")});
    binary.headers.push_back({"ce_id", std::string(input)});
    EventId binary_key;
    const auto by_header = run([&] { return cloud_event_record_id(binary); }, binary_key);
    if (input.empty())
        FUZZ_CHECK(by_header == Outcome::missing, "empty ce_id accepted");
    else
        FUZZ_CHECK(by_header == Outcome::accepted && binary_key == cloud_event_id("/fuzz", input),
                   "ce_id header not taken as is");
    return 0;
}
