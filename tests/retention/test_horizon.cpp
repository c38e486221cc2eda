// Pure logic of retention, no services: configuration checks, the dedup-horizon
// guard on both sides of its boundaries, partition bounds and names.

#include <set>
#include <string>

#include <idemkafka/error.hpp>
#include <idemkafka/retention.hpp>

#include "catch_compat.hpp"

using namespace idemkafka;
using namespace std::chrono_literals;
using std::chrono::milliseconds;
using TimePoint = std::chrono::system_clock::time_point;

namespace {

constexpr std::int64_t day_ms = 86400000;
// 2030-01-10T12:00:00Z
constexpr std::int64_t now_ms = 1894276800000;

TimePoint at(std::int64_t ms)
{
    return TimePoint(milliseconds(ms));
}

EventId v7_at(std::int64_t ms)
{
    return EventId::from_v7_parts(static_cast<std::uint64_t>(ms), 0x123, 0x0123456789abcdefULL);
}

EventId v4()
{
    return EventId::parse("3f2b8c1e-9d4a-4b6f-8e21-5a7c9d0e1f23");
}

std::string config_error(const RetentionConfig& c)
{
    try {
        c.validate();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("default retention configuration is valid and as documented", "[retention]")
{
    RetentionConfig c;
    REQUIRE_NOTHROW(c.validate());
    CHECK(c.mode == RetentionMode::partitioned);
    CHECK(c.retention == milliseconds(7 * day_ms));
    CHECK(c.partition_width == milliseconds(day_ms));
    CHECK(c.partitions_ahead == 3);
    CHECK(c.beyond_horizon == HorizonPolicy::dead_letter);
    CHECK(c.non_v7 == NonV7Policy::dead_letter);
    CHECK(c.dedup_horizon() == milliseconds(6 * day_ms));
    CHECK(c.downstream_key_window == 0ms);
}

TEST_CASE("invalid retention settings are refused naming the field", "[retention]")
{
    struct Case {
        const char* field;
        void (*change)(RetentionConfig&);
    };
    const Case cases[] = {
        {"retention:", [](RetentionConfig& c) { c.retention = 30s; }},
        {"partition_width:", [](RetentionConfig& c) { c.partition_width = 30s; }},
        {"partition_width:", [](RetentionConfig& c) { c.partition_width = 90s; }},
        {"partition_width:", [](RetentionConfig& c) { c.partition_width = c.retention + 1min; }},
        {"partition_width:", [](RetentionConfig& c) { c.partition_width = 1min; }}, // 10080 partitions
        {"partitions_ahead:", [](RetentionConfig& c) { c.partitions_ahead = 0; }},
        {"purge_batch:", [](RetentionConfig& c) { c.purge_batch = 0; }},
        {"purge_pause:", [](RetentionConfig& c) { c.purge_pause = -1ms; }},
        {"purge_max_batches:", [](RetentionConfig& c) { c.purge_max_batches = 0; }},
        {"lock_timeout:", [](RetentionConfig& c) { c.lock_timeout = 0ms; }},
        {"horizon_margin:", [](RetentionConfig& c) { c.horizon_margin = -1ms; }},
        {"horizon_margin:", [](RetentionConfig& c) { c.horizon_margin = c.retention; }},
        {"downstream_key_window:", [](RetentionConfig& c) { c.downstream_key_window = -1ms; }},
        {"reconcile:", [](RetentionConfig& c) { c.beyond_horizon = HorizonPolicy::reconcile; }},
        {"maintenance_interval:", [](RetentionConfig& c) { c.maintenance_interval = 0ms; }},
    };
    for (const auto& k : cases) {
        RetentionConfig c;
        k.change(c);
        const std::string message = config_error(c);
        CAPTURE(k.field, message);
        CHECK(message.rfind(k.field, 0) == 0);
    }
    RetentionConfig ok;
    ok.beyond_horizon = HorizonPolicy::reconcile;
    ok.reconcile = [](pqxx::work&, const Context&) { return ReconcileOutcome::skip; };
    CHECK_NOTHROW(ok.validate());
    RetentionConfig bad;
    bad.retention = 1s;
    CHECK_THROWS_AS(HorizonGuard(bad), ConfigError);
}

TEST_CASE("retention names parse and print", "[retention]")
{
    CHECK(parse_retention_mode("partitioned") == RetentionMode::partitioned);
    CHECK(parse_retention_mode("purge") == RetentionMode::purge);
    CHECK(to_string(RetentionMode::purge) == "purge");
    CHECK(parse_horizon_policy("reconcile") == HorizonPolicy::reconcile);
    CHECK(to_string(HorizonPolicy::process) == "process");
    CHECK(parse_non_v7_policy("process") == NonV7Policy::process);
    CHECK(to_string(NonV7Policy::dead_letter) == "dead_letter");
    CHECK_THROWS_AS(parse_retention_mode("Partitioned"), ConfigError);
    CHECK_THROWS_AS(parse_horizon_policy(""), ConfigError);
    CHECK_THROWS_AS(parse_non_v7_policy("skip"), ConfigError);
}

TEST_CASE("horizon guard: both sides of the dedup horizon", "[retention]")
{
    RetentionConfig c; // 7 d retention, 1 d margin: horizon 6 d
    const HorizonGuard g(c);
    REQUIRE(g.horizon() == milliseconds(6 * day_ms));
    const auto now = at(now_ms);
    const std::int64_t boundary = now_ms - 6 * day_ms;

    SECTION("just inside")
    {
        const auto d = g.check(v7_at(boundary + 1), now);
        CHECK(d.has_timestamp);
        CHECK(d.age == milliseconds(6 * day_ms - 1));
        CHECK_FALSE(d.beyond_horizon);
        CHECK(d.action == HorizonAction::process);
        CHECK(!d.reason);
    }
    SECTION("exactly at the horizon is beyond it: the claim is no longer guaranteed")
    {
        const auto d = g.check(v7_at(boundary), now);
        CHECK(d.beyond_horizon);
        CHECK(d.action == HorizonAction::dead_letter);
        CHECK(d.reason == DeadLetterReason::beyond_dedup_horizon);
    }
    SECTION("well beyond")
    {
        const auto d = g.check(v7_at(now_ms - 30 * day_ms), now);
        CHECK(d.beyond_horizon);
        CHECK(d.action == HorizonAction::dead_letter);
    }
    SECTION("an id from the future is within the horizon")
    {
        const auto d = g.check(v7_at(now_ms + 3600000), now);
        CHECK(d.age == milliseconds(-3600000));
        CHECK_FALSE(d.beyond_horizon);
        CHECK(d.action == HorizonAction::process);
    }
    SECTION("fresh event")
    {
        const auto d = g.check(v7_at(now_ms), now);
        CHECK(d.age == 0ms);
        CHECK(d.action == HorizonAction::process);
    }
}

TEST_CASE("horizon guard: the policy for events beyond the horizon", "[retention]")
{
    const auto now = at(now_ms);
    const auto old = v7_at(now_ms - 10 * day_ms);
    RetentionConfig c;
    c.beyond_horizon = HorizonPolicy::reconcile;
    c.reconcile = [](pqxx::work&, const Context&) { return ReconcileOutcome::process; };
    auto d = HorizonGuard(c).check(old, now);
    CHECK(d.beyond_horizon);
    CHECK(d.action == HorizonAction::reconcile);
    CHECK(!d.reason);

    c.beyond_horizon = HorizonPolicy::process;
    d = HorizonGuard(c).check(old, now);
    CHECK(d.beyond_horizon);
    CHECK(d.action == HorizonAction::process);

    // A bigger margin moves the horizon closer.
    RetentionConfig m;
    m.horizon_margin = std::chrono::hours(24 * 5);
    const HorizonGuard g(m);
    CHECK(g.check(v7_at(now_ms - 2 * day_ms + 1), now).action == HorizonAction::process);
    CHECK(g.check(v7_at(now_ms - 2 * day_ms), now).action == HorizonAction::dead_letter);
}

TEST_CASE("horizon guard: downstream idempotency-key window on both sides", "[retention]")
{
    const auto now = at(now_ms);
    RetentionConfig c;
    SECTION("not configured: always open")
    {
        const HorizonGuard g(c);
        CHECK(g.check(v7_at(now_ms - 5 * day_ms), now).key_window_open);
        CHECK(g.check(v4(), now).key_window_open);
    }
    SECTION("24 hours")
    {
        c.downstream_key_window = std::chrono::hours(24);
        const HorizonGuard g(c);
        CHECK(g.check(v7_at(now_ms - day_ms + 1), now).key_window_open);
        CHECK_FALSE(g.check(v7_at(now_ms - day_ms), now).key_window_open);
        CHECK_FALSE(g.check(v7_at(now_ms - 2 * day_ms), now).key_window_open);
        CHECK(g.check(v7_at(now_ms + 1000), now).key_window_open);
        // Past the key window but inside the dedup horizon: processed, and the
        // handler is told the downstream no longer recognises the key.
        const auto d = g.check(v7_at(now_ms - 3 * day_ms), now);
        CHECK(d.action == HorizonAction::process);
        CHECK_FALSE(d.key_window_open);
    }
}

TEST_CASE("horizon guard: ids that are not UUIDv7", "[retention]")
{
    const auto now = at(now_ms);
    RetentionConfig c;
    SECTION("partitioned mode dead-letters them by default")
    {
        const auto d = HorizonGuard(c).check(v4(), now);
        CHECK_FALSE(d.has_timestamp);
        CHECK(d.action == HorizonAction::dead_letter);
        CHECK(d.reason == DeadLetterReason::non_v7_event_id);
        CHECK_FALSE(d.beyond_horizon);
    }
    SECTION("partitioned mode with the process policy")
    {
        c.non_v7 = NonV7Policy::process;
        c.downstream_key_window = std::chrono::hours(24);
        const auto d = HorizonGuard(c).check(v4(), now);
        CHECK(d.action == HorizonAction::process);
        CHECK_FALSE(d.key_window_open); // age unknown: not known to be open
    }
    SECTION("purge mode processes them: their claim lasts retention after processing")
    {
        c.mode = RetentionMode::purge;
        const auto d = HorizonGuard(c).check(v4(), now);
        CHECK(d.action == HorizonAction::process);
        CHECK(d.key_window_open);
    }
    SECTION("the nil id is not a UUIDv7")
    {
        CHECK(HorizonGuard(c).check(EventId(), now).action == HorizonAction::dead_letter);
    }
}

TEST_CASE("partition bounds order UUIDv7 ids by creation time", "[retention]")
{
    const auto lo = partition_bound(now_ms);
    const auto hi = partition_bound(now_ms + 1);
    CHECK(lo.to_string().substr(14) == "0000-0000-000000000000");
    CHECK(lo.to_string().substr(0, 13) == v7_at(now_ms).to_string().substr(0, 13));
    // Every id of that millisecond, whatever its random bits, sorts inside [lo, hi).
    for (std::uint64_t r : {0ULL, 1ULL, 0x3fffffffffffffffULL}) {
        const auto id = EventId::from_v7_parts(static_cast<std::uint64_t>(now_ms), 0xfff, r);
        CHECK_FALSE(id < lo);
        CHECK(id < hi);
    }
    CHECK(v7_at(now_ms - 1) < lo);
    CHECK(partition_bound(-5) == EventId());
    CHECK(partition_bound(std::int64_t{1} << 50).to_string().substr(0, 13) == "ffffffff-ffff");
}

TEST_CASE("partition names are deterministic, within 63 bytes and distinct", "[retention]")
{
    CHECK(partition_name("processed_event", 1894233600000) == "processed_event_p20300110_0000");
    CHECK(partition_name("processed_event", 1894276800000) == "processed_event_p20300110_1200");
    CHECK(default_partition_name("processed_event") == "processed_event_default");
    CHECK(partition_name("we\"ird; DROP", 0) == "we\"ird; DROP_p19700101_0000");

    const std::string long_a(63, 'a');
    std::string long_b = long_a;
    long_b[62] = 'b';
    const auto na = partition_name(long_a, now_ms), nb = partition_name(long_b, now_ms);
    CHECK(na.size() <= 63);
    CHECK(nb.size() <= 63);
    CHECK(na != nb);
    CHECK(na == partition_name(long_a, now_ms));
    CHECK(default_partition_name(long_a).size() <= 63);
    CHECK(default_partition_name(long_a) != default_partition_name(long_b));
    CHECK_NOTHROW(quote_identifier(na));

    // A shortened multi-byte name is cut at a character boundary.
    std::string utf8;
    for (int i = 0; i < 31; ++i)
        utf8 += "\xc3\xa9"; // é, 62 bytes
    const auto nu = partition_name(utf8, now_ms);
    CHECK(nu.size() <= 63);
    const auto prefix_end = nu.find('_');
    REQUIRE(prefix_end != std::string::npos);
    CHECK(prefix_end % 2 == 0);

    std::set<std::string> names;
    for (int d = 0; d < 30; ++d)
        names.insert(partition_name("t", now_ms + d * day_ms));
    CHECK(names.size() == 30);
}
