#include <algorithm>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "core/ledger.hpp"

using idemkafka::DeadLetterReason;
using namespace idemkafka::detail;
using std::chrono::milliseconds;

namespace {

PartitionLedger make_ledger()
{
    return PartitionLedger(Backoff{milliseconds(100), milliseconds(1000)},
                           Backoff{milliseconds(1000), milliseconds(30000)});
}

} // namespace

TEST_CASE("ledger: a polled record is foreign, stale before a rewind point, or taken", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& ps = ledger.assign({"t", 0});
    CHECK(PartitionLedger::admit(ledger.find("t", 1), 5) == Admission::foreign);
    CHECK(PartitionLedger::admit(&ps, 5) == Admission::take);

    PartitionLedger::rewind(ps, 10);
    CHECK(ps.rewind.needs_seek);
    CHECK(PartitionLedger::admit(&ps, 9) == Admission::stale);
    CHECK(ps.rewind.resume_from == 10);
    // The first record at or past the point shows that the seek took effect,
    // also when the point itself is no record (a transaction marker).
    CHECK(PartitionLedger::admit(&ps, 11) == Admission::take);
    CHECK(ps.rewind.resume_from == -1);
    CHECK_FALSE(ps.rewind.needs_seek);
    CHECK(PartitionLedger::admit(&ps, 3) == Admission::take); // no rewind pending: not the ledger's to judge
}

TEST_CASE("ledger: holds keep the earliest offset and the most failures", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& a = ledger.assign({"t", 0});
    auto& b = ledger.assign({"t", 1});
    Holds h;
    h.add(&a, 10, 0);
    h.add(&a, 7, 0);
    h.add(&a, 12, 3);
    Holds other;
    other.add(&b, 4, 1);
    h.merge(other);
    CHECK(h.covers(&a, 7));
    CHECK(h.covers(&a, 100));
    CHECK_FALSE(h.covers(&a, 6));
    CHECK(h.covers(&b, 4));
    CHECK_FALSE(h.covers(&b, 3));

    const auto t0 = Clock::now();
    const auto actions = ledger.apply(h, t0);
    REQUIRE(actions.size() == 2);
    CHECK(a.rewind.resume_from == 7);
    CHECK(a.rewind.paused);
    CHECK(a.rewind.resume_at == t0 + milliseconds(400)); // third failure: 100, 200, 400
    CHECK(b.rewind.resume_from == 4);
    CHECK(b.rewind.resume_at == t0 + milliseconds(100));
    for (const auto& act : actions)
        CHECK(act.pause);
}

TEST_CASE("ledger: seeks are due until sent, paused partitions resume after their backoff", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& ps = ledger.assign({"t", 0});
    Holds h;
    h.add(&ps, 5, 1);
    const auto t0 = Clock::now();
    ledger.apply(h, t0);

    auto due = ledger.due(t0 + milliseconds(500));
    CHECK(due.seek == std::vector<PartitionState*>{&ps});
    CHECK(due.resume.empty()); // not before its seek was sent
    PartitionLedger::seek_sent(ps);
    due = ledger.due(t0 + milliseconds(50));
    CHECK(due.seek.empty());
    CHECK(due.resume.empty()); // backoff (100 ms) not over
    due = ledger.due(t0 + milliseconds(100));
    CHECK(due.resume == std::vector<PartitionState*>{&ps});
    CHECK_FALSE(ps.rewind.paused);
    CHECK(ledger.due(t0 + milliseconds(200)).resume.empty()); // once

    // A seek whose call failed: sent again, unless the rewound record arrived.
    PartitionLedger::rewind(ps, 8);
    CHECK(ledger.due(t0).seek.size() == 1);
    CHECK(PartitionLedger::admit(&ps, 8) == Admission::take);
    CHECK(ledger.due(t0).seek.empty());
}

TEST_CASE("ledger: commits hand over moved positions once, and again after a failure", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& a = ledger.assign({"t", 0});
    ledger.assign({"t", 1});
    CHECK(ledger.take_commits(nullptr).empty()); // nothing processed

    ledger.complete(a, 4);
    ledger.complete(a, 2); // out of order: the position never goes back
    auto c = ledger.take_commits(nullptr);
    REQUIRE(c.size() == 1);
    CHECK(c[0].tp == TopicPartition{"t", 0});
    CHECK(c[0].offset == 5);
    CHECK(c[0].metadata.empty());
    CHECK(ledger.take_commits(nullptr).empty());

    ledger.commit_failed("t", 0, 4); // an older commit's failure changes nothing
    CHECK(ledger.take_commits(nullptr).empty());
    ledger.commit_failed("t", 0, 5);
    CHECK(ledger.take_commits(nullptr).size() == 1);

    ledger.complete(a, 9);
    std::set<TopicPartition> only{{"t", 1}};
    CHECK(ledger.take_commits(&only).empty());
    CHECK(ledger.take_commits(nullptr).at(0).offset == 10);
}

TEST_CASE("ledger: failures travel with the commit's metadata and are inherited from it", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& a = ledger.assign({"t", 0});
    a.lag.start_offset = 10; // committed at the assignment
    a.lag.start_known = true;
    CHECK(ledger.take_commits(nullptr).empty()); // nothing processed, nothing failed

    // A failure with nothing processed yet: the start offset goes again, with it.
    CHECK(ledger.count_failure(a, 12) == 1);
    auto c = ledger.take_commits(nullptr);
    REQUIRE(c.size() == 1);
    CHECK(c[0].offset == 10);
    CHECK(c[0].metadata == "idemkafka.failures=12:1");
    CHECK(ledger.take_commits(nullptr).empty()); // sent

    ledger.count_failure(a, 12);
    ledger.count_failure(a, 15);
    ledger.complete(a, 10);
    ledger.complete(a, 11);
    c = ledger.take_commits(nullptr);
    REQUIRE(c.size() == 1);
    CHECK(c[0].offset == 12);
    CHECK(c[0].metadata == "idemkafka.failures=12:2,15:1");

    // A failed commit sends the failures again.
    ledger.commit_failed("t", 0, 12);
    REQUIRE(ledger.take_commits(nullptr).size() == 1);

    // Dead-lettered: it leaves the metadata, which changes, so it goes again.
    ledger.dead_lettered(a, 12);
    c = ledger.take_commits(nullptr);
    REQUIRE(c.size() == 1);
    CHECK(c[0].metadata == "idemkafka.failures=15:1");

    // The next owner: counts at or after its committed offset, the larger one kept.
    auto next = make_ledger();
    auto& b = next.assign({"t", 0});
    next.count_failure(b, 15);
    next.count_failure(b, 15);
    CHECK(next.inherit_failures(b, parse_failures_metadata("idemkafka.failures=3:4,15:1,16:3"), 12) == 2);
    CHECK(next.attempt_of(b, 3) == 1); // before the committed offset: settled
    CHECK(next.attempt_of(b, 15) == 3);
    CHECK(next.attempt_of(b, 16) == 4);
}

TEST_CASE("ledger: failures metadata: written within its bound, foreign or damaged metadata ignored", "[unit][ledger]")
{
    CHECK(failures_metadata({}, 0).empty());
    CHECK(failures_metadata({{5, 2}}, 6).empty());
    CHECK(failures_metadata({{5, 2}, {7, 1}}, 5) == "idemkafka.failures=5:2,7:1");
    std::map<std::int64_t, int> many;
    for (std::int64_t o = 0; o < 1000; ++o)
        many[1000000000000 + o] = 3;
    const auto text = failures_metadata(many, 0);
    CHECK(text.size() <= 1000);
    const auto back = parse_failures_metadata(text);
    CHECK(!back.empty());
    CHECK(back.begin()->first == 1000000000000); // the lowest offsets first
    CHECK(back.size() < many.size());

    CHECK(parse_failures_metadata("").empty());
    CHECK(parse_failures_metadata("someone else's metadata").empty());
    CHECK(parse_failures_metadata("idemkafka.failures=").empty());
    CHECK(parse_failures_metadata("idemkafka.failures=x:1,5:y,-3:2,4:0,9:2,,11") ==
          std::map<std::int64_t, int>{{9, 2}});
}

TEST_CASE("ledger: failures, dead letters and what a revoke leaves", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& ps = ledger.assign({"t", 0});
    CHECK(ledger.attempt_of(ps, 3) == 1);
    CHECK(ledger.count_failure(ps, 3) == 1);
    CHECK(ledger.count_failure(ps, 3) == 2);
    CHECK(ledger.attempt_of(ps, 3) == 3);

    CHECK(ledger.history_of(ps, 3).failures == 2);
    CHECK(ledger.dead_letter_refused(ps, 3, DeadLetterReason::handler_failed, "boom", 2) == 1);
    CHECK(ledger.dead_letter_refused(ps, 3, DeadLetterReason::handler_failed, "boom", 2) == 2);
    const auto refused = ledger.history_of(ps, 3);
    CHECK_FALSE(refused.dead_lettered);
    REQUIRE(refused.due);
    CHECK(refused.due->error == "boom");
    CHECK(refused.due->attempts == 2);
    CHECK(refused.due->refusals == 2);
    CHECK(refused.failures == 2);

    ledger.dead_lettered(ps, 3);
    const auto settled = ledger.history_of(ps, 3);
    CHECK(settled.dead_lettered);
    CHECK_FALSE(settled.due);
    CHECK(ps.failures.empty());
    ledger.complete(ps, 3);
    ledger.trim(ps);
    CHECK(ps.dead_letters.acknowledged.empty()); // behind the position: forgotten

    // A second assignment of the same partition starts from nothing.
    ledger.count_failure(ps, 7);
    ledger.revoke({{"t", 0}});
    CHECK(ledger.find("t", 0) == nullptr);
    CHECK(ledger.empty());
    auto& again = ledger.assign({"t", 0});
    CHECK(again.failures.empty());
    CHECK(again.processed_next == -1);
}

TEST_CASE("ledger: a fenced partition waits a growing backoff, once at a time, then is taken over", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& ps = ledger.assign({"t", 0});
    const auto t0 = Clock::now();
    auto wait = ledger.fence({"t", 0}, t0);
    REQUIRE(wait);
    CHECK(*wait == milliseconds(1000));
    CHECK_FALSE(ledger.fence({"t", 0}, t0)); // already waiting
    CHECK_FALSE(ledger.fence({"t", 9}, t0)); // not ours
    auto due = ledger.due(t0 + milliseconds(1000));
    REQUIRE(due.resume.size() == 1);
    CHECK_FALSE(ps.stored.verified); // verified (taken over) before it runs again
    wait = ledger.fence({"t", 0}, t0);
    REQUIRE(wait);
    CHECK(*wait == milliseconds(2000));
    ledger.complete(ps, 0);
    CHECK(ps.stored.fenced == 0); // a success ends the run of refusals
}

// Random sequences of batches, failures, give-backs, worker splits, rewinds,
// revokes and re-assigns, carried out as the engine does; after every step
// the position (and every commit) must be behind every unfinished record,
// no offset may be skipped, and a revoked partition leaves no state. At the
// end, with failures stopped, every record must be finished.
TEST_CASE("ledger: randomized batches never commit past an unfinished record", "[unit][ledger]")
{
    constexpr int partitions = 3;
    constexpr std::int64_t records = 60;
    constexpr int keys = 4;
    for (unsigned seed = 1; seed <= 300; ++seed) {
        INFO("seed " << seed);
        std::mt19937 rng(seed);
        auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
        const std::size_t workers = 1 + rng() % 3;
        const bool by_key = chance(50);

        auto ledger = make_ledger();
        std::map<int, std::set<std::int64_t>> effected; // committed in "PostgreSQL"
        std::map<int, std::int64_t> kafka_committed;    // the group's committed offset
        std::map<int, std::int64_t> fetch;              // next offset the broker hands out
        std::map<int, bool> paused, assigned;
        // Ordering::key parking, as the engine keeps it: records of a held
        // key by partition (offset -> key), out of the fetch order.
        std::map<int, std::map<std::int64_t, int>> parked;
        auto now = Clock::now();
        auto tp_of = [](int p) { return TopicPartition{"t", p}; };
        auto key_of = [](std::int64_t offset) { return static_cast<int>(offset % keys); };

        auto do_assign = [&](int p) {
            ledger.assign(tp_of(p));
            assigned[p] = true;
            paused[p] = false;
            fetch[p] = kafka_committed.count(p) ? kafka_committed[p] : 0;
        };
        auto check_invariants = [&] {
            for (int p = 0; p < partitions; ++p) {
                auto* ps = ledger.find("t", p);
                if (!assigned[p]) {
                    REQUIRE(ps == nullptr);
                    continue;
                }
                REQUIRE(ps != nullptr);
                for (std::int64_t o = 0; o < ps->position(); ++o)
                    REQUIRE(effected[p].count(o)); // nothing behind the position is unfinished
                for (const auto& [o, key] : parked[p])
                    REQUIRE(ps->parked.count(o)); // the position stays at or before every parked record
                for (std::int64_t o = 0; o < kafka_committed[p]; ++o)
                    REQUIRE(effected[p].count(o));
            }
        };
        auto commit = [&](const std::set<TopicPartition>* only, bool failures = true) {
            for (const auto& [tp, offset, metadata] : ledger.take_commits(only)) {
                if (failures && chance(10)) {
                    ledger.commit_failed(tp.topic, tp.partition, offset);
                    continue;
                }
                kafka_committed[tp.partition] = offset;
            }
        };
        for (int p = 0; p < partitions; ++p)
            do_assign(p);

        auto run_batch = [&](bool failures) {
            // Poll: up to 12 records per partition from its fetch position;
            // now and then a stale record from before a rewind.
            struct Rec {
                PartitionState* ps;
                int p;
                std::int64_t offset;
            };
            std::vector<Rec> batch;
            for (int p = 0; p < partitions; ++p) {
                if (!assigned[p] || paused[p])
                    continue;
                auto* ps = ledger.find("t", p);
                if (ps->rewind.resume_from > 0 && chance(30)) {
                    const std::int64_t stale = rng() % ps->rewind.resume_from;
                    REQUIRE(PartitionLedger::admit(ps, stale) == Admission::stale);
                }
                const std::int64_t n = rng() % 13;
                for (std::int64_t k = 0; k < n && fetch[p] < records; ++k) {
                    const std::int64_t o = fetch[p]++;
                    if (PartitionLedger::admit(ps, o) == Admission::take)
                        batch.push_back({ps, p, o});
                }
            }
            std::shuffle(batch.begin(), batch.end(), rng); // the client interleaves partitions
            std::stable_sort(batch.begin(), batch.end(),
                             [](const Rec& a, const Rec& b) { return a.p != b.p ? a.p < b.p : a.offset < b.offset; });
            // Parked keys whose backoff is over run again, ahead of what was
            // fetched (a fetched record of a parked key is parked with it).
            std::set<std::pair<int, int>> due_keys;
            for (auto& [p, recs] : parked)
                for (const auto& [o, key] : recs)
                    if (!failures || chance(40))
                        due_keys.insert({p, key});
            std::vector<Rec> again;
            for (auto& [p, recs] : parked)
                for (auto r = recs.begin(); r != recs.end();) {
                    if (due_keys.count({p, r->second})) {
                        again.push_back({ledger.find("t", p), p, r->first});
                        r = recs.erase(r);
                    } else {
                        ++r;
                    }
                }
            for (auto r = batch.begin(); r != batch.end();) {
                const bool waits = parked[r->p].size() > 0 &&
                                   std::any_of(parked[r->p].begin(), parked[r->p].end(),
                                               [&](const auto& pk) { return pk.second == key_of(r->offset); });
                if (waits) {
                    parked[r->p][r->offset] = key_of(r->offset);
                    PartitionLedger::park(*r->ps, r->offset);
                    r = batch.erase(r);
                } else {
                    ++r;
                }
            }
            batch.insert(batch.begin(), again.begin(), again.end());
            // Split over the workers as the engine does; each worker's
            // transaction either commits its records up to a hold, or fails.
            std::vector<std::vector<Rec>> share(workers);
            for (const auto& r : batch)
                share[static_cast<std::size_t>(by_key ? key_of(r.offset) : r.p) % workers].push_back(r);
            Holds merged;
            for (auto& mine : share) {
                Holds holds;
                const bool db_failed = failures && chance(8);
                auto key_text = [&](const Rec& r) { return std::to_string(key_of(r.offset)); };
                if (failures && !mine.empty() && chance(25)) {
                    // A handler failure (or a give-back at the time budget):
                    // held from that record on, in its partition; with
                    // per-key ordering a handler failure parks only its key.
                    const auto& r = mine[rng() % mine.size()];
                    if (by_key && chance(60))
                        holds.park(r.ps, key_text(r), r.offset, 1 + static_cast<int>(rng() % 3));
                    else
                        holds.add(r.ps, r.offset, chance(50) ? 1 + static_cast<int>(rng() % 3) : 0);
                }
                for (const auto& r : mine) {
                    if (db_failed)
                        holds.add(r.ps, r.offset, 0); // nothing of it committed
                    else if (!holds.covers(r.ps, r.offset, key_text(r)))
                        effected[r.p].insert(r.offset);
                }
                merged.merge(holds);
            }
            for (const auto& act : ledger.apply(merged, now)) {
                auto& mine = parked[act.ps->tp.partition]; // what the rewind brings again
                mine.erase(mine.lower_bound(act.ps->rewind.resume_from), mine.end());
                fetch[act.ps->tp.partition] = act.ps->rewind.resume_from; // the seek
                PartitionLedger::seek_sent(*act.ps);
                if (act.pause)
                    paused[act.ps->tp.partition] = true;
            }
            for (const auto& r : batch) {
                if (merged.covers(r.ps, r.offset))
                    continue;
                if (merged.covers(r.ps, r.offset, std::to_string(key_of(r.offset)))) {
                    parked[r.p][r.offset] = key_of(r.offset);
                    PartitionLedger::park(*r.ps, r.offset);
                    continue;
                }
                ledger.complete(*r.ps, r.offset);
            }
            check_invariants();
        };

        for (int step = 0; step < 120; ++step) {
            const int what = static_cast<int>(rng() % 100);
            if (what < 60) {
                run_batch(true);
            } else if (what < 75) {
                commit(nullptr);
            } else if (what < 85) {
                now += milliseconds(rng() % 600);
                for (auto* ps : ledger.due(now).resume)
                    paused[ps->tp.partition] = false;
            } else if (what < 95) {
                const int p = static_cast<int>(rng() % partitions);
                if (assigned[p]) {
                    std::set<TopicPartition> revoked{tp_of(p)};
                    if (chance(70)) // a revoke commits first; a lost assignment does not
                        commit(&revoked);
                    ledger.revoke(revoked);
                    parked.erase(p);
                    assigned[p] = false;
                }
            } else {
                for (int p = 0; p < partitions; ++p)
                    if (!assigned[p])
                        do_assign(p);
            }
            check_invariants();
        }
        // Failures stop: everything gets finished and committed.
        for (int p = 0; p < partitions; ++p)
            if (!assigned[p])
                do_assign(p);
        for (int round = 0; round < 200; ++round) {
            now += milliseconds(1000);
            for (auto* ps : ledger.due(now).resume)
                paused[ps->tp.partition] = false;
            run_batch(false);
        }
        commit(nullptr, false);
        for (int p = 0; p < partitions; ++p) {
            INFO("partition " << p);
            // Committed in Kafka to the end (by this assignment, or by an
            // earlier one when this one found nothing left to process).
            CHECK(kafka_committed[p] == records);
            CHECK(effected[p].size() == static_cast<std::size_t>(records));
        }
    }
}

// Continuous dispatch (issue 27): units of work are handed to free workers
// as they come (a partition, or a key of it, in one unit at a time) and
// merged in whatever order they finish. The committed position must still
// never pass a record whose unit has not been merged, across handler
// failures (partition holds and, by key, parked keys), failed transactions,
// rewinds that overtake running units, commits and revokes.
TEST_CASE("ledger: units merged out of order never commit past an unfinished record", "[unit][ledger]")
{
    constexpr int partitions = 2;
    constexpr std::int64_t records = 80;
    constexpr int keys = 4;
    for (unsigned seed = 1; seed <= 300; ++seed) {
        INFO("seed " << seed);
        std::mt19937 rng(seed);
        auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
        const std::size_t workers = 1 + rng() % 4;
        const bool by_key = chance(50);

        struct Rec {
            int p;
            std::int64_t offset;
            bool dropped = false; // a rewind overtook it while it ran: it comes again
        };
        auto ledger = make_ledger();
        auto now = Clock::now();
        std::map<int, std::set<std::int64_t>> effected;
        std::map<int, std::int64_t> kafka_committed, fetch;
        std::map<int, bool> paused, assigned;
        std::map<int, std::map<std::int64_t, int>> parked; // by partition: offset -> key
        std::vector<Rec> waiting;                          // polled, not dispatched, in poll order
        std::vector<std::vector<Rec>> units;               // in flight, one per busy worker
        auto key_of = [](std::int64_t offset) { return static_cast<int>(offset % keys); };
        auto lane_of = [&](const Rec& r) { return std::make_pair(r.p, by_key ? key_of(r.offset) : -1); };
        auto ps_of = [&](int p) { return ledger.find("t", p); };
        auto do_assign = [&](int p) {
            ledger.assign(TopicPartition{"t", p});
            assigned[p] = true;
            paused[p] = false;
            fetch[p] = kafka_committed.count(p) ? kafka_committed[p] : 0;
        };
        for (int p = 0; p < partitions; ++p)
            do_assign(p);

        auto check_invariants = [&] {
            for (int p = 0; p < partitions; ++p) {
                if (!assigned[p])
                    continue;
                for (std::int64_t o = 0; o < ps_of(p)->position(); ++o)
                    REQUIRE(effected[p].count(o));
                for (std::int64_t o = 0; o < kafka_committed[p]; ++o)
                    REQUIRE(effected[p].count(o));
            }
        };
        auto poll = [&] {
            for (int p = 0; p < partitions; ++p) {
                if (!assigned[p] || paused[p])
                    continue;
                const std::int64_t n = rng() % 9;
                for (std::int64_t k = 0; k < n && fetch[p] < records; ++k) {
                    const std::int64_t o = fetch[p]++;
                    if (PartitionLedger::admit(ps_of(p), o) != Admission::take)
                        continue;
                    if (by_key && std::any_of(parked[p].begin(), parked[p].end(),
                                              [&](const auto& pk) { return pk.second == key_of(o); })) {
                        parked[p][o] = key_of(o);
                        PartitionLedger::park(*ps_of(p), o);
                        continue;
                    }
                    PartitionLedger::take(*ps_of(p), o);
                    waiting.push_back({p, o});
                }
            }
        };
        // A free worker takes, in poll order, the records whose partition
        // (or key) no other unit has; a lane it cannot take blocks the rest
        // of that lane, so order within it holds. What waits stays taken in
        // the ledger (since the poll), as what runs does.
        auto dispatch = [&] {
            while (units.size() < workers && !waiting.empty()) {
                std::set<std::pair<int, int>> busy, blocked;
                for (const auto& u : units)
                    for (const auto& r : u)
                        busy.insert(lane_of(r));
                std::vector<Rec> unit, rest;
                for (const auto& r : waiting) {
                    const auto lane = lane_of(r);
                    if (busy.count(lane) || blocked.count(lane) || unit.size() >= 10) {
                        blocked.insert(lane);
                        rest.push_back(r);
                        continue;
                    }
                    unit.push_back(r);
                }
                if (unit.empty())
                    return;
                waiting = std::move(rest);
                units.push_back(std::move(unit));
            }
        };
        auto rewound = [&](const PartitionLedger::Action& act) {
            const int p = act.ps->tp.partition;
            const auto from = act.ps->rewind.resume_from;
            auto& mine = parked[p];
            mine.erase(mine.lower_bound(from), mine.end());
            waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                         [&](const Rec& r) { return r.p == p && r.offset >= from; }),
                          waiting.end());
            for (auto& u : units) // running: their outcome no longer counts
                for (auto& r : u)
                    if (r.p == p && r.offset >= from)
                        r.dropped = true;
            fetch[p] = from;
            PartitionLedger::seek_sent(*act.ps);
            if (act.pause)
                paused[p] = true;
        };
        // One unit's outcome, merged on its own as the engine would.
        auto finish = [&](std::size_t n, bool failures) {
            const std::vector<Rec> unit = std::move(units[n]);
            units.erase(units.begin() + static_cast<std::ptrdiff_t>(n));
            Holds holds;
            auto key_text = [&](const Rec& r) { return std::to_string(key_of(r.offset)); };
            // A record a rewind overtook is not this unit's to hold: a hold
            // at or past the rewind point would move it forward over
            // records that come again (the engine skips such holds too).
            std::vector<Rec> live;
            std::copy_if(unit.begin(), unit.end(), std::back_inserter(live), [](const Rec& r) { return !r.dropped; });
            const bool db_failed = failures && chance(8);
            if (failures && !db_failed && !live.empty() && chance(25)) {
                const auto& r = live[rng() % live.size()];
                if (by_key && chance(60))
                    holds.park(ps_of(r.p), key_text(r), r.offset, 1 + static_cast<int>(rng() % 3));
                else
                    holds.add(ps_of(r.p), r.offset, chance(50) ? 1 + static_cast<int>(rng() % 3) : 0);
            }
            for (const auto& r : unit) {
                if (db_failed && !r.dropped)
                    holds.add(ps_of(r.p), r.offset, 0);
                else if (!db_failed && !holds.covers(ps_of(r.p), r.offset, key_text(r)))
                    effected[r.p].insert(r.offset); // committed, dropped or not: the worker cannot know
            }
            for (const auto& act : ledger.apply(holds, now))
                rewound(act);
            for (const auto& [lane, h] : holds.keys()) { // later records of a parked key wait with it
                const int p = lane.first->tp.partition;
                for (auto r = waiting.begin(); r != waiting.end();) {
                    if (r->p == p && std::to_string(key_of(r->offset)) == *lane.second && r->offset > h.offset) {
                        parked[p][r->offset] = key_of(r->offset);
                        PartitionLedger::park(*ps_of(p), r->offset);
                        r = waiting.erase(r);
                    } else {
                        ++r;
                    }
                }
            }
            for (const auto& r : unit) {
                auto* ps = ps_of(r.p);
                if (r.dropped || holds.covers(ps, r.offset)) {
                    PartitionLedger::drop(*ps, r.offset);
                } else if (holds.covers(ps, r.offset, key_text(r))) {
                    parked[r.p][r.offset] = key_of(r.offset);
                    PartitionLedger::park(*ps, r.offset);
                } else {
                    ledger.complete(*ps, r.offset);
                }
            }
        };
        auto commit = [&](const std::set<TopicPartition>* only, bool failures) {
            for (const auto& [tp, offset, metadata] : ledger.take_commits(only)) {
                if (failures && chance(10))
                    ledger.commit_failed(tp.topic, tp.partition, offset);
                else
                    kafka_committed[tp.partition] = offset;
            }
        };
        auto unpark_due = [&](bool all) {
            std::vector<Rec> again;
            for (auto& [p, recs] : parked) {
                std::set<int> due;
                for (const auto& [o, key] : recs)
                    if (all || chance(40))
                        due.insert(key);
                for (auto r = recs.begin(); r != recs.end();) {
                    if (due.count(r->second)) {
                        again.push_back({p, r->first});
                        r = recs.erase(r);
                    } else {
                        ++r;
                    }
                }
            }
            waiting.insert(waiting.begin(), again.begin(), again.end());
        };
        auto step = [&](bool failures) {
            const int what = static_cast<int>(rng() % 100);
            if (what < 25) {
                poll();
            } else if (what < 35) {
                unpark_due(!failures);
            } else if (what < 50) {
                dispatch();
            } else if (what < 75) {
                if (!units.empty())
                    finish(rng() % units.size(), failures);
            } else if (what < 85) {
                commit(nullptr, failures);
            } else if (what < 93) {
                now += milliseconds(rng() % 600);
                for (auto* ps : ledger.due(now).resume)
                    paused[ps->tp.partition] = false;
            } else if (failures) {
                // A revoke waits for the units that touch the partition.
                const int p = static_cast<int>(rng() % partitions);
                if (!assigned[p])
                    return;
                for (std::size_t n = units.size(); n-- > 0;)
                    if (std::any_of(units[n].begin(), units[n].end(), [&](const Rec& r) { return r.p == p; }))
                        finish(n, failures);
                std::set<TopicPartition> revoked{TopicPartition{"t", p}};
                if (chance(70))
                    commit(&revoked, failures);
                ledger.revoke(revoked);
                parked.erase(p);
                waiting.erase(std::remove_if(waiting.begin(), waiting.end(), [&](const Rec& r) { return r.p == p; }),
                              waiting.end());
                assigned[p] = false;
                if (chance(50))
                    do_assign(p);
            }
        };
        for (int i = 0; i < 400; ++i) {
            step(true);
            check_invariants();
        }
        for (int p = 0; p < partitions; ++p)
            if (!assigned[p])
                do_assign(p);
        // Failures stop: everything gets finished (each step checked until then).
        auto finished = [&] {
            for (int p = 0; p < partitions; ++p)
                if (ps_of(p)->position() != records)
                    return false;
            return true;
        };
        for (int i = 0; i < 4000 && !finished(); ++i) {
            step(false);
            check_invariants();
        }
        while (!units.empty())
            finish(0, false);
        commit(nullptr, false);
        for (int p = 0; p < partitions; ++p) {
            INFO("partition " << p);
            CHECK(kafka_committed[p] == records);
            CHECK(effected[p].size() == static_cast<std::size_t>(records));
            CHECK(ps_of(p)->in_flight.empty());
        }
    }
}

TEST_CASE("ledger: a taken offset holds the position until its outcome is merged", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& ps = ledger.assign(TopicPartition{"t", 0});
    for (std::int64_t o = 0; o < 6; ++o)
        PartitionLedger::take(ps, o);
    // Records 3..5 (another key's unit) finish before 0..2.
    for (std::int64_t o = 3; o < 6; ++o)
        ledger.complete(ps, o);
    CHECK(ps.processed_next == 6);
    CHECK(ps.position() == 0);
    ledger.complete(ps, 0);
    ledger.complete(ps, 1);
    CHECK(ps.position() == 2);
    // Record 2 is given back: it comes again and no longer holds the position.
    PartitionLedger::drop(ps, 2);
    CHECK(ps.position() == 6);

    // A rewind overtakes running records at and after its point.
    for (std::int64_t o = 6; o < 10; ++o)
        PartitionLedger::take(ps, o);
    ledger.complete(ps, 6);
    PartitionLedger::rewind(ps, 8);
    CHECK(ps.in_flight.size() == 1);
    CHECK(ps.in_flight.contains(7));
    CHECK(ps.position() == 7);
    // A parked record leaves the running set for the parked one.
    PartitionLedger::park(ps, 7);
    CHECK(ps.in_flight.empty());
    CHECK(ps.position() == 7);
    ledger.complete(ps, 7);
    CHECK(ps.position() == 8);
}

TEST_CASE("ledger: forgive_failures() starts every record's attempts again", "[unit][ledger]")
{
    auto ledger = make_ledger();
    auto& a = ledger.assign({"t", 0});
    auto& b = ledger.assign({"t", 1});
    ledger.count_failure(a, 3);
    ledger.count_failure(a, 3);
    ledger.count_failure(b, 7);
    CHECK(ledger.attempt_of(a, 3) == 3);
    ledger.forgive_failures();
    CHECK(ledger.attempt_of(a, 3) == 1);
    CHECK(ledger.attempt_of(b, 7) == 1);
    CHECK(ledger.count_failure(a, 3) == 1);
}

TEST_CASE("offset set: the lowest, the ends and a sorted insert", "[unit][ledger]")
{
    OffsetSet s;
    CHECK(s.empty());
    CHECK_FALSE(s.erase(3));
    for (std::int64_t o = 10; o < 20; ++o)
        s.insert(o);
    CHECK(s.size() == 10);
    CHECK(s.lowest() == 10);
    // Settled in order from the front, and out of order behind it.
    CHECK(s.erase(10));
    CHECK(s.erase(12));
    CHECK_FALSE(s.erase(12));
    CHECK(s.lowest() == 11);
    CHECK(s.erase(11));
    CHECK(s.lowest() == 13); // 12 went before
    CHECK_FALSE(s.contains(12));
    CHECK(s.contains(13));
    // Out of order and twice: as a std::set.
    s.insert(5);
    s.insert(15);
    s.insert(12);
    CHECK(s.lowest() == 5);
    CHECK(s.size() == 9);
    // A rewind: everything from 14 on goes.
    s.erase_from(14);
    CHECK(s.size() == 3);
    CHECK(s.contains(5));
    CHECK(s.contains(12));
    CHECK(s.contains(13));
    s.erase_from(0);
    CHECK(s.empty());
    s.insert(100); // after it emptied: starts over
    CHECK(s.lowest() == 100);
    CHECK(s.size() == 1);
}

TEST_CASE("offset set: randomized against std::set", "[unit][ledger]")
{
    for (std::uint32_t seed = 1; seed <= 50; ++seed) {
        INFO("seed " << seed);
        std::mt19937 rng(seed);
        auto chance = [&](int in) { return std::uniform_int_distribution<int>(0, in - 1)(rng) == 0; };
        OffsetSet s;
        std::set<std::int64_t> model;
        std::int64_t next = 0; // the next offset polled
        for (int step = 0; step < 3000; ++step) {
            if (chance(60)) {
                const auto from = next - std::uniform_int_distribution<std::int64_t>(0, 40)(rng);
                s.erase_from(from); // a rewind
                model.erase(model.lower_bound(from), model.end());
                next = std::max<std::int64_t>(0, from);
            } else if (chance(2)) {
                auto o = next++;
                if (chance(30)) // out of order, maybe one held already
                    o = std::max<std::int64_t>(0, o - std::uniform_int_distribution<std::int64_t>(0, 50)(rng));
                s.insert(o);
                model.insert(o);
            } else if (!model.empty()) {
                // Mostly the lowest, else any (or one not held).
                auto o = *model.begin();
                if (chance(4))
                    o = *std::next(model.begin(), std::uniform_int_distribution<std::ptrdiff_t>(
                                                      0, static_cast<std::ptrdiff_t>(model.size()) - 1)(rng));
                if (chance(20))
                    o = std::uniform_int_distribution<std::int64_t>(0, next + 5)(rng);
                REQUIRE(s.erase(o) == (model.erase(o) > 0));
            }
            REQUIRE(s.size() == model.size());
            REQUIRE(s.empty() == model.empty());
            if (!model.empty())
                REQUIRE(s.lowest() == *model.begin());
            const auto probe = std::uniform_int_distribution<std::int64_t>(0, next + 5)(rng);
            REQUIRE(s.contains(probe) == (model.count(probe) > 0));
        }
    }
}

TEST_CASE("ledger: find by a view of the topic; a retired state is not owned", "[unit][ledger]")
{
    auto ledger = make_ledger();
    const std::string topic = "a-topic-name-longer-than-a-short-string";
    auto& a = ledger.assign({topic, 0});
    auto& b = ledger.assign({topic, 1});
    auto& c = ledger.assign({"other", 0});
    CHECK(ledger.find(std::string_view(topic), 0) == &a);
    CHECK(ledger.find(std::string_view(topic), 1) == &b);
    CHECK(ledger.find("other", 0) == &c);
    CHECK(ledger.find("other", 1) == nullptr);
    CHECK(ledger.find(std::string_view(topic).substr(1), 0) == nullptr);
    CHECK(PartitionLedger::owns(&a));
    ledger.revoke({TopicPartition{topic, 0}}, true);
    CHECK_FALSE(PartitionLedger::owns(&a)); // retired: still in memory, owned by no one
    CHECK(ledger.find(std::string_view(topic), 0) == nullptr);
    auto& again = ledger.assign({topic, 0});
    CHECK(&again != &a);
    CHECK(PartitionLedger::owns(&again));
    CHECK_FALSE(PartitionLedger::owns(&a));
    CHECK(PartitionLedger::owns(&b));
    ledger.release_retired();
}
