// The claim transaction's pieces that need no PostgreSQL (claim_parts.hpp,
// worker.hpp): which records an attempt claims and in what order, the
// positions a commit stores, the records a reused event id sends to the dead
// letter, the circuit breaker's key of a record, what an exception that ended
// a transaction means, whether a handler's exception is retried, the watch
// over the running handler call, and a worker's reset between batches.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <pqxx/pqxx>

#include <idemkafka/error.hpp>

#include "catch_compat.hpp"
#include "consumer/claim_parts.hpp"
#include "consumer/worker.hpp"
#include "core/fingerprint.hpp"
#include "core/ledger.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;
using std::chrono::milliseconds;

namespace {

// Partitions to hang records on, and the records of one batch.
struct Records {
    PartitionLedger ledger{Backoff{milliseconds(10), milliseconds(100)}, Backoff{milliseconds(10), milliseconds(100)}};
    PartitionState& p0 = ledger.assign({"orders", 0});
    PartitionState& p1 = ledger.assign({"orders", 1});
    std::vector<std::string> keys;     // stable storage for the records' views
    std::vector<std::string> payloads; // (reserved: views must not move)
    std::vector<Item> items;

    Records()
    {
        keys.reserve(64);
        payloads.reserve(64);
        items.reserve(64);
    }

    // A record of `ps` at `offset` with event id `id`; returns its index.
    std::size_t add(PartitionState& ps, std::int64_t offset, EventId id, std::string payload = "p",
                    std::optional<std::string> key = std::nullopt)
    {
        Item it;
        it.record.topic = "orders";
        it.record.partition = &ps == &p0 ? 0 : 1;
        it.record.offset = offset;
        payloads.push_back(std::move(payload));
        it.record.value = std::string_view(payloads.back());
        if (key) {
            keys.push_back(*key);
            it.record.key = std::string_view(keys.back());
        }
        it.id = id;
        it.part = &ps;
        items.push_back(std::move(it));
        return items.size() - 1;
    }
};

// `w`'s share: every record of `r`.
void share_all(const Records& r, BatchOutcome& w)
{
    for (std::size_t i = 0; i < r.items.size(); ++i)
        w.items.push_back(i);
}

// serialization_failure and deadlock_detected take the query too on libpqxx 7, only the text on 6.
template <class E> E rollback(const char* what)
{
    if constexpr (std::is_constructible_v<E, std::string, std::string>)
        return E(what, "");
    else
        return E(what);
}

template <class E> ClaimTransaction::Fault fault_of(E e, bool in_handler = false)
{
    return classify(std::make_exception_ptr(std::move(e)), in_handler).fault;
}

} // namespace

TEST_CASE("collect: pending records not held, each id once, claimed in id order", "[claim]")
{
    Records r;
    const EventId a = new_event_id(), b = new_event_id(), c = new_event_id(), d = new_event_id();
    r.add(r.p0, 10, b, "b1"); // 0
    r.add(r.p0, 11, a, "a1"); // 1
    r.add(r.p0, 12, b, "b2"); // 2: b again, its first record is 0
    r.add(r.p1, 20, c, "c1"); // 3: held below
    r.add(r.p1, 21, d, "d1"); // 4: not pending (done)
    r.items[4].state = ItemState::done;
    BatchOutcome w;
    share_all(r, w);
    w.holds.add(&r.p1, 20, 1);

    const auto attempt = collect(w, r.items, true);
    CHECK(attempt.active == 3); // 0, 1, 2: the held and the done one are not
    std::vector<EventId> sorted{a, b};
    std::sort(sorted.begin(), sorted.end());
    CHECK(attempt.ids == sorted);
    CHECK(attempt.first == std::vector<std::size_t>{0, 1}); // first record of each id, batch order
    REQUIRE(attempt.fingerprints.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
        const auto& first = r.items[sorted[k] == a ? 1 : 0];
        CHECK(attempt.fingerprints[k] == fingerprint_of(first)); // in id order
    }
    CHECK(attempt.current == ClaimTransaction::nobody);
    CHECK(attempt.claimed_override == SIZE_MAX);

    const auto without = collect(w, r.items, false);
    CHECK(without.fingerprints.empty());
    CHECK(without.ids == sorted);

    // A key hold (Ordering::key parking) stops only its key's records.
    Records keyed;
    keyed.add(keyed.p0, 1, new_event_id(), "x", std::string("k1"));
    keyed.add(keyed.p0, 2, new_event_id(), "y", std::string("k2"));
    BatchOutcome kw;
    share_all(keyed, kw);
    kw.holds.park(&keyed.p0, std::string_view("k1"), 1, 1);
    const auto parked = collect(kw, keyed.items, false);
    CHECK(parked.active == 1);
    CHECK(parked.first == std::vector<std::size_t>{1});
}

TEST_CASE("collect: a transaction's share of a unit, from a position on, and where it ends", "[claim]")
{
    Records r;
    std::vector<EventId> ids;
    for (int k = 0; k < 7; ++k)
        ids.push_back(new_event_id());
    r.add(r.p0, 10, ids[0]); // 0
    r.add(r.p1, 20, ids[1]); // 1: held below
    r.add(r.p0, 11, ids[2]); // 2
    r.add(r.p0, 12, ids[0]); // 3: ids[0] again
    r.add(r.p0, 13, ids[3]); // 4
    r.add(r.p0, 14, ids[4]); // 5
    r.add(r.p1, 21, ids[5]); // 6: held (its partition from 20 on)
    BatchOutcome w;
    share_all(r, w);
    w.holds.add(&r.p1, 20, 1);

    // Three records that are not held: 0, 2 and 3 (an id twice, claimed once).
    const auto head = collect(w, r.items, false, 3, 0);
    CHECK(head.from == 0);
    CHECK(head.end == 4); // past position 3, its last record
    CHECK(head.active == 3);
    CHECK(head.first == std::vector<std::size_t>{0, 2});
    CHECK(head.ids.size() == 2);
    // The next share starts where it ended and runs out before its limit.
    const auto rest = collect(w, r.items, false, 3, head.end);
    CHECK(rest.from == 4);
    CHECK(rest.end == 7);
    CHECK(rest.active == 2);
    CHECK(rest.first == std::vector<std::size_t>{4, 5});
    // No limit: the whole batch.
    const auto all = collect(w, r.items, false);
    CHECK(all.from == 0);
    CHECK(all.end == 7);
    CHECK(all.active == 5);
}

TEST_CASE("positions_of: the next offset per partition, past every record not held", "[claim]")
{
    Records r;
    r.p0.stored.epoch = 7;
    r.p1.stored.epoch = 9;
    r.add(r.p0, 10, new_event_id());
    r.add(r.p0, 12, new_event_id());
    r.add(r.p0, 11, new_event_id());
    r.add(r.p1, 30, new_event_id());
    r.add(r.p1, 31, new_event_id()); // held: not past it
    BatchOutcome w;
    share_all(r, w);
    w.holds.add(&r.p1, 31, 1);

    std::vector<std::pair<PartitionState*, std::int64_t>> of;
    const auto positions = positions_of(w, r.items, &of);
    REQUIRE(positions.size() == 2);
    REQUIRE(of.size() == 2);
    for (std::size_t k = 0; k < 2; ++k) {
        const auto& p = positions[k];
        CHECK(p.topic == "orders");
        if (p.partition == 0) {
            CHECK(p.next_offset == 13);
            CHECK(p.epoch == 7);
            CHECK(of[k] == std::make_pair(&r.p0, std::int64_t{13}));
        } else {
            CHECK(p.partition == 1);
            CHECK(p.next_offset == 31);
            CHECK(p.epoch == 9);
            CHECK(of[k] == std::make_pair(&r.p1, std::int64_t{31}));
        }
    }
    CHECK(positions_of(w, r.items, nullptr).size() == 2);

    // Up to a record (several transactions per unit): the later ones do
    // not move their partitions yet.
    const auto upto = positions_of(w, r.items, nullptr, 1);
    REQUIRE(upto.size() == 1);
    CHECK(upto[0].partition == 0);
    CHECK(upto[0].next_offset == 13);

    // Every record held: nothing to store.
    w.holds.add(&r.p0, 10, 1);
    w.holds.add(&r.p1, 30, 1);
    CHECK(positions_of(w, r.items, nullptr).empty());
}

TEST_CASE("mark_reused: an id claimed with another payload sends the record to the dead letter", "[claim]")
{
    Records r;
    const EventId fresh = new_event_id(), before = new_event_id(), same = new_event_id(), held = new_event_id();
    const auto first = r.add(r.p0, 1, fresh, "one");    // claimed now
    const auto again = r.add(r.p0, 2, fresh, "other");  // same id, other payload: reused in this transaction
    const auto twin = r.add(r.p0, 3, fresh, "one");     // same id and payload: a plain duplicate
    const auto older = r.add(r.p0, 4, before, "new");   // claimed before with another payload
    const auto equal = r.add(r.p0, 5, same, "same");    // claimed before with this payload
    const auto stopped = r.add(r.p1, 6, held, "moved"); // claimed before with another, but held
    BatchOutcome w;
    share_all(r, w);
    w.holds.add(&r.p1, 6, 1);

    std::unordered_map<EventId, PayloadReference> reference;
    reference.emplace(fresh, PayloadReference{fingerprint_of(r.items[first]), &r.items[first]});
    reference.emplace(before, PayloadReference{fingerprint("old"), nullptr});
    reference.emplace(same, PayloadReference{fingerprint("same"), nullptr});
    reference.emplace(held, PayloadReference{fingerprint("else"), nullptr});

    const auto reused = mark_reused(w, r.items, reference);
    REQUIRE(reused.size() == 2);
    CHECK(reused[0] == &r.items[again]);
    CHECK(reused[1] == &r.items[older]);
    for (const auto* it : reused) {
        CHECK(it->state == ItemState::poison);
        CHECK(it->reason == DeadLetterReason::event_id_reused);
    }
    CHECK(r.items[again].error.find("in the same transaction") != std::string::npos);
    CHECK(r.items[again].error.find(r.items[first].where()) != std::string::npos);
    CHECK(r.items[older].error.find("claimed before") != std::string::npos);
    for (const auto i : {first, twin, equal, stopped})
        CHECK(r.items[i].state == ItemState::pending);
}

TEST_CASE("mark_reused: only the records of the transaction's share of the unit", "[claim]")
{
    Records r;
    const EventId id = new_event_id();
    const auto first = r.add(r.p0, 1, id, "one");   // claimed by this transaction (positions 0-1)
    r.add(r.p0, 2, new_event_id(), "x");            // in this transaction too
    const auto later = r.add(r.p0, 3, id, "other"); // a later transaction's: met in its turn
    BatchOutcome w;
    share_all(r, w);
    std::unordered_map<EventId, PayloadReference> reference;
    reference.emplace(id, PayloadReference{fingerprint_of(r.items[first]), &r.items[first]});

    CHECK(mark_reused(w, r.items, reference, 0, 2).empty());
    CHECK(r.items[later].state == ItemState::pending);
    const auto reused = mark_reused(w, r.items, reference, 2, 3);
    REQUIRE(reused.size() == 1);
    CHECK(reused[0] == &r.items[later]);
}

TEST_CASE("circuit_key: a key within its partition; a record without a key is a key of its own", "[claim]")
{
    Records r;
    const auto a = r.add(r.p0, 1, new_event_id(), "p", std::string("k"));
    const auto b = r.add(r.p0, 2, new_event_id(), "p", std::string("k"));
    const auto other_key = r.add(r.p0, 3, new_event_id(), "p", std::string("j"));
    const auto other_part = r.add(r.p1, 1, new_event_id(), "p", std::string("k"));
    const auto bare1 = r.add(r.p0, 4, new_event_id());
    const auto bare2 = r.add(r.p0, 5, new_event_id());
    const auto key = [&](std::size_t i) { return circuit_key(r.items[i]); };
    CHECK(key(a) == key(b));
    CHECK(key(a) != key(other_key));
    CHECK(key(a) != key(other_part));
    CHECK(key(bare1) != key(bare2));
    CHECK(key(bare1) == key(bare1));
}

TEST_CASE("classify: what an exception that ended the transaction means", "[claim]")
{
    using Fault = ClaimTransaction::Fault;
    CHECK(fault_of(Abandon{}) == Fault::abandoned);
    CHECK(fault_of(Replaced{}) == Fault::replaced);
    CHECK(fault_of(Fenced{}) == Fault::fenced);
    CHECK(fault_of(pqxx::in_doubt_error("commit in doubt")) == Fault::connection);
    CHECK(fault_of(pqxx::broken_connection("gone")) == Fault::connection);
    CHECK(fault_of(pqxx::check_violation("no partition for the claim", "", "23514")) == Fault::conflict);
    CHECK(fault_of(rollback<pqxx::serialization_failure>("40001")) == Fault::conflict);
    CHECK(fault_of(rollback<pqxx::deadlock_detected>("40P01")) == Fault::conflict);
    // The session lost the library's setup: outside a handler only.
    CHECK(fault_of(pqxx::sql_error("no guard table", "", "42P01")) == Fault::setup_lost);
    CHECK(fault_of(pqxx::sql_error("no prepared statement", "", "26000")) == Fault::setup_lost);
    CHECK(fault_of(pqxx::sql_error("a handler's table", "", "42P01"), true) == Fault::other);
    CHECK(fault_of(pqxx::sql_error("lock", "", "55P03")) == Fault::lock_timeout);
    CHECK(fault_of(pqxx::sql_error("lock", "", "55P03"), true) == Fault::lock_timeout);
    CHECK(fault_of(pqxx::sql_error("syntax", "", "42601")) == Fault::other);
    CHECK(fault_of(std::runtime_error("anything")) == Fault::other);

    const auto c = classify(std::make_exception_ptr(pqxx::broken_connection("socket closed")), false);
    CHECK(c.what == "socket closed");
    CHECK(classify(std::make_exception_ptr(Abandon{}), false).what.empty());
    // None of the library's: it goes on up.
    CHECK_THROWS_AS(classify(std::make_exception_ptr(42), false), int);
}

TEST_CASE("retryable: NonRetryableError never, then the configured classifier", "[claim]")
{
    ConsumerConfig cfg;
    CHECK(retryable(cfg, std::runtime_error("x")));
    CHECK_FALSE(retryable(cfg, NonRetryableError("rejected")));
    cfg.is_retryable = [](const std::exception& e) { return std::string(e.what()) != "permanent"; };
    CHECK(retryable(cfg, std::runtime_error("transient")));
    CHECK_FALSE(retryable(cfg, std::runtime_error("permanent")));
    CHECK_FALSE(retryable(cfg, NonRetryableError("transient"))); // whatever the classifier says
    // A classifier that throws must not lose the record.
    cfg.is_retryable = [](const std::exception&) -> bool { throw std::logic_error("classifier bug"); };
    CHECK(retryable(cfg, std::runtime_error("x")));
}

TEST_CASE("RunningCall: the call running now, for the poll thread's watch", "[claim]")
{
    Records r;
    const auto i = r.add(r.p1, 42, new_event_id());
    RunningCall call;
    CHECK_FALSE(call.seen());
    const auto before = Clock::now();
    {
        const CallScope scope(call, r.items[i], 3);
        const auto seen = call.seen();
        REQUIRE(seen);
        CHECK(seen->where == r.items[i].where());
        CHECK(seen->records == 3);
        CHECK(seen->since >= before);
        CHECK(seen->since <= Clock::now());
        CHECK_FALSE(seen->fields.empty());
    }
    CHECK_FALSE(call.seen()); // the scope ended the call
}

TEST_CASE("Worker::reset: ready for the next batch, holds from screening, fenced kept", "[claim]")
{
    Records r;
    r.add(r.p0, 1, new_event_id());
    Worker w;
    w.items = {0};
    w.holds.add(&r.p1, 5, 1);
    w.info.claimed = 4;
    w.failed = w.lost_connection = w.abandoned = true;
    w.revoked = true;
    w.fenced = true;
    w.error = std::make_exception_ptr(std::runtime_error("x"));
    w.stored.emplace_back(&r.p0, 2);
    w.scratch.one_by_one = true;

    Holds initial;
    initial.add(&r.p0, 1, 2);
    w.reset(initial);
    CHECK(w.items.empty());
    CHECK(w.holds.covers(&r.p0, 1));
    CHECK_FALSE(w.holds.covers(&r.p1, 5));
    CHECK(w.info.claimed == 0);
    CHECK_FALSE(w.failed);
    CHECK_FALSE(w.lost_connection);
    CHECK_FALSE(w.abandoned);
    CHECK_FALSE(w.revoked.load());
    CHECK_FALSE(w.error);
    CHECK(w.stored.empty());
    CHECK_FALSE(w.scratch.one_by_one);
    CHECK(w.fenced); // the engine clears it when it has acted on it
}
