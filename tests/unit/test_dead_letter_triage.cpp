// Dead letters as data, without services: the error normaliser, causes and
// their ids, grouping with counts, first/last seen and sources, the filter.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/dead_letter_triage.hpp>

#include "catch_compat.hpp"

using namespace idemkafka;

namespace {

DeadLetterRecord letter(std::int64_t offset, const std::string& group, const std::string& reason,
                        const std::string& error, const std::string& source = "payments", int source_partition = 0,
                        std::int64_t ts = 1'700'000'000'000)
{
    DeadLetterRecord d;
    d.topic = "payments.dlq";
    d.partition = static_cast<std::int32_t>(offset % 2);
    d.offset = offset;
    d.timestamp_ms = ts;
    d.value = "v" + std::to_string(offset);
    d.headers = {{"trace", "t"},
                 {dead_letter_header::consumer_group, group},
                 {dead_letter_header::reason, reason},
                 {dead_letter_header::error, error}};
    if (!source.empty()) {
        d.headers.push_back({dead_letter_header::original_topic, source});
        d.headers.push_back({dead_letter_header::original_partition, std::to_string(source_partition)});
    }
    return d;
}

} // namespace

TEST_CASE("dead-letter errors: numbers, ids and quoted values are masked", "[unit][dead_letter_triage]")
{
    struct Case {
        std::string in, out;
    };
    const std::vector<Case> cases = {
        {"payment provider returned 503 after 2.5 s", "payment provider returned <n> after <n> s"},
        {"order 0190b6f2-3c4d-7e8f-9a0b-1c2d3e4f5a6b not found", "order <uuid> not found"},
        {"account 'ACME Corp' is closed", "account '?' is closed"},
        {"field \"amount\" must be positive", "field \"?\" must be positive"},
        {"can't decode: unexpected token at line 3", "can't decode: unexpected token at line <n>"},
        {"tx deadbeef42 and request id AbC123xYz7890Q failed", "tx <id> and request id <id> failed"},
        {"utf8 error in base64 value v7", "utf8 error in base64 value v7"},
        {"customer_4711 over  limit\n\tby -12", "customer_<n> over limit by -<n>"},
        {"", ""},
    };
    for (const auto& c : cases) {
        CAPTURE(c.in);
        CHECK(normalise_dead_letter_error(c.in) == c.out);
    }
    // Long errors are cut; an unclosed quote is text.
    CHECK(normalise_dead_letter_error(std::string(1000, 'x') + " 1").size() <= 200);
    CHECK(normalise_dead_letter_error("it's 'open") == "it's 'open");
}

TEST_CASE("dead-letter causes: the same error shape is one cause with a stable id", "[unit][dead_letter_triage]")
{
    const auto a = DeadLetterCause::of(letter(1, "billing", "handler_failed", "provider returned 503 for 'o-1'"));
    const auto b = DeadLetterCause::of(letter(2, "billing", "handler_failed", "provider returned 502 for 'o-2'"));
    const auto c = DeadLetterCause::of(letter(3, "billing", "non_retryable", "provider returned 503 for 'o-1'"));
    const auto d = DeadLetterCause::of(letter(4, "ledger", "handler_failed", "provider returned 503 for 'o-1'"));
    CHECK(a.error_pattern == "provider returned <n> for '?'");
    CHECK(a.id() == b.id());
    CHECK(a.id() != c.id());
    CHECK(a.id() != d.id());
    CHECK(a.id().size() == 16);
    // Fixed by the hash's definition: the same in every process and release.
    CHECK(DeadLetterCause{"g", "r", "e"}.id() == DeadLetterCause{"g", "r", "e"}.id());
    CHECK(DeadLetterCause{"ab", "c", ""}.id() != DeadLetterCause{"a", "bc", ""}.id());
}

TEST_CASE("dead-letter grouping: counts, first and last seen, sources, sample", "[unit][dead_letter_triage]")
{
    DeadLetterGrouping g;
    for (int i = 0; i < 2990; ++i)
        g.add(letter(i, "billing", "handler_failed", "payment provider 503: order " + std::to_string(1000 + i),
                     "payments", i % 3, 1'700'000'000'000 + i));
    for (int i = 0; i < 10; ++i)
        g.add(letter(5000 + i, "billing", "decode_error", "unexpected byte 0x" + std::to_string(i) + " at 17",
                     "payments", 7, 1'600'000'000'000 + i));
    g.add(letter(9000, "billing", "decode_error", "no source", ""));
    CHECK(g.total() == 3001);
    const auto gs = g.groups();
    REQUIRE(gs.size() == 3);
    CHECK(gs[0].count == 2990);
    CHECK(gs[0].cause.reason == "handler_failed");
    CHECK(gs[0].cause.error_pattern == "payment provider <n>: order <n>");
    CHECK(gs[0].first_seen_ms == 1'700'000'000'000);
    CHECK(gs[0].last_seen_ms == 1'700'000'000'000 + 2989);
    REQUIRE(gs[0].sources.size() == 1);
    CHECK(gs[0].sources.at("payments") == std::set<std::int32_t>{0, 1, 2});
    CHECK(gs[0].sample.offset == 0);
    CHECK(gs[0].id == gs[0].cause.id());
    CHECK(gs[1].count == 10);
    CHECK(gs[1].cause.error_pattern == "unexpected byte <n> at <n>"); // 0x0..0x9
    CHECK(gs[1].sources.at("payments") == std::set<std::int32_t>{7});
    CHECK(gs[2].count == 1);
    CHECK(gs[2].sources.empty());
}

TEST_CASE("dead-letter filter: every field set must match", "[unit][dead_letter_triage]")
{
    const auto r = letter(7, "billing", "handler_failed", "provider 503", "payments", 2, 1000);
    CHECK(DeadLetterFilter{}.matches(r));
    DeadLetterFilter f;
    f.reasons = {"decode_error", "handler_failed"};
    f.consumer_groups = {"billing"};
    f.source_topic = "payments";
    f.from_ms = 1000;
    f.to_ms = 1001;
    f.causes = {DeadLetterCause::of(r).id()};
    f.coordinates = {{1, 7}};
    CHECK(f.matches(r));
    auto g = f;
    g.to_ms = 1000; // [from, to): the end is out
    CHECK_FALSE(g.matches(r));
    g = f;
    g.coordinates = {{0, 7}};
    CHECK_FALSE(g.matches(r));
    g = f;
    g.causes = {"0000000000000000"};
    CHECK_FALSE(g.matches(r));
    g = f;
    g.source_topic = "other";
    CHECK_FALSE(g.matches(r));
    g = f;
    g.consumer_groups = {"ledger"};
    CHECK_FALSE(g.matches(r));
    // A record without a timestamp is outside any time range.
    auto no_ts = r;
    no_ts.timestamp_ms = -1;
    CHECK_FALSE(f.matches(no_ts));

    const auto j = nlohmann::json::parse(f.to_json());
    CHECK(j["reasons"].size() == 2);
    CHECK(j["from_ms"] == 1000);
    CHECK(j["coordinates"][0]["partition"] == 1);
    CHECK(j["coordinates"][0]["offset"] == 7);
    CHECK(nlohmann::json::parse(DeadLetterFilter{}.to_json()).empty());
}
