// The parts of the Kafka group member that are pure logic, driven without a
// broker.

#include <chrono>
#include <cstddef>

#include "catch_compat.hpp"
#include "kafka/wake_pacer.hpp"

using namespace idemkafka::detail::kafka;
using namespace std::chrono_literals;

namespace {

const WakePacer::Clock::time_point t0 = WakePacer::Clock::now();

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
