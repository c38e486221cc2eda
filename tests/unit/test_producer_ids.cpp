// Event ids of CloudEvents and Debezium outbox records: the name-based
// mapping (pinned vectors), the envelope parser, the binary-mode headers, and
// the id-function shapes the consumer takes.

#include "catch_compat.hpp"

#include "core/sha1.hpp"
#include "idemkafka/cloud_events.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/debezium_outbox.hpp"
#include "idemkafka/error.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

using namespace idemkafka;

namespace {

std::string hex(const detail::Sha1::Digest& d)
{
    static const char digits[] = "0123456789abcdef";
    std::string out;
    for (auto b : d) {
        out += digits[b >> 4];
        out += digits[b & 0x0F];
    }
    return out;
}

std::string sha1_hex(std::string_view text)
{
    detail::Sha1 sha;
    sha.update(text);
    return hex(sha.finish());
}

// "missing", "invalid", "decode", "config" or "none", with the message: the
// Catch2 v2 and v3 matchers differ, so the test looks at both itself.
struct Thrown {
    std::string kind;
    std::string message;
};

template <class F> Thrown thrown_by(F&& f)
{
    try {
        f();
    } catch (const MissingEventId& e) {
        return {"missing", e.what()};
    } catch (const InvalidEventId& e) {
        return {"invalid", e.what()};
    } catch (const DecodeError& e) {
        return {"decode", e.what()};
    } catch (const ConfigError& e) {
        return {"config", e.what()};
    }
    return {"none", ""};
}

bool contains(const std::string& text, std::string_view part)
{
    return text.find(part) != std::string::npos;
}

Record record_with(std::vector<Header> headers, std::optional<std::string_view> value)
{
    Record r;
    r.topic = "t";
    r.headers = std::move(headers);
    r.value = value;
    return r;
}

const std::vector<Header> binary_headers = {
    {"ce_specversion", std::string("1.0")},
    {"ce_id", std::string("A234-1234-1234")},
    {"ce_source", std::string("/orders")},
    {"ce_type", std::string("com.example.order.confirmed")},
    {"ce_time", std::string("2026-12-02T08:00:00Z")},
    {"ce_tenant", std::string("acme")},
    {"content-type", std::string("application/json")},
    {"traceparent", std::string("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
};

} // namespace

TEST_CASE("SHA-1 gives the FIPS 180 test vectors", "[unit][producer_ids]")
{
    CHECK(sha1_hex("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    CHECK(sha1_hex("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d");
    CHECK(sha1_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    detail::Sha1 million;
    const std::string chunk(1000, 'a');
    // Uneven pieces, so that updates end anywhere in a 64-byte block.
    for (std::size_t i = 0; i < 1000; ++i) {
        const std::string_view a(chunk);
        million.update(a.substr(0, i % 67));
        million.update(a.substr(i % 67));
    }
    CHECK(hex(million.finish()) == "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

TEST_CASE("cloud_event_id maps source and id to pinned UUIDs", "[unit][producer_ids]")
{
    // The namespace is UUIDv5(NAMESPACE_URL, "urn:idemkafka:cloudevents"), derived here again.
    detail::Sha1 sha;
    const EventId url_ns = EventId::parse("6ba7b811-9dad-11d1-80b4-00c04fd430c8");
    sha.update(url_ns.bytes().data(), 16);
    sha.update("urn:idemkafka:cloudevents");
    auto d = sha.finish();
    EventId::Bytes b{};
    for (std::size_t i = 0; i < 16; ++i)
        b[i] = d[i];
    b[6] = static_cast<std::uint8_t>((b[6] & 0x0F) | 0x50);
    b[8] = static_cast<std::uint8_t>((b[8] & 0x3F) | 0x80);
    CHECK(EventId(b) == cloud_event_namespace());
    CHECK(cloud_event_namespace().to_string() == "9d340a48-9e6d-5ad6-9ea3-d51fd47669b9");

    // Computed independently with Python's uuid.uuid5 (docs/event-ids.md, "Producers' event ids"):
    // these values are the dedup keys of events already claimed; they never change.
    struct Vector {
        const char* source;
        const char* id;
        const char* uuid;
    };
    const Vector vectors[] = {
        {"/orders", "A234-1234-1234", "76835fb0-d78b-5fda-b551-122da6ab8d1d"},
        {"https://example.com/billing", "42", "ed81bc0d-666d-593c-866b-6ac04f20acd7"},
        {"a", "bc", "3ce76cbc-2506-5f24-a73c-04ee682a0693"},
        {"ab", "c", "a844b711-d3b9-59a7-b021-b8b249fcae65"},
        {"/s", "f47ac10b-58cc-4372-a567-0e02b2c3d479", "03e84813-a935-582f-82f7-9591c6ad1f34"},
        {"/s", "018f3e4c-9a1b-7c2d-8e3f-a0b1c2d3e4f5", "018f3e4c-9a1b-7ce0-8fc1-0c091ae2fc33"},
        {"/t", "018f3e4c-9a1b-7c2d-8e3f-a0b1c2d3e4f5", "018f3e4c-9a1b-7232-b78c-355821563eee"},
        // Upper case is another id string; still a UUIDv7, so its time is kept.
        {"/s", "018F3E4C-9A1B-7C2D-8E3F-A0B1C2D3E4F5", "018f3e4c-9a1b-7345-93df-bb2a520eae75"},
        {"/b\xc3\xbc"
         "cher",
         "x", "5bf888ba-baca-59b6-9005-b5672ff637cd"},
    };
    for (const auto& v : vectors) {
        INFO(v.source << " " << v.id);
        CHECK(cloud_event_id(v.source, v.id).to_string() == v.uuid);
    }
}

TEST_CASE("cloud_event_id: versions, the kept time, and what is refused", "[unit][producer_ids]")
{
    const auto v5 = cloud_event_id("/orders", "order-1");
    CHECK(v5.version() == 5);
    CHECK(v5.is_rfc_variant());
    CHECK(cloud_event_id("/orders", "order-1") == v5);
    CHECK(cloud_event_id("/orders", "order-2") != v5);
    CHECK(cloud_event_id("/refunds", "order-1") != v5);

    const auto minted = new_event_id();
    const auto kept = cloud_event_id("/orders", minted.to_string());
    CHECK(kept.version() == 7);
    CHECK(kept.is_rfc_variant());
    CHECK(kept.unix_ms() == minted.unix_ms());
    CHECK(kept != minted); // identity is source + id: the source is in the other 74 bits
    CHECK(cloud_event_id("/refunds", minted.to_string()).unix_ms() == minted.unix_ms());
    CHECK(cloud_event_id("/refunds", minted.to_string()) != kept);

    CHECK(thrown_by([] { cloud_event_id("/orders", ""); }).kind == "missing");
    CHECK(thrown_by([] { cloud_event_id("", "1"); }).kind == "missing");
}

TEST_CASE("parse_cloud_event reads a structured envelope", "[unit][producer_ids]")
{
    const auto ev = parse_cloud_event(R"({"specversion":"1.0","id":"A234-1234-1234","source":"/orders",
        "type":"com.example.order.confirmed","time":"2026-12-02T08:00:00Z","subject":"order-7",
        "datacontenttype":"application/json","tenant":"acme","priority":3,"urgent":true,"empty":null,
        "data":{"z":1,"a":[1,2.5,"x"],"amount":12999}})");
    CHECK(ev.structured);
    CHECK(ev.id == "A234-1234-1234");
    CHECK(ev.source == "/orders");
    CHECK(ev.type == "com.example.order.confirmed");
    CHECK(ev.specversion == "1.0");
    CHECK(ev.time == std::optional<std::string>("2026-12-02T08:00:00Z"));
    CHECK(ev.subject == std::optional<std::string>("order-7"));
    CHECK(ev.datacontenttype == std::optional<std::string>("application/json"));
    CHECK_FALSE(ev.dataschema);
    CHECK(ev.extensions ==
          std::map<std::string, std::string>{{"tenant", "acme"}, {"priority", "3"}, {"urgent", "true"}});
    CHECK(ev.data == std::optional<std::string>(R"({"z":1,"a":[1,2.5,"x"],"amount":12999})"));
    CHECK(ev.event_id() == cloud_event_id("/orders", "A234-1234-1234"));

    const auto text = parse_cloud_event(
        R"({"specversion":"1.0","id":"1","source":"/s","type":"t","datacontenttype":"text/plain","data":"hello"})");
    CHECK(text.data == std::optional<std::string>("hello"));
    const auto json_string =
        parse_cloud_event(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":"hello"})");
    CHECK(json_string.data == std::optional<std::string>("\"hello\""));
    const auto binary =
        parse_cloud_event(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"AAEC/w=="})");
    CHECK(binary.data == std::optional<std::string>(std::string("\x00\x01\x02\xff", 4)));
    CHECK(parse_cloud_event(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"aGk="})").data ==
          std::optional<std::string>("hi"));
    CHECK_FALSE(parse_cloud_event(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":null})").data);

    // data as the producer wrote it: every digit, the spacing, the key order; also
    // nested deep (nothing here recurses on it); escaped member names and values are read.
    const std::string exact = R"({ "amount" : 123456789012345678901234567890.123456789012345678, "b":[ 1 ,2 ] })";
    const auto precise = parse_cloud_event(
        "\xEF\xBB\xBF {\"specversion\":\"1.0\",\"id\":\"a\\\"b\",\"sour\\u0063e\":\"/s\",\"type\":\"t\",\"data\": " +
        exact + " ,\"x\":-1.5e3 }");
    CHECK(precise.data == std::optional<std::string>(exact));
    CHECK(precise.id == "a\"b");
    CHECK(precise.source == "/s");
    CHECK(precise.extensions == std::map<std::string, std::string>{{"x", "-1.5e3"}});
    const std::string nested = std::string(5000, '[') + std::string(5000, ']');
    CHECK(parse_cloud_event(R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":)" + nested + "}").data ==
          std::optional<std::string>(nested));
    // A repeated member: the last one counts.
    CHECK(parse_cloud_event(R"({"specversion":"1.0","id":"1","id":"2","source":"/s","type":"t"})").id == "2");
}

TEST_CASE("parse_cloud_event names what is wrong with a malformed envelope", "[unit][producer_ids]")
{
    struct Case {
        std::string json;
        const char* kind;
        const char* says;
    };
    const std::string deep = std::string(300, '[') + std::string(300, ']');
    const std::vector<Case> cases = {
        {"{\"id\":", "decode", "not JSON"},
        {"", "decode", "not JSON"},
        {"[1,2]", "decode", "must be a JSON object, got array"},
        {R"({"specversion":"1.0","source":"/s","type":"t"})", "missing", "no 'id' attribute"},
        {R"({"specversion":"1.0","id":"","source":"/s","type":"t"})", "missing", "'id' is empty"},
        {R"({"specversion":"1.0","id":null,"source":"/s","type":"t"})", "missing", "'id' is null"},
        {R"({"specversion":"1.0","id":42,"source":"/s","type":"t"})", "invalid", "'id' must be a string, got number"},
        {R"({"specversion":"1.0","id":"1","type":"t"})", "missing", "no 'source' attribute"},
        {R"({"specversion":"1.0","id":"1","source":["/s"],"type":"t"})", "invalid", "'source' must be a string"},
        {R"({"id":"1","source":"/s","type":"t"})", "decode", "no 'specversion' attribute"},
        {R"({"specversion":"1.0","id":"1","source":"/s"})", "decode", "no 'type' attribute"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":""})", "decode", "'type' is empty"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","time":5})", "decode",
         "'time' must be a string, got number"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AA=="})", "decode",
         "both 'data' and 'data_base64'"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"AA="})", "decode",
         "not a multiple of 4"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":"A*=="})", "decode",
         "'data_base64' is not base64: character \"*\" at position 1"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","data_base64":7})", "decode",
         "'data_base64' must be a string"},
        {R"({"specversion":"1.0","id":"1","source":"/s","type":"t","ext":{"a":1}})", "decode",
         "extension \"ext\" must be a string, number or boolean, got object"},
        // The message stops short of the token read last, however long (the fuzzer's find).
        {"{\"id\":\"" + std::string(5000, 'a'), "decode", "missing closing quote (byte 5008)"},
        {"{\"id\":4" + std::string(5000, '2') + "}", "decode", "number overflow"},
        {" [" + deep + "]", "decode", "must be a JSON object, got array"},
    };
    for (const auto& c : cases) {
        INFO(c.json);
        const auto t = thrown_by([&] { parse_cloud_event(c.json); });
        INFO(t.message);
        CHECK(t.kind == c.kind);
        CHECK(contains(t.message, c.says));
        CHECK(t.message.size() < 300);
    }
}

TEST_CASE("decode_cloud_event reads binary mode from headers and structured mode from the value",
          "[unit][producer_ids]")
{
    const std::string payload = R"({"order":7})";
    const auto bin = decode_cloud_event(record_with(binary_headers, payload));
    CHECK_FALSE(bin.structured);
    CHECK(bin.id == "A234-1234-1234");
    CHECK(bin.source == "/orders");
    CHECK(bin.type == "com.example.order.confirmed");
    CHECK(bin.specversion == "1.0");
    CHECK(bin.time == std::optional<std::string>("2026-12-02T08:00:00Z"));
    CHECK(bin.datacontenttype == std::optional<std::string>("application/json"));
    CHECK(bin.extensions == std::map<std::string, std::string>{{"tenant", "acme"}});
    CHECK(bin.data == std::optional<std::string>(payload));
    CHECK(bin.event_id() == cloud_event_id("/orders", "A234-1234-1234"));
    CHECK(cloud_event_record_id(record_with(binary_headers, payload)) == bin.event_id());

    // A repeated header: the last one counts, as Java's lastHeader() reads it.
    auto repeated = binary_headers;
    repeated.push_back({"ce_id", std::string("B-1")});
    CHECK(cloud_event_record_id(record_with(repeated, payload)) == cloud_event_id("/orders", "B-1"));

    const std::string envelope =
        R"({"specversion":"1.0","id":"A234-1234-1234","source":"/orders","type":"t","data":{"order":7}})";
    for (const char* ct : {"application/cloudevents+json", "application/cloudevents+json; charset=utf-8",
                           "Application/CloudEvents+JSON;charset=UTF-8"}) {
        INFO(ct);
        const auto r = record_with({{"content-type", std::string(ct)}}, envelope);
        const auto st = decode_cloud_event(r);
        CHECK(st.structured);
        CHECK(st.data == std::optional<std::string>(payload));
        // The same event in either mode has the same dedup key.
        CHECK(st.event_id() == bin.event_id());
        CHECK(cloud_event_record_id(r) == bin.event_id());
    }
}

TEST_CASE("a CloudEvents record without a usable id or source is refused precisely", "[unit][producer_ids]")
{
    auto without = [](const char* name) {
        std::vector<Header> hs;
        for (const auto& h : binary_headers)
            if (h.name != name)
                hs.push_back(h);
        return hs;
    };
    auto with = [](const char* name, std::optional<std::string> value) {
        auto hs = binary_headers;
        hs.push_back({name, std::move(value)});
        return hs;
    };
    struct Case {
        std::vector<Header> headers;
        const char* kind;
        const char* says;
    };
    const std::vector<Case> cases = {
        {without("ce_id"), "missing", "has no 'ce_id' header"},
        {with("ce_id", std::string()), "missing", "has an empty 'ce_id' header"},
        {with("ce_id", std::nullopt), "missing", "has a null 'ce_id' header"},
        {without("ce_source"), "missing", "has no 'ce_source' header"},
        {with("content-type", std::string("application/cloudevents-batch+json")), "decode", "is not supported"},
        {with("content-type", std::string("application/cloudevents+avro")), "decode", "is not supported"},
    };
    for (const auto& c : cases) {
        const auto r = record_with(c.headers, "{}");
        for (const auto& t :
             {thrown_by([&] { decode_cloud_event(r); }), thrown_by([&] { cloud_event_record_id(r); })}) {
            INFO(t.message);
            CHECK(t.kind == c.kind);
            CHECK(contains(t.message, c.says));
        }
    }
    // Not needed for the id, but a CloudEvent has them: the decoder asks for them.
    const auto no_type = thrown_by([&] { decode_cloud_event(record_with(without("ce_type"), "{}")); });
    CHECK(no_type.kind == "decode");
    CHECK(contains(no_type.message, "has no 'ce_type' header"));
    CHECK(thrown_by([&] { decode_cloud_event(record_with(without("ce_specversion"), "{}")); }).kind == "decode");
    CHECK(thrown_by([&] { cloud_event_record_id(record_with(without("ce_type"), "{}")); }).kind == "none");

    const auto structured = record_with({{"content-type", std::string("application/cloudevents+json")}}, "{\"id\":");
    CHECK(thrown_by([&] { decode_cloud_event(structured); }).kind == "decode");
    CHECK(thrown_by([&] { cloud_event_record_id(structured); }).kind == "decode");
    const auto null_value = record_with({{"content-type", std::string("application/cloudevents+json")}}, std::nullopt);
    CHECK(contains(thrown_by([&] { decode_cloud_event(null_value); }).message, "null value"));
}

TEST_CASE("Debezium outbox ids: bare or quoted UUIDs in a header", "[unit][producer_ids]")
{
    const auto id = EventId::parse("4d47e190-0402-4048-bc2c-89dd54343cdc");
    CHECK(parse_debezium_outbox_id("4d47e190-0402-4048-bc2c-89dd54343cdc") == id);
    CHECK(parse_debezium_outbox_id("\"4d47e190-0402-4048-bc2c-89dd54343cdc\"") == id);
    CHECK(parse_debezium_outbox_id("4D47E190-0402-4048-BC2C-89DD54343CDC") == id);
    CHECK(thrown_by([] { parse_debezium_outbox_id(""); }).kind == "missing");
    CHECK(thrown_by([] { parse_debezium_outbox_id("\"\""); }).kind == "missing");
    CHECK(thrown_by([] { parse_debezium_outbox_id("42"); }).kind == "invalid");
    CHECK(thrown_by([] { parse_debezium_outbox_id("\"4d47e190-0402-4048-bc2c-89dd54343cdc"); }).kind == "invalid");
    CHECK(thrown_by([] { parse_debezium_outbox_id("'4d47e190-0402-4048-bc2c-89dd54343cdc'"); }).kind == "invalid");

    const DebeziumOutboxId by_default;
    CHECK(by_default.header() == "id");
    CHECK(by_default(record_with({{"id", std::string("\"4d47e190-0402-4048-bc2c-89dd54343cdc\"")}}, "{}")) == id);
    const DebeziumOutboxId custom("eventId");
    CHECK(
        custom(record_with({{"id", std::string("x")}, {"eventId", std::string("4d47e190-0402-4048-bc2c-89dd54343cdc")}},
                           "{}")) == id);

    const auto none = thrown_by([&] { by_default(record_with({}, "{}")); });
    CHECK(none.kind == "missing");
    CHECK(contains(none.message, "no 'id' header"));
    CHECK(thrown_by([&] { by_default(record_with({{"id", std::nullopt}}, "{}")); }).kind == "missing");
    CHECK(thrown_by([&] { by_default(record_with({{"id", std::string()}}, "{}")); }).kind == "missing");
    const auto bad = thrown_by([&] { custom(record_with({{"eventId", std::string("order-7")}}, "{}")); });
    CHECK(bad.kind == "invalid");
    CHECK(contains(bad.message, "'eventId' header"));
    CHECK(contains(bad.message, "expected 36 characters"));
    CHECK(thrown_by([] { DebeziumOutboxId empty(""); }).kind == "config");
}

TEST_CASE("the consumer's id function may take the event, the record, or both", "[unit][producer_ids]")
{
    struct Order {
        std::string text;
        EventId id;
    };
    auto handle = [](pqxx::work&, const Order&, const Context&) {};
    const auto outbox_id = EventId::parse("4d47e190-0402-4048-bc2c-89dd54343cdc");
    const Record r = record_with({{"id", outbox_id.to_string()}}, "payload");
    auto decode = [&](std::string_view v) { return Order{std::string(v), new_event_id()}; };

    detail::TypedStage<Order> from_event(
        decode, [](const Order& o) { return o.id; }, handle);
    from_event.reserve(1);
    CHECK(from_event.decode(0, r).version() == 7);

    detail::TypedStage<Order> from_record(decode, DebeziumOutboxId{}, handle);
    from_record.reserve(1);
    CHECK(from_record.decode(0, r) == outbox_id);

    detail::TypedStage<Order> from_both(
        decode, [](const Record& rec, const Order& o) { return cloud_event_id(std::string(rec.topic), o.text); },
        handle);
    from_both.reserve(1);
    CHECK(from_both.decode(0, r) == cloud_event_id("t", "payload"));

    auto handle_ce = [](pqxx::work&, const CloudEvent&, const Context&) {};
    detail::TypedStage<CloudEvent> member(decode_cloud_event, &CloudEvent::event_id, handle_ce);
    member.reserve(1);
    CHECK(member.decode(0, record_with(binary_headers, "{}")) == cloud_event_id("/orders", "A234-1234-1234"));
}

// Not a check: the cost of the id functions next to a claim's (a few µs of
// PostgreSQL per event at best). build/tests/idemkafka_unit_tests "[producer_ids_speed]"
TEST_CASE("producer id functions: time per record", "[.][producer_ids_speed]")
{
    const std::string envelope =
        R"({"specversion":"1.0","id":"A234-1234-1234","source":"https://example.com/orders","type":"com.example.order.confirmed",)"
        R"("time":"2026-12-02T08:00:00Z","datacontenttype":"application/json","tenant":"acme",)"
        R"("data":{"order_id":"o-7","customer_id":"c-42","amount_cents":12999,"currency":"EUR","lines":[1,2,3]}})";
    const auto binary = record_with(binary_headers, R"({"order_id":"o-7","amount_cents":12999})");
    const auto structured = record_with({{"content-type", std::string("application/cloudevents+json")}}, envelope);
    const auto outbox = record_with({{"id", std::string("\"4d47e190-0402-4048-bc2c-89dd54343cdc\"")}}, "{}");
    const DebeziumOutboxId outbox_id;
    auto time_of = [](const char* what, auto&& f) {
        constexpr int n = 200000;
        std::uint8_t sink = 0;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i)
            sink ^= f().bytes()[15];
        const auto ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / n;
        std::printf("%-48s %8.0f ns per record (%u)\n", what, ns, static_cast<unsigned>(sink & 1));
    };
    time_of("cloud_event_record_id, binary mode", [&] { return cloud_event_record_id(binary); });
    time_of("cloud_event_record_id, structured (parses)", [&] { return cloud_event_record_id(structured); });
    time_of("decode_cloud_event + event_id, structured", [&] { return decode_cloud_event(structured).event_id(); });
    time_of("decode_cloud_event + event_id, binary", [&] { return decode_cloud_event(binary).event_id(); });
    time_of("DebeziumOutboxId, quoted", [&] { return outbox_id(outbox); });
}
