#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "core/circuit_breaker.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;
using namespace std::chrono_literals;
using Verdict = Circuit::Verdict;
using Outcome = Circuit::Probe::Outcome;

namespace {

const Circuit::Clock::time_point t0 = Circuit::Clock::now();

CircuitBreaker settings()
{
    CircuitBreaker s; // window 10 s, 10 attempts, half failed, 3 keys, 1 partition
    s.backoff = 1000ms;
    s.backoff_max = 4000ms;
    return s;
}

// Failures of `keys` keys in turn, one every `every`, from `from`; the
// verdict of the last.
Verdict fail(Circuit& c, int n, int keys, Circuit::Clock::time_point from, std::chrono::microseconds every = 10ms,
             std::uint64_t partitions = 1)
{
    Verdict v = Verdict::counted;
    for (int i = 0; i < n; ++i)
        v = c.failed(static_cast<std::uint64_t>(i) % partitions, static_cast<std::uint64_t>(i % keys), "503",
                     from + i * every);
    return v;
}

// A consumer in miniature around the circuit, in steps of 10 ms: records
// arrive and, when due, run in units of at most max_batch (probe_records
// while probing) as the workers run them: one transaction after the other
// until one commits all that is left; a failing record's transaction rolls
// back (the calls before it ran, and run again), the record waits its retry
// backoff (100 ms doubling) with the later records of its partition, and
// after max_attempts counted failures is a dead letter. An opening forgives
// every record's failures and stops everything until a probe is due. Keys
// are 1..keys in turn (0: each record a key of its own); partition: key % 4.
struct Sim {
    struct Record {
        std::uint64_t key;
        bool poison;
        bool gone = false;
        int attempts = 0; // counted failures
        Circuit::Clock::time_point due;
    };

    explicit Sim(const CircuitBreaker& s) : c(s), probe_records(s.probe_records) {}

    Circuit c;
    std::size_t probe_records;
    std::size_t max_batch = 100;
    int max_attempts = 5;
    Circuit::Clock::time_point now = t0;
    std::vector<Record> records;
    std::function<bool(const Record&)> fails = [](const Record& r) { return r.poison; };
    std::size_t done = 0, dead_healthy = 0, dead_poison = 0;
    std::uint64_t keys = 0;
    std::uint64_t added = 0;

    void add(bool poison)
    {
        ++added;
        records.push_back({keys == 0 ? added : added % keys + 1, poison, false, 0, now});
    }

    void count(Record& r)
    {
        if (++r.attempts >= max_attempts) {
            ++(r.poison ? dead_poison : dead_healthy);
            r.gone = true;
            return;
        }
        r.due = now + std::min<std::chrono::milliseconds>(100ms * (1 << (r.attempts - 1)), 10s);
    }

    // The first record of `unit` that fails; the calls before it succeeded.
    std::size_t attempt(const std::vector<Record*>& unit)
    {
        std::size_t i = 0, recovered = 0;
        std::vector<std::uint64_t> ok;
        for (; i < unit.size() && !fails(*unit[i]); ++i) {
            recovered += unit[i]->attempts > 0 ? 1 : 0;
            ok.push_back(unit[i]->key);
        }
        c.succeeded(i, recovered);
        if (c.blaming())
            c.succeeded_on(ok);
        return i;
    }

    void run(std::vector<Record*> unit)
    {
        for (;;) {
            const std::size_t i = attempt(unit);
            if (i == unit.size())
                break;
            Record& r = *unit[i];
            const auto v = c.failed(r.key % 4, r.key, "503", now, r.attempts + 1 >= max_attempts);
            if (v == Verdict::outage) {
                for (auto& o : records)
                    o.attempts = 0;
                return;
            }
            const auto part = r.key % 4;
            if (v == Verdict::counted)
                count(r);
            else
                r.due = now + c.round_wait();
            const auto due = r.due;
            unit.erase(unit.begin() + static_cast<std::ptrdiff_t>(i));
            for (auto j = unit.begin() + static_cast<std::ptrdiff_t>(i); j != unit.end();)
                if ((*j)->key % 4 == part) {
                    (*j)->due = due; // the partition waits with it
                    j = unit.erase(j);
                } else {
                    ++j;
                }
        }
        for (auto* r : unit) {
            r->gone = true;
            ++done;
        }
    }

    void step()
    {
        now += 10ms;
        if (c.state() == Circuit::State::open && !c.probe_due(now))
            return;
        const bool probing = c.state() == Circuit::State::probing;
        std::vector<Record*> due;
        for (auto& r : records)
            if (!r.gone && r.due <= now)
                due.push_back(&r);
        std::stable_sort(due.begin(), due.end(), [](const Record* a, const Record* b) { return a->due < b->due; });
        due.resize(std::min(due.size(), probing ? probe_records : max_batch));
        run(due);
        if (probing)
            c.settle_probe(now);
        records.erase(std::remove_if(records.begin(), records.end(), [](const Record& r) { return r.gone; }),
                      records.end());
    }
};

} // namespace

TEST_CASE("circuit: a key failing alone never opens it, however often", "[unit][circuit]")
{
    Circuit c(settings());
    CHECK(fail(c, 200, 1, t0) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
    CHECK_FALSE(c.take_opened());
    // Two keys are not enough either.
    CHECK(fail(c, 200, 2, t0 + 3s) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
}

TEST_CASE("circuit: failures across keys open it at min_attempts; the evidence says why", "[unit][circuit]")
{
    Circuit c(settings());
    CHECK(fail(c, 9, 3, t0) == Verdict::counted); // 9 of the 10 attempts needed
    CHECK(c.state() == Circuit::State::closed);
    CHECK(c.failed(0, 7, "payment provider unavailable", t0 + 100ms) == Verdict::outage);
    CHECK(c.state() == Circuit::State::open);
    const auto e = c.take_opened();
    REQUIRE(e);
    CHECK(e->attempts == 10);
    CHECK(e->failures == 10);
    CHECK(e->keys == 3);
    CHECK(e->partitions == 1);
    CHECK(e->span == 100ms);
    CHECK(e->wait == 1000ms);
    CHECK(e->last_error == "payment provider unavailable");
    CHECK_FALSE(c.take_opened()); // once
    // While open, every failure is the outage's.
    CHECK(c.failed(0, 1, "503", t0 + 200ms) == Verdict::outage);
}

TEST_CASE("circuit: a poison record among healthy ones keeps it closed", "[unit][circuit]")
{
    Circuit c(settings());
    // Every 100 ms: a batch of 50 healthy records commits, and one of 5
    // poison keys fails.
    for (int i = 0; i < 300; ++i) {
        const auto now = t0 + i * 100ms;
        c.succeeded(50);
        CHECK(c.failed(0, static_cast<std::uint64_t>(i % 5), "bug", now + 1ms) == Verdict::counted);
    }
    CHECK(c.state() == Circuit::State::closed);
}

TEST_CASE("circuit: poison keys left alone after a backlog drained keep it closed", "[unit][circuit]")
{
    Circuit c(settings());
    // Five poison keys start failing while healthy records still commit...
    for (int i = 0; i < 5; ++i) {
        c.succeeded(100);
        CHECK(c.failed(0, static_cast<std::uint64_t>(i), "bug", t0 + i * 10ms) == Verdict::counted);
    }
    c.succeeded(100);
    // ... then nothing but their retries is left.
    for (int round = 1; round < 5; ++round)
        CHECK(fail(c, 5, 5, t0 + round * 300ms, 1ms) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
}

TEST_CASE("circuit: a partial outage (nine records in ten fail) opens it", "[unit][circuit]")
{
    Circuit c(settings());
    Verdict v = Verdict::counted;
    for (int i = 0; i < 100 && v == Verdict::counted; ++i) {
        if (i % 10 == 0)
            c.succeeded(1);
        else
            v = c.failed(0, static_cast<std::uint64_t>(i), "503", t0 + i * 1ms);
    }
    CHECK(v == Verdict::outage);
    CHECK(c.take_opened()->attempts >= 10);
}

TEST_CASE("circuit: successes before the oldest failure do not hide an outage", "[unit][circuit]")
{
    Circuit c(settings());
    for (int i = 0; i < 50; ++i) // 5 s of 1,000 records per 100 ms
        c.succeeded(1000);
    CHECK(fail(c, 9, 4, t0 + 5s) == Verdict::counted);
    CHECK(fail(c, 1, 4, t0 + 5s + 90ms) == Verdict::outage);
}

TEST_CASE("circuit: the failure ratio counts successes after the oldest failure", "[unit][circuit]")
{
    SECTION("half failed: open")
    {
        Circuit c(settings());
        c.failed(0, 0, "503", t0);
        c.succeeded(10);
        CHECK(fail(c, 9, 3, t0 + 2s, 10ms) == Verdict::outage); // 10 of 20
    }
    SECTION("less than half: closed")
    {
        Circuit c(settings());
        c.failed(0, 0, "503", t0);
        c.succeeded(11);
        CHECK(fail(c, 9, 3, t0 + 2s, 10ms) == Verdict::counted); // 10 of 21
        CHECK(c.state() == Circuit::State::closed);
    }
}

TEST_CASE("circuit: failures older than the window are forgotten", "[unit][circuit]")
{
    Circuit c(settings());
    CHECK(fail(c, 9, 3, t0) == Verdict::counted);
    CHECK(c.failed(0, 1, "503", t0 + 11s) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
}

TEST_CASE("circuit: min_partitions asks for failures in that many partitions", "[unit][circuit]")
{
    auto s = settings();
    s.min_partitions = 2;
    Circuit c(s);
    CHECK(fail(c, 30, 10, t0, 10ms, 1) == Verdict::counted);
    CHECK(c.failed(1, 99, "503", t0 + 400ms) == Verdict::outage);
}

TEST_CASE("circuit: probes after the backoff; a failed probe doubles it, a success closes", "[unit][circuit]")
{
    Circuit c(settings());
    REQUIRE(fail(c, 10, 3, t0) == Verdict::outage);
    REQUIRE(c.take_opened());
    const auto opened = t0 + 90ms;
    CHECK_FALSE(c.probe_due(opened + 999ms));
    c.succeeded(5); // a batch that began before the circuit opened
    CHECK(c.probe_due(opened + 1000ms));
    CHECK_FALSE(c.probe_due(opened + 1000ms)); // once
    CHECK(c.state() == Circuit::State::probing);

    // Nothing ran (duplicates only): still probing.
    CHECK(c.settle_probe(opened + 1100ms).outcome == Outcome::unsettled);
    CHECK(c.state() == Circuit::State::probing);

    // Every probe call fails, on keys that had not failed before: open
    // again, twice as long, then 4 s at most.
    CHECK(c.failed(0, 11, "still 503", opened + 1200ms) == Verdict::probe);
    CHECK(c.failed(0, 12, "still 503", opened + 1210ms) == Verdict::probe); // the probe goes on
    auto p = c.settle_probe(opened + 1300ms);
    CHECK(p.outcome == Outcome::reopened);
    CHECK(p.failures == 2);
    CHECK(p.wait == 2000ms);
    CHECK(p.last_error == "still 503");
    CHECK(c.state() == Circuit::State::open);
    CHECK_FALSE(c.take_opened()); // not a new opening
    CHECK_FALSE(c.probe_due(opened + 3200ms));
    CHECK(c.probe_due(opened + 3300ms));
    c.failed(0, 13, "503", opened + 3400ms);
    CHECK(c.settle_probe(opened + 3500ms).wait == 4000ms);
    REQUIRE(c.probe_due(opened + 7500ms));
    c.failed(0, 14, "503", opened + 7600ms);
    CHECK(c.settle_probe(opened + 7700ms).wait == 4000ms); // backoff_max

    // One success among failures closes it.
    REQUIRE(c.probe_due(opened + 11700ms));
    c.failed(0, 1, "poison", opened + 11800ms);
    c.succeeded(3);
    p = c.settle_probe(opened + 12000ms);
    CHECK(p.outcome == Outcome::closed);
    CHECK(p.successes == 3);
    CHECK(p.failures == 1);
    CHECK(p.open_for == 12000ms);
    CHECK(c.state() == Circuit::State::closed);
    // A fresh start: the outage's failures are gone, and the backoff is short
    // again (once the blamed keys succeeded, their failures are evidence).
    c.succeeded_on({0, 1, 2, 11, 12, 13, 14});
    CHECK_FALSE(c.blaming());
    CHECK(fail(c, 9, 3, opened + 12100ms) == Verdict::counted);
    CHECK(c.failed(0, 1, "503", opened + 12200ms) == Verdict::outage);
    CHECK(c.take_opened()->wait == 1000ms);
}

TEST_CASE("circuit: a probe where only suspects fail goes on past them", "[unit][circuit]")
{
    Circuit c(settings());
    REQUIRE(fail(c, 10, 3, t0) == Verdict::outage); // keys 0, 1, 2 are suspects
    const auto opened = t0 + 90ms;
    REQUIRE(c.probe_due(opened + 1000ms));

    // The suspects fail again (poison at the heads, say): inconclusive.
    CHECK(c.failed(0, 1, "poison", opened + 1100ms) == Verdict::probe);
    CHECK(c.failed(0, 2, "poison", opened + 1110ms) == Verdict::probe);
    auto p = c.settle_probe(opened + 1200ms);
    CHECK(p.outcome == Outcome::passed);
    CHECK(p.failures == 2);
    CHECK(p.new_keys == 0);
    CHECK(c.state() == Circuit::State::probing);
    CHECK_FALSE(c.probe_due(opened + 1300ms)); // no backoff: it is probing already

    // Nothing ran (duplicates only): still probing, as before.
    CHECK(c.settle_probe(opened + 1300ms).outcome == Outcome::unsettled);
    // The last suspect, for the first time in this round: passed too.
    c.failed(0, 0, "poison", opened + 1350ms);
    CHECK(c.settle_probe(opened + 1360ms).outcome == Outcome::passed);

    // A suspect again in this round, beside duplicates: the probe went
    // past it, still passed.
    c.failed(0, 1, "poison", opened + 1370ms);
    c.skipped(4);
    p = c.settle_probe(opened + 1380ms);
    CHECK(p.outcome == Outcome::passed);
    CHECK(p.skipped == 4);
    // Nothing but suspects again in this round: nothing else could run,
    // open again.
    c.failed(0, 1, "poison", opened + 1400ms);
    c.failed(0, 0, "poison", opened + 1410ms);
    p = c.settle_probe(opened + 1500ms);
    CHECK(p.outcome == Outcome::reopened);
    CHECK(p.wait == 2000ms);

    // A new round: the suspects pass again; a key that had not failed
    // before fails: an outage after all, and it is a suspect from then on.
    REQUIRE(c.probe_due(opened + 3500ms));
    c.failed(0, 1, "503", opened + 3600ms);
    CHECK(c.settle_probe(opened + 3650ms).outcome == Outcome::passed);
    c.failed(0, 7, "503", opened + 3660ms);
    c.failed(0, 2, "503", opened + 3670ms);
    p = c.settle_probe(opened + 3700ms);
    CHECK(p.outcome == Outcome::reopened);
    CHECK(p.new_keys == 1);
    REQUIRE(c.probe_due(opened + 7700ms));
    c.failed(0, 7, "503", opened + 7800ms);
    CHECK(c.settle_probe(opened + 7900ms).outcome == Outcome::passed);

    // A success closes it; the suspects are forgotten with the rest once
    // their records succeed.
    c.succeeded(1);
    REQUIRE(c.settle_probe(opened + 8000ms).outcome == Outcome::closed);
    c.succeeded_on({0, 1, 2, 7});
    CHECK(fail(c, 10, 3, opened + 8100ms) == Verdict::outage);
    REQUIRE(c.probe_due(opened + 9200ms));
    c.failed(0, 7, "503", opened + 9300ms); // key 7 was a suspect of an earlier opening only
    CHECK(c.settle_probe(opened + 9400ms).outcome == Outcome::reopened);
}

TEST_CASE("circuit: a round passes at most 10 x probe_records suspects, then opens again", "[unit][circuit]")
{
    auto s = settings();
    s.probe_records = 2;
    s.min_keys = 30;
    s.min_attempts = 30;
    Circuit c(s);
    REQUIRE(fail(c, 30, 30, t0) == Verdict::outage); // 30 suspects
    REQUIRE(c.probe_due(t0 + 2s));
    for (std::uint64_t k = 0; k < 20; k += 2) {
        c.failed(0, k, "503", t0 + 2s);
        c.failed(0, k + 1, "503", t0 + 2s);
        REQUIRE(c.settle_probe(t0 + 2s).outcome == Outcome::passed);
    }
    c.failed(0, 20, "503", t0 + 2s); // the 21st in the round
    CHECK(c.settle_probe(t0 + 2s).outcome == Outcome::reopened);
}

TEST_CASE("circuit: after a close the suspects are blamed: they open it only at a last attempt", "[unit][circuit]")
{
    Circuit c(settings());
    const auto close = [&](Circuit::Clock::time_point at) {
        REQUIRE(fail(c, 10, 3, at) == Verdict::outage); // keys 0, 1, 2
        REQUIRE(c.probe_due(at + 1100ms));
        c.failed(0, 5, "poison", at + 1100ms); // a suspect from the probe
        c.succeeded(1);
        const auto p = c.settle_probe(at + 1200ms);
        REQUIRE(p.outcome == Outcome::closed);
        CHECK(p.blamed == 4);
        CHECK(c.blaming());
    };
    close(t0);
    const std::vector<std::uint64_t> blamed{0, 1, 2, 5};
    const auto burst = [&](Circuit::Clock::time_point at, int n, bool last) {
        Verdict v = Verdict::counted;
        for (int i = 0; i < n; ++i)
            v = c.failed(0, blamed[static_cast<std::size_t>(i % 4)], "poison", at + i * 1ms, last);
        return v;
    };

    // The poison that waited out the circuit fails again, all at once, before
    // the successes beside it are reported: counted, the circuit stays closed.
    CHECK(burst(t0 + 5s, 40, false) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
    // By its last attempts the successes are in: no evidence, dead-lettered.
    c.succeeded(200);
    CHECK(burst(t0 + 5300ms, 4, true) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);

    // The outage came back instead: nothing succeeds, and at a last attempt
    // the evidence opens it; the blamed keys are suspects again.
    c.succeeded_on(blamed); // (a fresh start for the next opening)
    CHECK_FALSE(c.blaming());
    close(t0 + 1h);
    CHECK(burst(t0 + 1h + 5s, 12, false) == Verdict::counted);
    CHECK(c.failed(0, 0, "503", t0 + 1h + 5100ms, true) == Verdict::outage);
    CHECK(c.blaming()); // convicted now: their successes are still looked for
    REQUIRE(c.probe_due(t0 + 1h + 7s));
    c.failed(0, 5, "503", t0 + 1h + 7s); // blamed before: a suspect, not a new key
    const auto q = c.settle_probe(t0 + 1h + 7s);
    CHECK(q.outcome == Outcome::passed);
    CHECK(q.new_keys == 0);

    // A key that succeeded is no longer blamed: its failures open it at once.
    c.succeeded(1);
    REQUIRE(c.settle_probe(t0 + 1h + 8s).outcome == Outcome::closed);
    c.succeeded_on({0, 1, 2});
    CHECK(c.blaming()); // 5 is left
    CHECK(fail(c, 10, 3, t0 + 2h) == Verdict::outage);
}

TEST_CASE("circuit: blamed keys that open it again at a last attempt, then a success: their failures are their own",
          "[unit][circuit]")
{
    Circuit c(settings());
    REQUIRE(fail(c, 10, 3, t0) == Verdict::outage); // keys 0, 1, 2
    REQUIRE(c.probe_due(t0 + 1100ms));
    c.succeeded(1);
    REQUIRE(c.settle_probe(t0 + 1200ms).outcome == Outcome::closed); // blamed
    // Their retries outnumber the successes of a trickle of healthy records:
    // at a last attempt the evidence opens it again.
    c.succeeded(2);
    CHECK(fail(c, 12, 3, t0 + 2s) == Verdict::counted);
    CHECK(c.failed(0, 1, "bug", t0 + 2200ms, true) == Verdict::outage);
    REQUIRE(c.take_opened());
    // The handler works once more for another record, and they still fail.
    REQUIRE(c.probe_due(t0 + 3300ms));
    c.failed(0, 2, "bug", t0 + 3300ms);
    c.succeeded(1);
    const auto p = c.settle_probe(t0 + 3300ms);
    REQUIRE(p.outcome == Outcome::closed);
    CHECK(p.blamed == 3);
    CHECK(p.convicted == 3);
    // Now their failures count, last attempts too: they are dead-lettered.
    for (int i = 0; i < 30; ++i)
        CHECK(c.failed(0, static_cast<std::uint64_t>(i % 3), "bug", t0 + 4s + i * 10ms, i >= 27) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
    // Other keys failing are still an outage.
    Verdict v = Verdict::counted;
    for (int i = 0; i < 10; ++i)
        v = c.failed(0, 10 + static_cast<std::uint64_t>(i % 3), "503", t0 + 5s + i * 10ms);
    CHECK(v == Verdict::outage);
    // A convicted key whose record succeeds is blamed no more.
    c.succeeded_on({0});
    REQUIRE(c.probe_due(t0 + 7s));
    c.succeeded(1);
    const auto q = c.settle_probe(t0 + 7s);
    REQUIRE(q.outcome == Outcome::closed);
    CHECK(q.blamed == 6); // the suspects: 0 (it failed while open), 1, 2 and the three new keys
    CHECK(q.convicted == 2);
}

TEST_CASE("circuit: at a last attempt, records of many keys that failed and then succeeded open it (flapping)",
          "[unit][circuit]")
{
    SECTION("failed records succeed at their next attempt: a flapping downstream")
    {
        Circuit c(settings());
        for (int k = 0; k < 20; ++k) { // a third of all calls fail
            c.succeeded(2, 1);
            CHECK(c.failed(static_cast<std::uint64_t>(k % 2), static_cast<std::uint64_t>(k), "503", t0 + k * 10ms) ==
                  Verdict::counted);
        }
        c.succeeded(4, 2);
        CHECK(c.failed(0, 99, "503", t0 + 300ms) == Verdict::counted);
        c.succeeded(4, 2);
        CHECK(c.failed(0, 99, "503", t0 + 400ms, true) == Verdict::outage);
        const auto e = c.take_opened();
        REQUIRE(e);
        CHECK(e->recovered >= 19);
        CHECK(e->keys == 21);
        CHECK(e->partitions == 2);
    }
    SECTION("the same failures among first-attempt successes: poison, dead-lettered")
    {
        Circuit c(settings());
        for (int k = 0; k < 20; ++k) {
            c.succeeded(2, 0);
            CHECK(c.failed(static_cast<std::uint64_t>(k % 2), static_cast<std::uint64_t>(k), "503", t0 + k * 10ms) ==
                  Verdict::counted);
        }
        c.succeeded(4, 0);
        CHECK(c.failed(0, 99, "503", t0 + 400ms, true) == Verdict::counted);
    }
    SECTION("a few retried records among many successes: normal, dead-lettered")
    {
        Circuit c(settings());
        for (int k = 0; k < 20; ++k) {
            c.succeeded(100, 1);
            CHECK(c.failed(0, static_cast<std::uint64_t>(k), "503", t0 + k * 10ms) == Verdict::counted);
        }
        CHECK(c.failed(0, 99, "503", t0 + 400ms, true) == Verdict::counted);
    }
}

TEST_CASE("circuit: nothing but suspects failing for give_up_after: their failures count", "[unit][circuit]")
{
    auto s = settings();
    s.give_up_after = 10s;
    Circuit c(s);
    REQUIRE(fail(c, 10, 3, t0) == Verdict::outage); // keys 0, 1, 2: poison alone at the tail, say
    const auto opened = t0 + 90ms;
    // Before give_up_after: probes, and nothing but suspects again opens it again.
    auto at = opened + 1000ms;
    REQUIRE(c.probe_due(at));
    for (std::uint64_t k = 0; k < 3; ++k)
        CHECK(c.failed(0, k, "poison", at) == Verdict::probe);
    auto p = c.settle_probe(at);
    CHECK(p.outcome == Outcome::passed);
    CHECK_FALSE(p.counted);
    c.failed(0, 0, "poison", at);
    CHECK(c.settle_probe(at).outcome == Outcome::reopened);
    // Past it: counted, and the probe passes however often they fail again,
    // so that they run out their attempts.
    at = opened + 10s;
    REQUIRE(c.probe_due(at));
    CHECK(c.failed(0, 1, "poison", at) == Verdict::counted);
    p = c.settle_probe(at);
    CHECK(p.outcome == Outcome::passed);
    CHECK(p.counted);
    CHECK(p.gave_up);
    CHECK(p.open_for == 10s);
    for (int i = 0; i < 50; ++i) { // past 10 x probe_records in the round too
        CHECK(c.failed(0, static_cast<std::uint64_t>(i % 3), "poison", at) == Verdict::counted);
        p = c.settle_probe(at);
        CHECK(p.outcome == Outcome::passed);
        CHECK_FALSE(p.gave_up); // said once
    }
    // A key that had not failed: open again for the backoff, still counted.
    CHECK(c.failed(0, 9, "503", at) == Verdict::counted);
    CHECK(c.settle_probe(at).outcome == Outcome::reopened);
    // A success closes it; the next opening starts afresh.
    REQUIRE(c.probe_due(at + 1h));
    c.succeeded(1);
    REQUIRE(c.settle_probe(at + 1h).outcome == Outcome::closed);
    c.succeeded_on({0, 1, 2, 9});
    const auto again = at + 2h;
    REQUIRE(fail(c, 10, 3, again) == Verdict::outage);
    REQUIRE(c.probe_due(again + 2s));
    CHECK(c.failed(0, 0, "503", again + 2s) == Verdict::probe);
}

TEST_CASE("circuit: give_up_after zero never gives up", "[unit][circuit]")
{
    auto s = settings();
    s.give_up_after = 0ms;
    Circuit c(s);
    REQUIRE(fail(c, 10, 3, t0) == Verdict::outage);
    REQUIRE(c.probe_due(t0 + 24h));
    CHECK(c.failed(0, 0, "poison", t0 + 24h) == Verdict::probe);
    CHECK_FALSE(c.settle_probe(t0 + 24h).counted);
}

TEST_CASE("circuit: disabled, every failure counts", "[unit][circuit]")
{
    auto s = settings();
    s.enabled = false;
    Circuit c(s);
    CHECK(fail(c, 1000, 100, t0, 1ms, 10) == Verdict::counted);
    CHECK(c.state() == Circuit::State::closed);
    CHECK_FALSE(c.probe_due(t0 + 1h));
}

TEST_CASE("circuit: tens of thousands of keys failing in the window, judged at each failure", "[unit][circuit]")
{
    auto s = settings();
    s.min_partitions = 2; // never met below: every key is evidence, the partition is not
    Circuit c(s);
    const auto started = Circuit::Clock::now();
    CHECK(fail(c, 20000, 20000, t0, 100us) == Verdict::counted);
    CHECK(Circuit::Clock::now() - started < 5s); // not quadratic
    CHECK(c.failed(1, 123456789, "503", t0 + 2s + 1ms) == Verdict::outage);
    const auto e = c.take_opened();
    REQUIRE(e);
    CHECK(e->partitions == 2);
    CHECK(e->keys == 3);
    CHECK(e->failures == 10000); // the window keeps the newest 10,000 failures
}

TEST_CASE("circuit: poison keys among a trickle of healthy records are dead-lettered", "[unit][circuit]")
{
    auto s = settings();
    s.backoff = 500ms;
    s.backoff_max = 2000ms;
    for (const int poison : {3, 5, 12}) {
        for (const auto every : {1000ms, 250ms, 130ms}) { // 1, 4 and under 8 healthy records a second
            INFO(poison << " poison keys, a healthy record every " << every.count() << " ms");
            Sim sim(s);
            for (int k = 0; k < poison; ++k)
                sim.add(true);
            for (int i = 0; i < 6000 && sim.dead_poison < static_cast<std::size_t>(poison); ++i) { // 60 s
                if (i % (every / 10ms) == 0)
                    sim.add(false);
                sim.step();
            }
            CHECK(sim.dead_poison == static_cast<std::size_t>(poison));
            CHECK(sim.dead_healthy == 0);
            CHECK(sim.now - t0 < 30s);
        }
    }
}

TEST_CASE("circuit: a flapping downstream (a third or half of all calls failing at random) dead-letters nothing",
          "[unit][circuit]")
{
    auto s = settings();
    s.backoff = 500ms;
    s.backoff_max = 2000ms;
    for (const double p : {0.3, 0.5}) {
        for (const std::size_t batch : {1, 100}) {
            for (const std::uint64_t keys : {0, 50}) {
                for (std::uint32_t seed = 1; seed <= 4; ++seed) {
                    INFO(p << " of the calls fail, units of " << batch << ", " << keys << " keys, seed " << seed);
                    std::mt19937 random(seed);
                    std::bernoulli_distribution failing(p);
                    Sim sim(s);
                    sim.keys = keys;
                    sim.max_batch = batch;
                    sim.fails = [&](const Sim::Record&) { return failing(random); };
                    for (int i = 0; i < 6000; ++i) { // 60 s, a record every 10 ms
                        sim.add(false);
                        sim.step();
                    }
                    sim.fails = [](const Sim::Record&) { return false; };
                    for (int i = 0; i < 6000 && !sim.records.empty(); ++i)
                        sim.step();
                    CHECK(sim.dead_healthy == 0);
                    CHECK(sim.done == 6000);
                }
            }
        }
    }
}
