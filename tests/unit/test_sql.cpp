// The SQL the library writes itself: identifiers quoted as PostgreSQL reads
// them, and the claim statement's uuid[] literal.

#include <string>
#include <vector>

#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "pg/claims.hpp"

using namespace idemkafka;

TEST_CASE("identifiers are quoted, quotes doubled", "[unit]")
{
    CHECK(quote_identifier("processed_event") == "\"processed_event\"");
    CHECK(quote_identifier("a\"; DROP TABLE x; --") == "\"a\"\"; DROP TABLE x; --\"");
    REQUIRE_THROWS_AS(quote_identifier(""), ConfigError);
    REQUIRE_THROWS_AS(quote_identifier(std::string("a\0b", 3)), ConfigError);
    ProcessedEventStore s("my schema", "Processed");
    CHECK(s.qualified_name() == "\"my schema\".\"Processed\"");
    CHECK(detail::pg::claim_sql(s).find("INSERT INTO \"my schema\".\"Processed\"") == 0);
    CHECK(detail::pg::claim_sql(s).find("ON CONFLICT DO NOTHING RETURNING event_id") != std::string::npos);
}

TEST_CASE("claim array literal", "[unit]")
{
    const auto a = EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    const auto b = EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398e");
    CHECK(detail::pg::uuid_array({}) == "{}");
    CHECK(detail::pg::uuid_array({a, b}) ==
          "{017f22e2-79b0-7cc3-98c4-dc0c0c07398f,017f22e2-79b0-7cc3-98c4-dc0c0c07398e}");
}

TEST_CASE("claimed ids: a lookup finds exactly the ids the claim took, in any order", "[unit]")
{
    std::vector<EventId> taken;
    std::vector<EventId> not_taken;
    UuidV7Generator gen;
    for (int i = 0; i < 200; ++i)
        (i % 3 == 0 ? not_taken : taken).push_back(gen.next());
    const detail::pg::ClaimedIds sorted(taken);
    std::vector<EventId> reversed(taken.rbegin(), taken.rend());
    const detail::pg::ClaimedIds unsorted(reversed);
    for (const auto* claimed : {&sorted, &unsorted}) {
        CHECK(claimed->size() == taken.size());
        for (const auto& id : taken)
            CHECK(claimed->contains(id));
        for (const auto& id : not_taken)
            CHECK_FALSE(claimed->contains(id));
    }
    CHECK_FALSE(detail::pg::ClaimedIds().contains(taken.front()));
    CHECK(detail::pg::ClaimedIds().size() == 0);
}
