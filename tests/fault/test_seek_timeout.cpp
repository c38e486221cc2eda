// Rewinds whose seek call reports a timeout although the seek happens: what
// librdkafka does when its reply comes late (before 2.1, a 5000 ms timeout
// waited 5 ms). The seek op is queued, with its version barrier already set
// (nothing fetched before it is delivered any more), when the call times out.
//
// This program replaces rd_kafka_seek_partitions() for everything linked into
// it: the real seek runs, then the call reports RD_KAFKA_RESP_ERR__TIMED_OUT
// every time. That makes the load-dependent path of the seek test in test_recovery_edges.cpp
// deterministic. It is its own program so no other test sees the replacement.

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

namespace {

std::atomic<long> seeks_reported_timed_out{0};

} // namespace

extern "C" rd_kafka_error_t* rd_kafka_seek_partitions(rd_kafka_t* rk, rd_kafka_topic_partition_list_t* partitions,
                                                      int timeout_ms)
{
    using Seek = rd_kafka_error_t* (*)(rd_kafka_t*, rd_kafka_topic_partition_list_t*, int);
    static const auto real = reinterpret_cast<Seek>(dlsym(RTLD_NEXT, "rd_kafka_seek_partitions"));
    if (!real)
        std::abort(); // the real librdkafka is not linked: nothing here can work
    if (rd_kafka_error_t* e = real(rk, partitions, timeout_ms))
        return e;
    ++seeks_reported_timed_out;
    for (int i = 0; i < partitions->cnt; ++i)
        partitions->elems[i].err = RD_KAFKA_RESP_ERR__IN_PROGRESS; // as a timed-out call leaves them
    return rd_kafka_error_new(RD_KAFKA_RESP_ERR__TIMED_OUT, "Timed out waiting for %d remaining partition seek(s)",
                              partitions->cnt);
}

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

void run_to_the_end(Consumer& c, Fixture& f, std::size_t events)
{
    Runner<Consumer> run(c);
    const bool done = wait_until(
        [&] { return f.rows() >= static_cast<std::int64_t>(events) && c.metrics().snapshot().lag == 0; }, 60s);
    run.join();
    fail_if_threw(run.error());
    const auto m = c.metrics().snapshot();
    CAPTURE(f.rows(), m.lag, m.consumed, seeks_reported_timed_out.load());
    REQUIRE(done);
}

} // namespace

// Before: the rewound record's arrival ended the rewind but left needs_seek
// set; the next housekeeping seeked to offset -1, the end of the log, and every
// record between was lost.
TEST_CASE("seek reported as timed out: batches given back at the time budget lose nothing", "[fault][seek]")
{
    constexpr std::size_t events = 600;
    Fixture f(1);
    f.publish(static_cast<int>(events));
    auto cfg = f.config();
    cfg.max_batch = 50;
    cfg.max_batch_duration = 30ms; // about 10 slow records a batch; the rest are given back and rewound
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        // Slow for the first 150 records, so their batches end at the budget;
        // later batches finish whole (and a lost stretch would stay lost).
        if (ctx.offset() < 150)
            std::this_thread::sleep_for(3ms);
        f.insert(tx, e, ctx);
    });
    const long before = seeks_reported_timed_out.load();
    run_to_the_end(c, f, events);
    f.check_exact(events);
    CHECK(seeks_reported_timed_out.load() - before >= 3);
    CHECK(c.metrics().snapshot().dead_lettered_total() == 0);
}

// Before: a partition paused for a retry backoff was resumed only after a seek
// call reported success, so a seek that always reported a timeout kept the
// partition paused for good.
TEST_CASE("seek reported as timed out: records retried after a failure are resumed and lose nothing", "[fault][seek]")
{
    constexpr std::size_t events = 200;
    Fixture f(2);
    f.publish(static_cast<int>(events));
    auto cfg = f.config();
    cfg.max_batch = 40;
    cfg.retry_backoff = 5ms;
    cfg.retry_backoff_max = 20ms;
    std::set<EventId> flaky;
    for (std::size_t i = 0; i < f.events.size(); i += 9)
        flaky.insert(f.events[i].id);
    std::mutex mu;
    std::set<EventId> failed_once;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (flaky.count(e.id)) {
            std::lock_guard<std::mutex> lock(mu);
            if (failed_once.insert(e.id).second)
                throw std::runtime_error("first attempt fails");
        }
        f.insert(tx, e, ctx);
    });
    const long before = seeks_reported_timed_out.load();
    run_to_the_end(c, f, events);
    f.check_exact(events);
    const auto m = c.metrics().snapshot();
    CHECK(m.handler_failures == flaky.size());
    CHECK(m.dead_lettered_total() == 0);
    CHECK(seeks_reported_timed_out.load() - before >= 3);
}
