// The engine's parts, driven without Kafka or PostgreSQL: the waiting room,
// the dispatcher (lanes, shares, slots), the database and circuit gates, the
// commit pacer, the keep-alive and its watch on calls that do not return,
// and the run's signals.

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "catch_compat.hpp"
#include "consumer/dispatcher.hpp"
#include "consumer/gates.hpp"
#include "consumer/run_signals.hpp"
#include "consumer/waiting_room.hpp"
#include "polled_item.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;
using namespace std::chrono_literals;

namespace {

const Clock::time_point t0 = Clock::now();

// A polled record of ten payload bytes (or `value`).
Item record(PartitionState& ps, std::int64_t offset, std::optional<std::string_view> key = std::nullopt,
            std::string_view value = "0123456789")
{
    return test::polled(ps, offset, key, value);
}

PartitionState partition(std::int32_t n)
{
    PartitionState ps;
    ps.tp = {"orders", n};
    return ps;
}

std::vector<std::int64_t> offsets(const std::vector<Item>& items)
{
    std::vector<std::int64_t> out;
    for (const auto& it : items)
        out.push_back(it.record.offset);
    return out;
}

// Two partitions, a dispatcher whose workers are all ready, with `slots`
// Stage slots, whose decoded records and started units are listed, and a
// waiting room of 100 records (after the dispatcher: its records may hold
// the dispatcher's slots).
struct Desk {
    PartitionState p0 = partition(0);
    PartitionState p1 = partition(1);
    std::vector<std::int64_t> decoded; // offsets, as decoded
    std::vector<std::size_t> started;
    Dispatcher d;
    WaitingRoom room{1 << 20};

    Desk(Ordering ordering, std::size_t workers, std::size_t cap, std::size_t slots = 1000)
        : d(ordering, workers, cap,
            Dispatcher::Hands{[](std::size_t) { return true; },
                              [this](Item& it) { decoded.push_back(it.record.offset); },
                              [this](std::size_t n) { started.push_back(n); }})
    {
        d.reserve_slots(slots);
        room.size_to(100);
    }

    // Worker n's unit ended and was merged.
    void end(std::size_t n)
    {
        d.release_lanes(n, [](PartitionState&) {});
        d.finish(n);
    }
};

struct Captured {
    std::vector<LogRecord> lines;
    LogSink sink()
    {
        return [this](const LogRecord& r) { lines.push_back(r); };
    }
};

} // namespace

TEST_CASE("waiting room: bytes, limit and since follow its records", "[unit][engine_parts]")
{
    auto p0 = partition(0);
    WaitingRoom room(35);
    room.size_to(3);
    CHECK(room.empty());
    room.add(record(p0, 1), t0);
    room.add(record(p0, 2, "k"), t0 + 5ms);
    CHECK(room.size() == 2);
    CHECK(room.bytes() == 21);
    CHECK(room.since() == t0); // the oldest record's
    CHECK_FALSE(room.full());
    room.add(record(p0, 3), t0 + 6ms);
    CHECK(room.full()); // three records

    room.limit_to(0); // a probe: at least one
    CHECK(room.limit() == 1);
    room.restore_limit();
    CHECK(room.limit() == 3);

    room.drop_if([](const Item& it) { return it.record.offset == 2; });
    CHECK(room.size() == 2);
    CHECK(room.bytes() == 20);
    auto taken = room.take_if([](const Item& it) { return it.record.offset == 1; });
    CHECK(offsets(taken) == std::vector<std::int64_t>{1});
    CHECK(room.bytes() == 10);

    room.size_to(100);
    room.add(record(p0, 4, std::nullopt, std::string_view("0123456789012345678901234")), t0);
    CHECK(room.bytes() == 35);
    CHECK(room.full()); // max_bytes

    room.clear();
    CHECK(room.bytes() == 0);
    const auto first = room.add_from(
        [&](std::vector<Item>& records) {
            records.push_back(record(p0, 7));
            records.push_back(record(p0, 8));
        },
        t0 + 9ms);
    CHECK(first == 0);
    CHECK(room.bytes() == 20);
    CHECK(room.since() == t0 + 9ms);
}

TEST_CASE("dispatcher: a partition's records run in one unit at a time, in order", "[unit][engine_parts]")
{
    Desk desk(Ordering::partition, 2, 10);
    auto& [p0, p1, decoded, started, d, room] = desk;
    for (std::int64_t o = 0; o < 4; ++o) {
        room.add(record(p0, o), t0);
        room.add(record(p1, o), t0);
    }
    d.changed();
    // Two partitions, two workers: each unit takes one partition (its share).
    CHECK_FALSE(d.due(room, t0, 10ms, false)); // 8 records, a unit takes 10: the fill wait goes on
    REQUIRE(d.due(room, t0 + 10ms, 10ms, false));
    CHECK(d.hand_out(room, 10, false, t0) == 2);
    CHECK(started == std::vector<std::size_t>{0, 1});
    CHECK(offsets(d.unit(0)) == std::vector<std::int64_t>{0, 1, 2, 3});
    CHECK(d.unit(0)[0].part == &p0);
    CHECK(d.unit(1)[0].part == &p1);
    CHECK(p0.unit == 1);
    CHECK(p1.unit == 2);
    CHECK(d.busy_units() == 2);
    CHECK(d.deadline(0) == t0 + 120000ms);
    CHECK(room.empty());

    // More of p0 while worker 0 runs it: it waits, though worker 1 frees up.
    room.add(record(p0, 4), t0 + 1ms);
    d.changed();
    std::vector<std::int32_t> freed;
    d.release_lanes(1, [&](PartitionState& ps) { freed.push_back(ps.tp.partition); });
    CHECK(d.finish(1));
    CHECK(freed == std::vector<std::int32_t>{1});
    CHECK(p1.unit == 0);
    REQUIRE(d.due(room, t0 + 1ms, 10ms, false)); // a worker was freed
    CHECK(d.hand_out(room, 10, false, t0 + 2ms) == 0);
    CHECK(room.size() == 1);
    CHECK(room.since() == t0 + 2ms);                 // passed over
    CHECK_FALSE(d.due(room, t0 + 2ms, 10ms, false)); // nothing changed since

    // Worker 0's unit ends: the record runs next.
    desk.end(0);
    CHECK(d.due(room, t0 + 3ms, 10ms, false));
    CHECK(d.hand_out(room, 10, false, t0 + 3ms) == 1);
    CHECK(offsets(d.unit(0)) == std::vector<std::int64_t>{4});
}

TEST_CASE("dispatcher: when a unit is due", "[unit][engine_parts]")
{
    Desk desk(Ordering::partition, 1, 4);
    auto& [p0, p1, decoded, started, d, room] = desk;
    room.size_to(8);
    CHECK_FALSE(d.due(room, t0, 10ms, false)); // nothing waits
    room.add(record(p0, 0), t0);
    CHECK_FALSE(d.due(room, t0, 10ms, false)); // nothing changed yet
    d.changed();
    CHECK_FALSE(d.due(room, t0 + 9ms, 10ms, false)); // one record, the fill wait goes on
    CHECK(d.due(room, t0 + 9ms, 10ms, true));        // a stop
    CHECK(d.due(room, t0 + 10ms, 10ms, false));      // max_batch_wait over
    for (std::int64_t o = 1; o < 4; ++o)
        room.add(record(p0, o), t0);
    CHECK(d.due(room, t0, 10ms, false)); // a full unit
    d.hand_out(room, 4, false, t0);
    room.add(record(p0, 4), t0);
    d.changed();
    CHECK_FALSE(d.due(room, t0 + 1h, 10ms, true)); // every worker busy
    desk.end(0);
    CHECK(d.due(room, t0, 10ms, false)); // a worker just freed
    d.await_fill();
    CHECK_FALSE(d.due(room, t0 + 1ms, 10ms, false)); // a probe fills first
}

TEST_CASE("dispatcher: keys share a partition over several workers", "[unit][engine_parts]")
{
    Desk desk(Ordering::key, 2, 10);
    auto& [p0, p1, decoded, started, d, room] = desk;
    room.add(record(p0, 0, "a"), t0);
    room.add(record(p0, 1, "b"), t0);
    room.add(record(p0, 2, "a"), t0);
    room.add(record(p0, 3, "c"), t0);
    d.changed();
    // Three keys, two workers: two lanes per unit.
    CHECK(d.lanes_known(room) == 3);
    CHECK(d.hand_out(room, 10, false, t0) == 2);
    CHECK(offsets(d.unit(0)) == std::vector<std::int64_t>{0, 1, 2});
    CHECK(offsets(d.unit(1)) == std::vector<std::int64_t>{3});
    // Key "a" is busy in unit 0: its next record waits, "d" does not.
    room.add(record(p0, 4, "a"), t0);
    room.add(record(p0, 5, "d"), t0);
    desk.end(1);
    CHECK(d.hand_out(room, 10, false, t0) == 1);
    CHECK(offsets(d.unit(1)) == std::vector<std::int64_t>{5});
    CHECK(room.size() == 1);
    // A rewind of the partition to 1 marks the busy units' records from there.
    d.drop_from(&p0, 1);
    CHECK_FALSE(d.unit(0)[0].dropped);
    CHECK(d.unit(0)[1].dropped);
    CHECK(d.unit(1)[0].dropped);
}

TEST_CASE("dispatcher: a probe runs alone", "[unit][engine_parts]")
{
    Desk desk(Ordering::partition, 2, 10);
    auto& [p0, p1, decoded, started, d, room] = desk;
    room.add(record(p0, 0), t0);
    room.add(record(p1, 0), t0);
    d.changed();
    CHECK(d.hand_out(room, 1, true, t0) == 1); // one unit
    CHECK(d.busy_units() == 1);
    d.changed();
    CHECK(d.hand_out(room, 1, true, t0) == 0); // not beside another
    desk.end(0);
    d.changed();
    CHECK(d.hand_out(room, 1, true, t0) == 1);
    CHECK(offsets(d.unit(0)) == std::vector<std::int64_t>{0});
    CHECK(d.unit(0)[0].part == &p1);
}

TEST_CASE("dispatcher: Stage slots; no free slot ends a unit, in order", "[unit][engine_parts]")
{
    // Seven slots, two free workers of three records each: one record may
    // be decoded while it waits, and a unit takes it as it is.
    Desk ahead(Ordering::partition, 2, 3, 7);
    CHECK(ahead.d.decode_ahead());
    ahead.room.add(record(ahead.p0, 0), t0);
    REQUIRE(ahead.d.decode(ahead.room[0]));
    CHECK(ahead.room[0].lease);
    CHECK_FALSE(ahead.d.decode_ahead()); // six left: the free workers' next units
    ahead.room.add(record(ahead.p0, 1), t0);
    ahead.d.changed();
    CHECK(ahead.d.hand_out(ahead.room, 3, false, t0) == 1);
    CHECK(offsets(ahead.d.unit(0)) == std::vector<std::int64_t>{0, 1});
    CHECK(ahead.decoded == std::vector<std::int64_t>{0, 1}); // each once
    CHECK(ahead.d.decode_ahead());                           // five left, one free worker of three records

    // Four slots: worker 1's unit ends at p1@2, which finds none.
    Desk desk(Ordering::partition, 2, 3, 4);
    auto& [p0, p1, decoded, started, d, room] = desk;
    room.add(record(p0, 0), t0);
    room.add(record(p0, 1), t0);
    room.add(record(p1, 0), t0);
    room.add(record(p1, 1), t0);
    room.add(record(p1, 2), t0);
    d.changed();
    CHECK(d.hand_out(room, 3, false, t0) == 2);
    CHECK(offsets(d.unit(0)) == std::vector<std::int64_t>{0, 1});
    CHECK(d.unit(0)[0].part == &p0);
    CHECK(offsets(d.unit(1)) == std::vector<std::int64_t>{0, 1});
    REQUIRE(room.size() == 1);
    CHECK(decoded.size() == 4);
    const auto [records, bytes] = d.in_units();
    CHECK(records == 4);
    CHECK(bytes == 40);
    CHECK_FALSE(d.decode(room[0]));
    desk.end(0); // its slots come back
    CHECK(d.decode(room[0]));
    CHECK(room[0].record.offset == 2);
}

TEST_CASE("dispatcher: units abandoned by a revoke hold the retired states", "[unit][engine_parts]")
{
    Desk desk(Ordering::partition, 2, 10);
    auto& [p0, p1, decoded, started, d, room] = desk;
    room.add(record(p0, 0), t0);
    room.add(record(p1, 0), t0);
    d.changed();
    REQUIRE(d.hand_out(room, 10, false, t0) == 2);
    d.retire(0);
    d.retire(1);
    CHECK_FALSE(d.finish(1)); // unit 0 still points to them
    CHECK(d.finish(0));       // the last one: they may go
    CHECK(d.busy_units() == 0);
    CHECK(d.free_workers() == 2);
}

TEST_CASE("database gate: holds grow the backoff until it reopens", "[unit][engine_parts]")
{
    DatabaseGate db(Backoff{100ms, 400ms});
    CHECK_FALSE(db.closed());
    CHECK(db.retry_due(t0));
    CHECK(db.hold(t0)); // it closes
    CHECK(db.closed());
    CHECK_FALSE(db.retry_due(t0 + 99ms));
    CHECK(db.retry_due(t0 + 100ms));
    CHECK(db.upcoming() == 200ms);
    CHECK_FALSE(db.hold(t0 + 100ms)); // closed already
    CHECK(db.retry_due(t0 + 300ms));
    db.hold(t0 + 300ms);
    CHECK(db.upcoming() == 400ms); // the cap
    CHECK(db.reopen());
    CHECK_FALSE(db.closed());
    CHECK_FALSE(db.reopen());
    CHECK(db.upcoming() == 100ms);
}

TEST_CASE("circuit gate: open, probe, close, each logged and counted", "[unit][engine_parts]")
{
    ConsumerConfig cfg;
    cfg.max_batch = 50;
    cfg.circuit_breaker.backoff = 1000ms;
    cfg.circuit_breaker.probe_records = 5;
    Metrics metrics;
    Captured log;
    const LogSink sink = log.sink();
    CircuitGate gate(cfg, metrics, sink);
    REQUIRE(gate.enabled());
    CHECK_FALSE(gate.must_drain(t0));
    CHECK_FALSE(gate.take_opened(t0));

    // Failures across keys and partitions: an outage.
    for (std::uint64_t i = 0; i < 20; ++i)
        gate.circuit().failed(i % 2, i % 5, "503", t0 + std::chrono::milliseconds(i));
    CHECK(gate.must_drain(t0 + 20ms));
    REQUIRE(gate.take_opened(t0 + 20ms));
    CHECK(metrics.circuit_opened.get() == 1);
    CHECK(metrics.circuit_open.get() == 1);
    CHECK(log.lines.back().level == LogLevel::warning);
    CHECK(log.lines.back().message.find("circuit breaker open") != std::string::npos);

    CHECK_FALSE(gate.probe_due(t0 + 500ms));
    gate.must_drain(t0 + 520ms);
    CHECK(metrics.circuit_open_ms.get() == 500);
    const auto records = gate.probe_due(t0 + 1020ms);
    REQUIRE(records);
    CHECK(*records == 5);
    CHECK(gate.probing());
    gate.unit_started(true);
    CHECK(gate.probe_running());
    CHECK_FALSE(gate.settle(t0 + 1030ms, 1)); // the probe still runs
    gate.circuit().succeeded(5);
    const auto outcome = gate.settle(t0 + 1040ms, 0);
    REQUIRE(outcome);
    CHECK(*outcome == Circuit::Probe::Outcome::closed);
    CHECK_FALSE(gate.probe_running());
    CHECK(metrics.circuit_open.get() == 0);
    CHECK(log.lines.back().message.find("circuit breaker closed") != std::string::npos);
}

TEST_CASE("commit pacer: an offset commit per interval, ticks resend", "[unit][engine_parts]")
{
    CommitPacer pacer(1000ms);
    CHECK(pacer.tick(t0));
    CHECK_FALSE(pacer.tick(t0 + 199ms));
    CHECK(pacer.tick(t0 + 200ms));
    CHECK_FALSE(pacer.due(t0, false)); // nothing committed, no tick
    CHECK(pacer.due(t0, true));        // a tick resends
    pacer.attempted(t0);
    pacer.db_committed(t0 + 10ms);
    pacer.db_committed(t0 + 20ms); // the first one counts
    CHECK_FALSE(pacer.due(t0 + 999ms, false));
    CHECK_FALSE(pacer.due_after_merge(t0 + 999ms));
    CHECK(pacer.due(t0 + 1000ms, false));
    CHECK(pacer.due_after_merge(t0 + 1000ms));
    pacer.attempted(t0 + 1000ms);
    const auto waited = pacer.sent(t0 + 1000ms);
    REQUIRE(waited);
    CHECK(*waited == std::chrono::duration<double>(990ms));
    CHECK_FALSE(pacer.sent(t0 + 1000ms));
}

TEST_CASE("keep-alive: polls within a fifth of max.poll.interval.ms", "[unit][engine_parts]")
{
    Metrics metrics;
    const LogSink quiet;
    KeepAlive k(metrics, quiet);
    k.configure(30000ms, 5000ms);
    CHECK(k.after() == 6000ms);
    CHECK(k.revoke_wait() == 5000ms);
    k.configure(300000ms, 60000ms);
    CHECK(k.after() == 10000ms); // at most 10 s
    CHECK(k.revoke_wait() == 60000ms);
    k.polled(t0);
    CHECK(k.deadline() == t0 + 10000ms);
    CHECK_FALSE(k.paused());
}

TEST_CASE("keep-alive: its call watch is bound by the configured max.poll.interval.ms", "[unit][engine_parts]")
{
    Metrics metrics;
    Captured log;
    const LogSink sink = log.sink();
    KeepAlive k(metrics, sink);
    k.configure(2000ms, 5000ms);
    RunningCall::Seen call;
    call.since = t0;
    call.where = "orders/1@3";
    const std::vector<std::optional<RunningCall::Seen>> calls{call};
    REQUIRE(k.watch_due(t0));
    k.watch(t0 + 1999ms, calls);
    CHECK_FALSE(k.watch_due(t0 + 2100ms)); // every 200 ms
    CHECK(metrics.oldest_call_ms.get() == 1999);
    CHECK(log.lines.empty());
    REQUIRE(k.watch_due(t0 + 2199ms));
    k.watch(t0 + 2200ms, calls); // past the bound
    CHECK(metrics.stuck_calls.get() == 1);
    REQUIRE(log.lines.size() == 1);
    CHECK(log.lines[0].message.find("max.poll.interval.ms 2000 ms") != std::string::npos);
}

TEST_CASE("call watch: a call past the bound is said once per bound, gauged always", "[unit][engine_parts]")
{
    Metrics metrics;
    Captured log;
    const LogSink sink = log.sink();
    CallWatch watch(metrics, sink);
    RunningCall::Seen call;
    call.since = t0;
    call.where = "orders/0@7";
    std::vector<std::optional<RunningCall::Seen>> calls{std::nullopt, call};
    REQUIRE(watch.due(t0));
    watch.watch(t0 + 500ms, calls, 1000ms);
    CHECK_FALSE(watch.due(t0 + 600ms));
    CHECK(metrics.oldest_call_ms.get() == 500);
    CHECK(log.lines.empty());
    watch.watch(t0 + 1000ms, calls, 1000ms);
    CHECK(metrics.stuck_calls.get() == 1);
    REQUIRE(log.lines.size() == 1);
    CHECK(log.lines[0].level == LogLevel::error);
    CHECK(log.lines[0].message.find("orders/0@7") != std::string::npos);
    CHECK(log.lines[0].message.find("worker 1") != std::string::npos);
    watch.watch(t0 + 1500ms, calls, 1000ms); // told 500 ms ago
    CHECK(log.lines.size() == 1);
    watch.watch(t0 + 2000ms, calls, 1000ms); // again, the same call
    CHECK(log.lines.size() == 2);
    CHECK(metrics.stuck_calls.get() == 1);
    calls[1].reset();
    watch.watch(t0 + 2200ms, calls, 1000ms);
    CHECK(metrics.oldest_call_ms.get() == 0);
}

TEST_CASE("run signals: a stop, a unit's end during a poll, a callback's fault", "[unit][engine_parts]")
{
    RunSignals signals(1h);
    CHECK_FALSE(signals.stop.requested());
    CHECK_FALSE(signals.stop.forced());
    signals.stop.request();
    CHECK(signals.stop.requested());
    CHECK_FALSE(signals.stop.forced()); // within shutdown_timeout
    signals.stop.request();
    CHECK(signals.stop.forced()); // a second stop()

    REQUIRE(signals.wake.begin_poll());
    CHECK(signals.wake.ended()); // the poll is to be woken
    signals.wake.end_poll();
    CHECK_FALSE(signals.wake.begin_poll()); // merge the ended unit first
    signals.wake.clear();
    CHECK(signals.wake.begin_poll());
    signals.wake.end_poll();
    CHECK_FALSE(signals.wake.ended()); // not in a poll

    CHECK_FALSE(signals.fault.commits_stopped());
    signals.fault.keep(std::make_exception_ptr(std::runtime_error("first")));
    signals.fault.keep(std::make_exception_ptr(std::runtime_error("second")));
    CHECK(signals.fault.commits_stopped());
    CHECK_THROWS_WITH(signals.fault.rethrow(), "first");
    CHECK_NOTHROW(signals.fault.rethrow()); // once
}

TEST_CASE("run signals: a first stop is forced once older than shutdown_timeout", "[unit][engine_parts]")
{
    RunSignals signals(0ms);
    signals.stop.request();
    CHECK(signals.stop.forced());
}

TEST_CASE("gates: PostgreSQL away or the circuit hold the assignment, the keep-alive pauses new partitions",
          "[unit][engine_parts]")
{
    ConsumerConfig cfg;
    Metrics metrics;
    const LogSink quiet;
    Gates gates(cfg, Backoff{100ms, 400ms}, metrics, quiet);
    CHECK_FALSE(gates.assignment_held());
    CHECK_FALSE(gates.assigned_paused());

    gates.keepalive.set_paused(true);
    CHECK_FALSE(gates.assignment_held()); // the keep-alive resumes it itself
    CHECK(gates.assigned_paused());
    gates.keepalive.set_paused(false);

    gates.db.hold(t0);
    CHECK(gates.assignment_held());
    CHECK(gates.assigned_paused());
    gates.circuit.set_paused(true);
    gates.db.reopen();
    CHECK(gates.assignment_held()); // the circuit still holds it
    gates.circuit.set_paused(false);
    CHECK_FALSE(gates.assignment_held());
    CHECK_FALSE(gates.assigned_paused());
}
