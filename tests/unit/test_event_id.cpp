#include "catch_compat.hpp"

#include "idemkafka/error.hpp"
#include "idemkafka/event_id.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

using idemkafka::EventId;
using idemkafka::InvalidEventId;
using idemkafka::UuidV7Generator;

namespace {

std::uint64_t now_ms()
{
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

std::uint16_t rand_a_of(const EventId& id)
{
    return static_cast<std::uint16_t>(((id.bytes()[6] & 0x0F) << 8) | id.bytes()[7]);
}

// Returns the message of the InvalidEventId thrown by parse(), or "" if none.
std::string parse_error(const std::string& text)
{
    try {
        static_cast<void>(EventId::parse(text));
    } catch (const InvalidEventId& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& haystack, const std::string& needle)
{
    return haystack.find(needle) != std::string::npos;
}

const char* const rfc_v7_example = "017F22E2-79B0-7CC3-98C4-DC0C0C07398F";
const char* const rfc_v4_example = "919108f7-52d1-4320-9bac-f847db4148a8";

} // namespace

TEST_CASE("1,000,000 generated ids are strictly increasing, unique, v7 and RFC variant", "[event_id]")
{
    constexpr std::size_t count = 1000000;
    UuidV7Generator generator;
    std::vector<EventId> ids;
    ids.reserve(count);
    for (std::size_t i = 0; i < count; ++i)
        ids.push_back(generator.next());

    // Assertions per element would dominate the run time; count and report instead.
    std::size_t not_increasing = 0, bad_version = 0, bad_variant = 0;
    std::size_t first_bad = count;
    for (std::size_t i = 0; i < count; ++i) {
        if (ids[i].version() != 7)
            ++bad_version;
        if (!ids[i].is_rfc_variant())
            ++bad_variant;
        if (i > 0 && !(ids[i - 1].bytes() < ids[i].bytes())) {
            if (not_increasing++ == 0)
                first_bad = i;
        }
    }
    INFO("first out-of-order index " << first_bad);
    CHECK(not_increasing == 0);
    CHECK(bad_version == 0);
    CHECK(bad_variant == 0);

    // Checked independently of generation order (a hash set of 1M nodes is
    // several times slower than sorting on small CI machines).
    std::vector<EventId> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
}

TEST_CASE("generator uses rand_a as a counter seeded with its top bit clear", "[event_id]")
{
    constexpr std::size_t count = 200000;
    UuidV7Generator generator;
    std::vector<EventId> ids;
    ids.reserve(count);
    for (std::size_t i = 0; i < count; ++i)
        ids.push_back(generator.next());

    std::size_t bad_step = 0, bad_seed = 0, ms_changes = 0;
    for (std::size_t i = 1; i < count; ++i) {
        const std::uint64_t prev_ms = ids[i - 1].unix_ms();
        const std::uint64_t ms = ids[i].unix_ms();
        if (ms == prev_ms) {
            if (rand_a_of(ids[i]) != rand_a_of(ids[i - 1]) + 1)
                ++bad_step;
        } else {
            ++ms_changes;
            if (ms < prev_ms || rand_a_of(ids[i]) > 0x7FF)
                ++bad_seed;
        }
    }
    CHECK(bad_step == 0);
    CHECK(bad_seed == 0);
    // 200,000 ids cannot fit into one millisecond's 4096 counter values.
    CHECK(ms_changes >= count / 4096);
}

TEST_CASE("ids from 4 threads sharing new_event_id() are all unique", "[event_id]")
{
    constexpr std::size_t threads = 4;
    constexpr std::size_t per_thread = 100000;
    std::vector<std::vector<EventId>> results(threads);
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t) {
        workers.emplace_back([&results, t] {
            auto& out = results[t];
            out.reserve(per_thread);
            for (std::size_t i = 0; i < per_thread; ++i)
                out.push_back(idemkafka::new_event_id());
        });
    }
    for (auto& w : workers)
        w.join();

    std::unordered_set<EventId> unique;
    unique.reserve(threads * per_thread);
    std::size_t not_increasing = 0, not_v7 = 0;
    for (const auto& ids : results) {
        REQUIRE(ids.size() == per_thread);
        for (std::size_t i = 0; i < ids.size(); ++i) {
            unique.insert(ids[i]);
            if (ids[i].version() != 7 || !ids[i].is_rfc_variant())
                ++not_v7;
            // One shared generator: each thread's own view must still be ordered.
            if (i > 0 && !(ids[i - 1] < ids[i]))
                ++not_increasing;
        }
    }
    CHECK(unique.size() == threads * per_thread);
    CHECK(not_increasing == 0);
    CHECK(not_v7 == 0);
}

TEST_CASE("generated timestamps are close to now", "[event_id]")
{
    const std::uint64_t before = now_ms();
    const EventId from_global = idemkafka::new_event_id();
    UuidV7Generator generator;
    const EventId from_local = generator.next();
    const std::uint64_t after = now_ms();

    for (const EventId& id : {from_global, from_local}) {
        CAPTURE(id, before, after);
        // The shared generator may run ahead of the clock after bursts (counter
        // overflow borrows milliseconds), but never by more than a few seconds here.
        CHECK(id.unix_ms() >= before);
        CHECK(id.unix_ms() <= after + 5000);
        const auto ts = id.timestamp();
        CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(ts.time_since_epoch()).count() ==
              static_cast<std::int64_t>(id.unix_ms()));
    }
    // A fresh generator has not borrowed anything yet.
    CHECK(from_local.unix_ms() <= after);
}

TEST_CASE("parse and format round trip", "[event_id]")
{
    SECTION("generated ids")
    {
        UuidV7Generator generator;
        for (int i = 0; i < 1000; ++i) {
            const EventId id = generator.next();
            const std::string text = id.to_string();
            CAPTURE(text);
            REQUIRE(text.size() == 36);
            REQUIRE(EventId::parse(text) == id);
            EventId parsed;
            REQUIRE(EventId::try_parse(text, parsed));
            REQUIRE(parsed == id);
        }
    }

    SECTION("RFC 9562 UUIDv7 example")
    {
        const EventId id = EventId::parse(rfc_v7_example);
        CHECK(id.version() == 7);
        CHECK(id.is_rfc_variant());
        CHECK(id.unix_ms() == 0x017F22E279B0ULL);
        CHECK(id.to_string() == "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
        const EventId::Bytes expected{0x01, 0x7F, 0x22, 0xE2, 0x79, 0xB0, 0x7C, 0xC3,
                                      0x98, 0xC4, 0xDC, 0x0C, 0x0C, 0x07, 0x39, 0x8F};
        CHECK(id.bytes() == expected);
        CHECK(EventId::from_v7_parts(0x017F22E279B0ULL, 0xCC3, 0x18C4DC0C0C07398FULL) == id);
    }

    SECTION("RFC 9562 UUIDv4 example")
    {
        const EventId id = EventId::parse(rfc_v4_example);
        CHECK(id.version() == 4);
        CHECK(id.is_rfc_variant());
        CHECK(id.to_string() == rfc_v4_example);
    }

    SECTION("upper and mixed case accepted, formatted lower")
    {
        const EventId upper = EventId::parse("A1B2C3D4-E5F6-7A8B-9C0D-E1F2A3B4C5D6");
        const EventId mixed = EventId::parse("a1B2c3D4-e5F6-7a8B-9c0D-e1F2a3B4c5D6");
        CHECK(upper == mixed);
        CHECK(upper.to_string() == "a1b2c3d4-e5f6-7a8b-9c0d-e1f2a3b4c5d6");
    }

    SECTION("format_to writes exactly 36 characters")
    {
        char buffer[40];
        std::fill(std::begin(buffer), std::end(buffer), '#');
        EventId::parse(rfc_v7_example).format_to(buffer);
        CHECK(std::string(buffer, 36) == "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
        CHECK(buffer[36] == '#');
    }

    SECTION("operator<< writes the canonical form")
    {
        std::ostringstream os;
        os << EventId::parse(rfc_v7_example);
        CHECK(os.str() == "017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    }
}

TEST_CASE("malformed ids are rejected", "[event_id]")
{
    const std::string valid = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f";
    std::string embedded_nul = valid;
    embedded_nul[10] = '\0';

    const std::vector<std::string> bad = {
        "",
        valid.substr(0, 35),
        valid + "0",
        "{" + valid + "}",
        "{" + valid.substr(0, 34) + "}",
        "urn:uuid:" + valid,
        "017f22e279b07cc398c4dc0c0c07398f",
        "017f22e2079b0-7cc3-98c4-dc0c0c07398f",
        "017f22e-279b0-7cc3-98c4-dc0c0c07398f",
        "017f22e2-79b0-7cc3-98c4dc0c-0c07398f",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398g",
        "g17f22e2-79b0-7cc3-98c4-dc0c0c07398f",
        embedded_nul,
        " " + valid.substr(1),
        valid.substr(0, 35) + " ",
        " " + valid,
        valid + "\n",
        "017f22e2-79b0-7cc3-98c4-dc0c0c0739 f",
        "017f22e2\t79b0-7cc3-98c4-dc0c0c07398f",
        "+17f22e2-79b0-7cc3-98c4-dc0c0c07398f",
        "017f22e2-79b0-7cc3-98c4-dc0c0c07398\xC3",
    };

    for (const std::string& text : bad) {
        CAPTURE(text);
        REQUIRE_THROWS_AS(EventId::parse(text), InvalidEventId);
        EventId out = EventId::parse(valid);
        const EventId before = out;
        bool ok = true;
        REQUIRE_NOTHROW(ok = EventId::try_parse(text, out));
        CHECK_FALSE(ok);
        // A failed try_parse leaves the output alone.
        CHECK(out == before);
    }
}

TEST_CASE("parse accepts exactly the canonical form: every char at every position", "[event_id]")
{
    // A reference by the text's definition, a char at a time, against parse()
    // and try_parse(): which texts pass, what bytes they give, and which
    // position an error names.
    const std::string valid = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f";
    const auto digit = [](unsigned char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    };
    const auto value = [](char c) { return c <= '9' ? c - '0' : (c >= 'a' ? c - 'a' + 10 : c - 'A' + 10); };
    for (std::size_t pos = 0; pos < valid.size(); ++pos) {
        const bool dash = pos == 8 || pos == 13 || pos == 18 || pos == 23;
        for (int c = 0; c < 256; ++c) {
            std::string text = valid;
            text[pos] = static_cast<char>(c);
            const bool expect_ok = dash ? c == '-' : digit(static_cast<unsigned char>(c));
            CAPTURE(pos, c);
            EventId out;
            REQUIRE(EventId::try_parse(text, out) == expect_ok);
            if (!expect_ok) {
                const std::string message = parse_error(text);
                CHECK(contains(message, "position " + std::to_string(pos) + ","));
                continue;
            }
            EventId::Bytes bytes{};
            std::size_t byte = 0;
            for (std::size_t i = 0; i < text.size(); i += (i == 8 || i == 13 || i == 18 || i == 23) ? 1 : 2)
                if (text[i] != '-')
                    bytes[byte++] = static_cast<std::uint8_t>(value(text[i]) << 4 | value(text[i + 1]));
            CHECK(out == EventId(bytes));
        }
    }
}

TEST_CASE("ids order as their bytes do", "[event_id]")
{
    std::mt19937_64 rng(20261203);
    const auto random_id = [&] {
        EventId::Bytes b{};
        for (auto& x : b)
            x = static_cast<std::uint8_t>(rng() % 4); // few values: many equal bytes and halves
        return EventId(b);
    };
    for (int i = 0; i < 100000; ++i) {
        const EventId a = random_id();
        const EventId b = random_id();
        CAPTURE(a.to_string(), b.to_string());
        REQUIRE((a < b) == (a.bytes() < b.bytes()));
        REQUIRE((b < a) == (b.bytes() < a.bytes()));
        REQUIRE((a == b) == (a.bytes() == b.bytes()));
    }
}

TEST_CASE("parse error messages name the problem and quote the input", "[event_id]")
{
    CHECK(parse_error("abc") == "invalid event id \"abc\": expected 36 characters, got 3");
    CHECK(parse_error("") == "invalid event id \"\": expected 36 characters, got 0");

    const std::string missing_dash = "017f22e2079b0-7cc3-98c4-dc0c0c07398f";
    CHECK(parse_error(missing_dash) ==
          "invalid event id \"" + missing_dash + "\": expected '-' at position 8, got '0'");

    const std::string non_hex = "017f22e2-79b0-7cc3-98c4-dc0c0c07398g";
    CHECK(parse_error(non_hex) == "invalid event id \"" + non_hex + "\": expected a hex digit at position 35, got 'g'");

    SECTION("non-printable characters are escaped")
    {
        std::string text = "017f22e2-79b0-7cc3-98c4-dc0c0c07398f";
        text[3] = '\0';
        text[20] = '\n';
        const std::string message = parse_error(text);
        CAPTURE(message);
        CHECK(contains(message, "017\\x0022e2-79b0-7cc3-9\\n"));
        CHECK(contains(message, "position 3, got '\\x00'"));
        CHECK(message.find('\0') == std::string::npos);
        CHECK(message.find('\n') == std::string::npos);
    }

    SECTION("quotes in the input are escaped")
    {
        const std::string message = parse_error("\"x\"");
        CHECK(message == "invalid event id \"\\\"x\\\"\": expected 36 characters, got 3");
    }

    SECTION("long input is truncated")
    {
        const std::string text(10000, 'a');
        const std::string message = parse_error(text);
        CAPTURE(message);
        CHECK(message.size() < 200);
        CHECK(contains(message, "...: expected 36 characters, got 10000"));
    }
}

TEST_CASE("unix_ms and timestamp require version 7", "[event_id]")
{
    const EventId v4 = EventId::parse(rfc_v4_example);
    REQUIRE_THROWS_AS(v4.unix_ms(), InvalidEventId);
    REQUIRE_THROWS_AS(v4.timestamp(), InvalidEventId);
    REQUIRE_THROWS_AS(EventId().unix_ms(), InvalidEventId);
    REQUIRE_NOTHROW(EventId::parse(rfc_v7_example).unix_ms());
}

TEST_CASE("from_v7_parts sets version and variant bits", "[event_id]")
{
    const EventId all_ones = EventId::from_v7_parts(~std::uint64_t{0}, 0xFFFF, ~std::uint64_t{0});
    CHECK(all_ones.version() == 7);
    CHECK(all_ones.is_rfc_variant());
    CHECK(all_ones.unix_ms() == 0xFFFFFFFFFFFFULL);
    CHECK(all_ones.to_string() == "ffffffff-ffff-7fff-bfff-ffffffffffff");

    const EventId zeros = EventId::from_v7_parts(0, 0, 0);
    CHECK(zeros.version() == 7);
    CHECK(zeros.is_rfc_variant());
    CHECK(zeros.unix_ms() == 0);
    CHECK(zeros.to_string() == "00000000-0000-7000-8000-000000000000");
    CHECK_FALSE(zeros.is_nil());

    // Byte order follows timestamp, then counter, then random bits.
    CHECK(EventId::from_v7_parts(1, 0, 0) < EventId::from_v7_parts(2, 0, 0));
    CHECK(EventId::from_v7_parts(1, 5, ~std::uint64_t{0}) < EventId::from_v7_parts(1, 6, 0));
    CHECK(EventId::from_v7_parts(1, 0xFFF, ~std::uint64_t{0}) < EventId::from_v7_parts(2, 0, 0));
}

TEST_CASE("EventId is hashable and usable in unordered_set", "[event_id]")
{
    std::unordered_set<EventId> set;
    const EventId a = EventId::parse(rfc_v7_example);
    const EventId b = EventId::parse(rfc_v4_example);
    CHECK(set.insert(a).second);
    CHECK(set.insert(b).second);
    CHECK_FALSE(set.insert(EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f")).second);
    CHECK(set.size() == 2);
    CHECK(set.count(a) == 1);
    CHECK(set.count(EventId()) == 0);
    CHECK(std::hash<EventId>{}(a) == std::hash<EventId>{}(EventId::parse(rfc_v7_example)));
}

TEST_CASE("nil id", "[event_id]")
{
    const EventId nil;
    CHECK(nil.is_nil());
    CHECK(nil.version() == 0);
    CHECK_FALSE(nil.is_rfc_variant());
    CHECK(nil.to_string() == "00000000-0000-0000-0000-000000000000");
    CHECK(EventId::parse("00000000-0000-0000-0000-000000000000") == nil);
    CHECK_FALSE(EventId::parse(rfc_v7_example).is_nil());
    CHECK_FALSE(idemkafka::new_event_id().is_nil());
}
