// The parts of the Kafka group member that are pure logic, driven without a
// broker.

#include <chrono>
#include <cstddef>
#include <map>
#include <string>

#include "catch_compat.hpp"
#include "kafka/commit_hold.hpp"
#include "kafka/group_settings.hpp"
#include "kafka/latest_stats.hpp"
#include "kafka/prefetch_caps.hpp"
#include "kafka/wake_pacer.hpp"

using namespace idemkafka::detail::kafka;
using namespace std::chrono_literals;

namespace {

const WakePacer::Clock::time_point t0 = WakePacer::Clock::now();

using Props = std::map<std::string, std::string>;

} // namespace

TEST_CASE("WakePacer wakes once a batch took a half-full queue below both halves", "[unit][kafka]")
{
    WakePacer pacer(100, 10000);
    // 100 records of 50 bytes taken: the queue's bytes are estimated at 50 a record.
    CHECK_FALSE(pacer.check(true, 150, 0, 0, t0));       // half full before the batch: armed
    CHECK_FALSE(pacer.check(false, 120, 100, 5000, t0)); // still half full after it
    CHECK_FALSE(pacer.check(true, 120, 0, 0, t0));
    CHECK(pacer.check(false, 99, 100, 5000, t0)); // below 100 records and 99 x 50 < 10000 bytes
    // Woken: disarmed until a batch begins at half full again.
    CHECK_FALSE(pacer.check(true, 10, 0, 0, t0 + 1s));
    CHECK_FALSE(pacer.check(false, 0, 10, 500, t0 + 1s));
}

TEST_CASE("WakePacer counts the queue's bytes from the records taken", "[unit][kafka]")
{
    WakePacer pacer(1000, 10000);
    CHECK_FALSE(pacer.check(false, 0, 10, 1000, t0)); // 100 bytes a record from now on
    CHECK_FALSE(pacer.check(true, 100, 0, 0, t0));    // 100 x 100 bytes: half of the bytes cap
    CHECK_FALSE(pacer.check(false, 100, 0, 0, t0));   // nothing taken: still half full
    CHECK(pacer.check(false, 99, 0, 0, t0));
}

TEST_CASE("WakePacer wakes at most every 20 ms and never without a half-full queue first", "[unit][kafka]")
{
    WakePacer pacer(10, 1000000);
    CHECK_FALSE(pacer.check(false, 0, 5, 50, t0)); // never armed
    CHECK_FALSE(pacer.check(true, 10, 0, 0, t0));
    CHECK(pacer.check(false, 0, 10, 100, t0));
    CHECK_FALSE(pacer.check(true, 10, 0, 0, t0 + 5ms));
    CHECK_FALSE(pacer.check(false, 0, 10, 100, t0 + 19ms)); // armed, but too soon
    CHECK(pacer.check(false, 0, 10, 100, t0 + 20ms));       // stays armed until then
}

TEST_CASE("WakePacer wakes after a queue that filled and was emptied between two checks", "[unit][kafka]")
{
    // A fetch response of 150 records arrives and is taken whole while a
    // batch fills: no check sees the queue at half a cap, the run of records
    // taken without the queue running empty does.
    WakePacer pacer(100, 1000000);
    CHECK_FALSE(pacer.check(true, 0, 0, 0, t0)); // the response had not arrived yet
    for (int i = 0; i < 150; ++i)
        pacer.pulled(60);
    pacer.emptied();
    CHECK(pacer.check(false, 0, 150, 9000, t0));
    // Runs that stay short arm nothing: records trickling in, the queue
    // empty between them.
    for (int i = 0; i < 10; ++i) {
        for (int k = 0; k < 99; ++k)
            pacer.pulled(60);
        pacer.emptied();
    }
    CHECK_FALSE(pacer.check(false, 0, 990, 59400, t0 + 1s));
    // A run counts its records' bytes against the bytes cap too.
    WakePacer by_bytes(1000000, 10000);
    for (int i = 0; i < 10; ++i)
        by_bytes.pulled(999);
    CHECK_FALSE(by_bytes.check(false, 0, 10, 9990, t0));
    by_bytes.pulled(999);
    CHECK(by_bytes.check(false, 0, 11, 10989, t0));
    CHECK_FALSE(by_bytes.check(false, 0, 0, 0, t0 + 1s)); // disarmed by the wake
    by_bytes.pulled(999);                                 // a run starts again after a wake
    CHECK_FALSE(by_bytes.check(false, 0, 1, 999, t0 + 2s));
}

TEST_CASE("PrefetchCaps splits each cap between the member and librdkafka's queue", "[unit][kafka]")
{
    PrefetchCaps caps(1000, 1 << 20);
    CHECK(caps.queue_records() == 500);
    CHECK(caps.queue_bytes() == (1 << 19));
    CHECK(caps.max_records() == 1000);
    CHECK(caps.max_bytes() == (1 << 20));
    // The held share is at least one record and one byte; librdkafka's at least one record.
    PrefetchCaps tiny(1, 1);
    CHECK(tiny.queue_records() == 1);
    CHECK(tiny.queue_bytes() == 0);
    CHECK(tiny.room());
    tiny.add(0);
    CHECK_FALSE(tiny.room());
}

TEST_CASE("PrefetchCaps counts what is held against its share", "[unit][kafka]")
{
    PrefetchCaps caps(6, 1000); // holds up to 3 records, 500 bytes
    caps.add(100);
    caps.add(100);
    CHECK(caps.records() == 2);
    CHECK(caps.bytes() == 200);
    CHECK(caps.room());
    caps.add(10);
    CHECK_FALSE(caps.room()); // 3 records
    caps.remove(100);
    CHECK(caps.room());
    caps.add(400);
    CHECK(caps.records() == 3);
    CHECK(caps.bytes() == 510);
    CHECK_FALSE(caps.room());
    caps.remove(400);
    caps.remove(100);
    caps.add(600); // one record over the bytes' share
    CHECK(caps.records() == 2);
    CHECK_FALSE(caps.room());
    caps.clear();
    CHECK(caps.records() == 0);
    CHECK(caps.bytes() == 0);
    CHECK(caps.room());
}

TEST_CASE("PrefetchCaps logs a fetch paused for the caps at most every 10 s", "[unit][kafka]")
{
    PrefetchCaps caps(10, 1000);
    const auto first = caps.pause_to_log(t0);
    REQUIRE(first.has_value());
    CHECK(*first == 0);
    CHECK_FALSE(caps.pause_to_log(t0 + 1s).has_value());
    CHECK_FALSE(caps.pause_to_log(t0 + 9999ms).has_value());
    const auto next = caps.pause_to_log(t0 + 10s);
    REQUIRE(next.has_value());
    CHECK(*next == 2); // the two not logged in between
    const auto after = caps.pause_to_log(t0 + 20s);
    REQUIRE(after.has_value());
    CHECK(*after == 0);
}

TEST_CASE("LatestStats keeps the latest statistics event's figures once enabled", "[unit][kafka]")
{
    const std::string first = R"({"topics": {"t": {"partitions": {
        "0": {"partition": 0, "hi_offset": 10, "ls_offset": 10, "committed_offset": 4, "consumer_lag": 6},
        "1": {"partition": 1, "hi_offset": 7, "ls_offset": 7, "committed_offset": 7, "consumer_lag": 0},
        "-1": {"partition": -1, "hi_offset": -1}}}}})";
    const std::string second = R"({"topics": {"t": {"partitions": {
        "1": {"partition": 1, "hi_offset": 9, "ls_offset": 9, "committed_offset": 7, "consumer_lag": 2}}}}})";
    LatestStats stats;
    stats.update(first, t0);
    CHECK(stats.snapshot().empty()); // not configured: nothing kept
    CHECK_FALSE(stats.enabled());

    stats.enable();
    CHECK(stats.enabled());
    stats.update(first, t0);
    auto latest = stats.snapshot();
    REQUIRE(latest.size() == 2);
    const idemkafka::detail::TopicPartition t0p{"t", 0};
    const idemkafka::detail::TopicPartition t1p{"t", 1};
    CHECK(latest.at(t0p).stats.consumer_lag == 6);
    CHECK(latest.at(t0p).at == t0);
    CHECK(latest.at(t1p).stats.hi_offset == 7);

    // The next event replaces the whole map: a partition it leaves out goes.
    stats.update(second, t0 + 1s);
    latest = stats.snapshot();
    REQUIRE(latest.size() == 1);
    CHECK(latest.at(t1p).stats.consumer_lag == 2);
    CHECK(latest.at(t1p).at == t0 + 1s);

    stats.update("not json {", t0 + 2s);
    CHECK(stats.snapshot().empty());
}

TEST_CASE("GroupSettings reads the member's settings, librdkafka's defaults when absent", "[unit][kafka]")
{
    const GroupSettings defaults(std::map<std::string, std::string>{{"auto.offset.reset", "earliest"}});
    CHECK_FALSE(defaults.reset_to_latest());
    CHECK(defaults.max_poll_interval() == 300000ms);
    CHECK(defaults.session_timeout() == 45000ms);
    CHECK_FALSE(defaults.consumer_protocol());
    CHECK_FALSE(defaults.cooperative());

    for (const char* latest : {"latest", "largest", "end"})
        CHECK(GroupSettings(Props{{"auto.offset.reset", latest}}).reset_to_latest());
    CHECK_FALSE(GroupSettings(Props{{"auto.offset.reset", "smallest"}}).reset_to_latest());

    const GroupSettings set(
        Props{{"max.poll.interval.ms", "60000"}, {"session.timeout.ms", "6000"}, {"group.protocol", "Consumer"}});
    CHECK(set.max_poll_interval() == 60000ms);
    CHECK(set.session_timeout() == 6000ms);
    CHECK(set.consumer_protocol());
    CHECK(set.cooperative());
    CHECK_FALSE(GroupSettings(Props{{"group.protocol", "classic"}}).consumer_protocol());
}

TEST_CASE("GroupSettings follows the rebalance protocol; the consumer protocol is always incremental", "[unit][kafka]")
{
    GroupSettings classic(Props{{"group.protocol", "classic"}});
    classic.observe_protocol("COOPERATIVE");
    CHECK(classic.cooperative());
    classic.observe_protocol(nullptr); // unknown (the close's revoke): the last known one holds
    CHECK(classic.cooperative());
    classic.observe_protocol("EAGER");
    CHECK_FALSE(classic.cooperative());
    classic.observe_protocol(nullptr);
    CHECK_FALSE(classic.cooperative());

    GroupSettings consumer(Props{{"group.protocol", "consumer"}});
    consumer.observe_protocol("NONE");
    CHECK(consumer.cooperative());
    consumer.observe_protocol(nullptr);
    CHECK(consumer.cooperative());
}

TEST_CASE("CommitHold holds commits from a refusal or a revoke until the rebalance's assignment", "[unit][kafka]")
{
    CommitHold hold;
    hold.configure(10s, false);
    CHECK_FALSE(hold.held(t0));
    CHECK(hold.hold(t0));            // began now
    CHECK_FALSE(hold.hold(t0 + 1s)); // already on (extended)
    CHECK(hold.held(t0 + 10s));
    CHECK_FALSE(hold.held(t0 + 11s)); // at most session.timeout.ms
    CHECK(hold.assigned(t0 + 2s));    // the assignment ends it
    CHECK_FALSE(hold.held(t0 + 2s));
    CHECK_FALSE(hold.assigned(t0 + 3s)); // none to end

    // An eager revoke: the next assignment ends the hold.
    hold.revoked(false, false, t0);
    CHECK(hold.held(t0 + 1s));
    CHECK(hold.assigned(t0 + 1s));
    CHECK_FALSE(hold.held(t0 + 1s));
    // A lost assignment, cooperative or not: the same.
    hold.revoked(true, true, t0);
    CHECK(hold.assigned(t0 + 1s));
    CHECK_FALSE(hold.held(t0 + 1s));
}

TEST_CASE("CommitHold after a cooperative revoke waits for the second round's assignment", "[unit][kafka]")
{
    CommitHold hold;
    hold.configure(10s, false);
    hold.revoked(true, false, t0);
    CHECK_FALSE(hold.assigned(t0 + 1s)); // the assign of the first round: still held, renewed
    CHECK(hold.held(t0 + 10500ms));
    CHECK(hold.assigned(t0 + 2s)); // the second round's
    CHECK_FALSE(hold.held(t0 + 2s));
}

TEST_CASE("CommitHold never holds for a rebalance under the consumer protocol", "[unit][kafka]")
{
    CommitHold hold;
    hold.configure(10s, true);
    CHECK_FALSE(hold.hold(t0));
    hold.revoked(true, false, t0);
    CHECK_FALSE(hold.held(t0));
    CHECK_FALSE(hold.assigned(t0));
    CHECK_FALSE(hold.assigned(t0));
    CHECK_FALSE(hold.held(t0));
}

TEST_CASE("CommitHold keeps one asynchronous commit in flight, at most session.timeout.ms", "[unit][kafka]")
{
    CommitHold hold;
    hold.configure(10s, false);
    hold.async_sent(t0);
    CHECK(hold.held(t0 + 9s));
    CHECK_FALSE(hold.held(t0 + 10s)); // no answer within the session timeout: not held any more
    hold.async_answered();
    CHECK_FALSE(hold.held(t0 + 1s));
    hold.async_sent(t0);
    CHECK_FALSE(hold.assigned(t0)); // an assignment does not answer a commit
    CHECK(hold.held(t0 + 1s));
}
