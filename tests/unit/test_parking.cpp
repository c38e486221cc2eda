// Per-key parking (Ordering::key): the records of a key that wait behind a
// failed record of it, as the engine parks, bounds, takes back and drops them.

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "consumer/parking.hpp"
#include "polled_item.hpp"

using namespace idemkafka::detail;
using std::chrono::milliseconds;

namespace {

PartitionLedger make_ledger()
{
    return PartitionLedger(Backoff{milliseconds(100), milliseconds(1000)},
                           Backoff{milliseconds(1000), milliseconds(30000)});
}

using idemkafka::test::polled;

std::vector<std::int64_t> offsets_of(const std::vector<Item>& items)
{
    std::vector<std::int64_t> out;
    for (const auto& it : items)
        out.push_back(it.record.offset);
    return out;
}

std::vector<std::pair<KeyId, std::int64_t>> keys_and_offsets(const std::vector<Item>& items)
{
    std::vector<std::pair<KeyId, std::int64_t>> out;
    for (const auto& it : items)
        out.emplace_back(key_id(it.record.key), it.record.offset);
    return out;
}

const KeyId null_key{};

// Three assigned partitions of a ledger, parking with room for 100 records
// and 1000 bytes, and the time the case starts.
struct ParkingCase {
    PartitionLedger ledger = make_ledger();
    PartitionState& a = ledger.assign({"t", 0});
    PartitionState& b = ledger.assign({"t", 1});
    PartitionState& c = ledger.assign({"t", 2});
    Parking parking{100, 1000};
    const Clock::time_point t0 = Clock::now();

    void park(PartitionState& ps, std::int64_t offset, std::optional<std::string_view> key,
              std::optional<std::string_view> value)
    {
        parking.add(polled(ps, offset, key, value));
    }

    std::vector<Item> take(milliseconds after)
    {
        std::vector<Item> out;
        parking.take_due(t0 + after, out);
        return out;
    }
};

} // namespace

TEST_CASE_METHOD(ParkingCase,
                 "parking: a held key parks its records; other keys, the null key and other partitions "
                 "go on",
                 "[unit][parking]")
{
    CHECK(parking.empty());
    CHECK_FALSE(parking.parked(&a, "k"));

    parking.hold(&a, KeyId("k"), t0 + milliseconds(100));
    CHECK(parking.parked(&a, "k"));
    CHECK_FALSE(parking.parked(&a, "j"));
    CHECK_FALSE(parking.parked(&a, std::nullopt)); // a null key is a key of its own
    CHECK_FALSE(parking.parked(&a, ""));           // and so is the empty one
    CHECK_FALSE(parking.parked(&b, "k"));          // keys are per partition
    CHECK(parking.keys() == 1);
    CHECK(parking.records() == 0);
    CHECK(parking.bytes() == 0);
    CHECK_FALSE(parking.empty());

    park(a, 5, "k", "xyz");
    park(a, 9, "k", std::nullopt);
    CHECK(parking.records() == 2);
    CHECK(parking.bytes() == 5); // key and payload bytes: "k" + "xyz", then "k"
    CHECK(parking.keys() == 1);
    // The committed position stays before the parked records.
    CHECK(a.parked == std::set<std::int64_t>{5, 9});
    a.processed_next = 12;
    CHECK(a.position() == 5);
    CHECK(b.parked.empty());
}

TEST_CASE_METHOD(ParkingCase, "parking: a null key parks and is taken back like any other", "[unit][parking]")
{
    parking.hold(&a, null_key, t0 + milliseconds(10));
    CHECK(parking.parked(&a, std::nullopt));
    CHECK_FALSE(parking.parked(&a, ""));
    park(a, 3, std::nullopt, "abcd");
    CHECK(parking.bytes() == 4);

    const auto out = take(milliseconds(10));
    REQUIRE(out.size() == 1);
    CHECK_FALSE(out[0].record.key.has_value());
    CHECK(out[0].record.value == std::optional<std::string_view>("abcd"));
    CHECK(parking.empty());
    CHECK(parking.bytes() == 0);
}

TEST_CASE_METHOD(ParkingCase, "parking: the later deadline of two holds of a key wins", "[unit][parking]")
{
    parking.hold(&a, KeyId("k"), t0 + milliseconds(100));
    parking.hold(&a, KeyId("k"), t0 + milliseconds(50)); // earlier: changes nothing
    CHECK(parking.keys() == 1);
    park(a, 1, "k", "v");

    CHECK(take(milliseconds(99)).empty());
    parking.hold(&a, KeyId("k"), t0 + milliseconds(200)); // a later failure of the key
    CHECK(take(milliseconds(150)).empty());
    CHECK(parking.parked(&a, "k"));
    CHECK(offsets_of(take(milliseconds(200))) == std::vector<std::int64_t>{1});
    CHECK(parking.keys() == 0);
}

TEST_CASE_METHOD(ParkingCase,
                 "parking: take_due hands back each due key's records in offset order, keys in key "
                 "order, at their deadlines",
                 "[unit][parking]")
{
    parking.hold(&a, KeyId("b"), t0 + milliseconds(50));
    parking.hold(&a, KeyId("a"), t0 + milliseconds(50));
    parking.hold(&a, null_key, t0 + milliseconds(50));
    parking.hold(&a, KeyId("c"), t0 + milliseconds(80));
    // Added out of offset order: a rewind brings earlier records after later ones.
    for (auto [offset, key] : std::vector<std::pair<std::int64_t, const char*>>{
             {7, "b"}, {3, "b"}, {9, "a"}, {2, "a"}, {4, "c"}, {1, "c"}, {8, nullptr}, {6, nullptr}})
        park(a, offset, key ? std::optional<std::string_view>(key) : std::nullopt, "v");
    CHECK(parking.records() == 8);
    CHECK(parking.keys() == 4);

    std::vector<Item> out;
    out.push_back(polled(a, 100, "z", "already there"));
    parking.take_due(t0 + milliseconds(49), out);
    CHECK(out.size() == 1);

    parking.take_due(t0 + milliseconds(50), out);
    const std::vector<std::pair<KeyId, std::int64_t>> first{{KeyId("z"), 100}, {null_key, 6},   {null_key, 8},
                                                            {KeyId("a"), 2},   {KeyId("a"), 9}, {KeyId("b"), 3},
                                                            {KeyId("b"), 7}};
    CHECK(keys_and_offsets(out) == first); // appended after what `out` held
    CHECK(parking.records() == 2);
    CHECK(parking.keys() == 1);
    CHECK(parking.bytes() == 4);
    CHECK_FALSE(parking.parked(&a, "a"));
    CHECK(parking.parked(&a, "c"));

    CHECK(keys_and_offsets(take(milliseconds(80))) ==
          std::vector<std::pair<KeyId, std::int64_t>>{{KeyId("c"), 1}, {KeyId("c"), 4}});
    CHECK(parking.empty());
    CHECK(parking.records() == 0);
    CHECK(parking.keys() == 0);
    CHECK(parking.bytes() == 0);
    // The ledger counts them as parked until they are finished.
    CHECK(a.parked == std::set<std::int64_t>{1, 2, 3, 4, 6, 7, 8, 9});
    ledger.complete(a, 0);
    CHECK(a.position() == 1);
}

TEST_CASE_METHOD(ParkingCase, "parking: a record taken back is fresh: decoded again, with nothing of its last attempt",
                 "[unit][parking]")
{
    parking.hold(&a, KeyId("k"), t0);
    auto it = polled(a, 4, "k", "payload");
    it.record.timestamp_ms = 1234;
    it.record.headers.push_back({"h", std::string("x")});
    it.id = idemkafka::EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398f");
    it.poison(idemkafka::DeadLetterReason::handler_failed, "boom");
    it.slot = 3;
    it.attempts = 2;
    it.reconcile = true;
    it.retry_later = true;
    it.retry_failures = 2;
    it.key_window_open = false;
    parking.add(std::move(it));

    const auto out = take(milliseconds(0));
    REQUIRE(out.size() == 1);
    const auto& back = out[0];
    CHECK(back.part == &a);
    CHECK(back.record.topic == "t");
    CHECK(back.record.offset == 4);
    CHECK(back.record.timestamp_ms == 1234);
    CHECK(back.record.key == std::optional<std::string_view>("k"));
    CHECK(back.record.value == std::optional<std::string_view>("payload"));
    REQUIRE(back.record.headers.size() == 1);
    CHECK(back.record.headers[0].name == "h");
    CHECK(back.state == ItemState::pending);
    CHECK(back.id.is_nil());
    CHECK(back.error.empty());
    CHECK(back.slot == 0);
    CHECK(back.attempts == -1);
    CHECK_FALSE(back.reconcile);
    CHECK_FALSE(back.retry_later);
    CHECK(back.retry_failures == 0);
    CHECK(back.key_window_open);
}

TEST_CASE_METHOD(ParkingCase, "parking: drop_from forgets the records a rewind brings again; their keys stay parked",
                 "[unit][parking]")
{
    parking.hold(&a, KeyId("x"), t0 + milliseconds(10));
    parking.hold(&a, KeyId("y"), t0 + milliseconds(10));
    parking.hold(&b, KeyId("x"), t0 + milliseconds(10));
    for (std::int64_t o : {3, 5, 8})
        park(a, o, "x", "12");
    for (std::int64_t o : {4, 6})
        park(a, o, "y", "1234");
    park(b, 5, "x", "1");
    CHECK(parking.records() == 6);
    CHECK(parking.bytes() == 3 * 3 + 2 * 5 + 2);

    parking.drop_from(&a, 100); // past everything: nothing goes
    CHECK(parking.records() == 6);
    // The engine's rewind: the ledger forgets the parked offsets from 5 on, parking their records.
    PartitionLedger::rewind(a, 5);
    parking.drop_from(&a, 5);
    CHECK(a.parked == std::set<std::int64_t>{3, 4});
    CHECK(parking.records() == 3);
    CHECK(parking.bytes() == 3 + 5 + 2);
    CHECK(parking.keys() == 3);
    CHECK(parking.parked(&a, "x"));
    CHECK(parking.parked(&a, "y"));
    CHECK(b.parked == std::set<std::int64_t>{5});

    // Every parked record of a key gone: the key still waits out its backoff,
    // and its records polled again wait with it.
    parking.drop_from(&a, 0);
    CHECK(parking.records() == 1);
    CHECK(parking.keys() == 3);
    CHECK(parking.parked(&a, "x"));
    park(a, 5, "x", "12");

    std::map<std::int32_t, std::vector<std::int64_t>> taken;
    for (const auto& it : take(milliseconds(10)))
        taken[it.part->tp.partition].push_back(it.record.offset);
    CHECK(taken == std::map<std::int32_t, std::vector<std::int64_t>>{{0, {5}}, {1, {5}}});
    CHECK(parking.empty());
    CHECK(parking.keys() == 0);

    parking.drop_from(&c, 0); // a partition with nothing parked
    CHECK(parking.empty());
}

TEST_CASE_METHOD(ParkingCase, "parking: drop forgets a partition's keys and records, and only its", "[unit][parking]")
{
    parking.hold(&a, KeyId("x"), t0);
    parking.hold(&a, null_key, t0);
    parking.hold(&b, KeyId("x"), t0);
    park(a, 1, "x", "aa");
    park(a, 2, std::nullopt, "aaa");
    park(b, 1, "x", "b");

    parking.drop(&a);
    CHECK(parking.records() == 1);
    CHECK(parking.bytes() == 2);
    CHECK(parking.keys() == 1);
    CHECK_FALSE(parking.parked(&a, "x"));
    CHECK_FALSE(parking.parked(&a, std::nullopt));
    CHECK(parking.parked(&b, "x"));
    parking.drop(&a); // twice: nothing more
    CHECK(parking.records() == 1);
    CHECK(parking.keys() == 1);

    const auto out = take(milliseconds(0));
    REQUIRE(out.size() == 1);
    CHECK(out[0].part == &b);
    CHECK(parking.empty());
}

TEST_CASE_METHOD(ParkingCase, "parking: over() past either bound; fullest() is the partition with the most records",
                 "[unit][parking]")
{
    SECTION("records")
    {
        Parking three(3, 1000);
        CHECK(three.fullest() == nullptr);
        three.hold(&a, KeyId("k"), t0);
        three.hold(&b, KeyId("k"), t0);
        three.hold(&c, KeyId("k"), t0);
        CHECK(three.fullest() == nullptr); // keys held, nothing parked
        three.add(polled(a, 1, "k", "v"));
        three.add(polled(b, 1, "k", "v"));
        three.add(polled(b, 2, "k", "v"));
        CHECK_FALSE(three.over()); // at the bound
        CHECK(three.fullest() == &b);
        three.add(polled(a, 2, "k", "v"));
        three.add(polled(a, 3, "k", "v"));
        CHECK(three.over());
        CHECK(three.fullest() == &a);

        // The engine's bound_parking(): the fullest partition is held as a whole until it fits.
        std::vector<PartitionState*> dropped;
        while (three.over()) {
            auto* fullest = three.fullest();
            REQUIRE(fullest != nullptr);
            dropped.push_back(fullest);
            three.drop(fullest);
        }
        CHECK(dropped == std::vector<PartitionState*>{&a});
        CHECK(three.records() == 2);
        CHECK(three.keys() == 2); // b's, and c's with nothing parked
    }
    SECTION("bytes")
    {
        Parking ten_bytes(100, 10);
        ten_bytes.hold(&a, KeyId("k"), t0);
        ten_bytes.hold(&c, KeyId("key"), t0);
        ten_bytes.add(polled(a, 1, "k", "123456789")); // 10 bytes
        CHECK_FALSE(ten_bytes.over());
        ten_bytes.add(polled(c, 1, "key", std::nullopt));
        CHECK(ten_bytes.bytes() == 13);
        CHECK(ten_bytes.over());
        ten_bytes.drop(&c);
        CHECK_FALSE(ten_bytes.over());
        CHECK(ten_bytes.fullest() == &a);
    }
}

TEST_CASE_METHOD(ParkingCase, "parking: the same record parked twice is kept and counted once", "[unit][parking]")
{
    parking.hold(&a, KeyId("k"), t0);
    park(a, 4, "k", "abc");
    park(a, 4, "k", "abc");
    CHECK(parking.records() == 1);
    CHECK(parking.bytes() == 4);
    CHECK(offsets_of(take(milliseconds(0))) == std::vector<std::int64_t>{4});
    CHECK(parking.records() == 0);
    CHECK(parking.bytes() == 0);
}

// Random sequences of holds, polled records, deadlines passing, handler
// failures, rewinds, revokes and overflows, carried out as the engine does.
// After every step the counts must equal what is parked, parked() must answer
// for exactly the held keys, fullest() must name a partition with the most
// records, and the ledger must keep every parked record unfinished. Every
// record parked comes back (each key's in offset order, its own payload) or
// is dropped: never both, never twice, never lost.
TEST_CASE("parking: randomized park, take and drop keep the counts and lose or repeat nothing", "[unit][parking]")
{
    constexpr int partitions = 3;
    const std::vector<KeyId> keys{null_key, KeyId("a"), KeyId("bb"), KeyId("ccc")};
    for (unsigned seed = 1; seed <= 300; ++seed) {
        INFO("seed " << seed);
        std::mt19937 rng(seed);
        auto chance = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
        const std::size_t max_records = 2 + rng() % 16;
        const std::size_t max_bytes = 20 + rng() % 150;

        auto ledger = make_ledger();
        std::vector<PartitionState*> parts;
        for (int p = 0; p < partitions; ++p)
            parts.push_back(&ledger.assign({"t", p}));
        Parking parking(max_records, max_bytes);

        // Per partition, per held key: its deadline and its parked records
        // (offset -> serial). Offsets are unique among a partition's parked
        // records: a rewind drops those it brings again.
        struct Key {
            Clock::time_point until{};
            std::map<std::int64_t, std::size_t> records;
        };
        std::vector<std::map<KeyId, Key>> model(partitions);
        std::vector<std::int64_t> next(partitions, 0); // next offset polled
        struct Parked {
            std::optional<std::string> value; // what the record's payload views
            std::size_t bytes;
        };
        std::deque<Parked> serials;
        std::set<std::size_t> live, taken, dropped;
        auto now = Clock::now();

        auto records_of = [&](int p) {
            std::size_t n = 0;
            for (const auto& [key, k] : model[p])
                n += k.records.size();
            return n;
        };
        auto forget = [&](std::size_t serial) {
            REQUIRE(live.erase(serial) == 1);
            REQUIRE(dropped.insert(serial).second);
        };
        auto check = [&] {
            std::size_t records = 0, bytes = 0, held = 0, most = 0;
            for (int p = 0; p < partitions; ++p) {
                held += model[p].size();
                most = std::max(most, records_of(p));
                std::set<std::int64_t> offsets;
                for (const auto& [key, k] : model[p])
                    for (const auto& [offset, serial] : k.records) {
                        ++records;
                        bytes += serials[serial].bytes;
                        offsets.insert(offset);
                    }
                // The ledger keeps the position before every parked record, and
                // before nothing else once every record taken back has finished.
                REQUIRE(parts[p]->parked == offsets);
                for (const auto& key : keys)
                    REQUIRE(parking.parked(parts[p], key) == (model[p].count(key) > 0));
            }
            REQUIRE(parking.records() == records);
            REQUIRE(records == live.size());
            REQUIRE(parking.bytes() == bytes);
            REQUIRE(parking.keys() == held);
            REQUIRE(parking.empty() == (held == 0));
            REQUIRE(parking.over() == (records > max_records || bytes > max_bytes));
            auto* fullest = parking.fullest();
            if (most == 0) {
                REQUIRE(fullest == nullptr);
            } else {
                REQUIRE(fullest != nullptr);
                REQUIRE(records_of(fullest->tp.partition) == most);
            }
        };
        auto hold = [&](int p, const KeyId& key, Clock::time_point until) {
            parking.hold(parts[p], key, until);
            auto& k = model[p][key];
            k.until = std::max(k.until, until);
        };
        auto park = [&](Item&& it, std::size_t serial) {
            const int p = it.part->tp.partition;
            auto& k = model[p].at(key_id(it.record.key)); // parked only behind a held key
            REQUIRE(k.records.emplace(it.record.offset, serial).second);
            REQUIRE(live.insert(serial).second);
            parking.add(std::move(it));
        };
        auto drop = [&](int p) {
            for (const auto& [key, k] : model[p])
                for (const auto& [offset, serial] : k.records)
                    forget(serial);
            model[p].clear();
            parking.drop(parts[p]);
        };
        auto rewind = [&](int p, std::int64_t offset) {
            PartitionLedger::rewind(*parts[p], offset);
            parking.drop_from(parts[p], offset);
            for (auto& [key, k] : model[p])
                for (auto r = k.records.lower_bound(offset); r != k.records.end(); r = k.records.erase(r))
                    forget(r->second);
            next[p] = offset;
        };
        // The engine's bound_parking(): the fullest partition is held as a
        // whole (rewound to its first parked record) until the rest fits.
        auto bound = [&] {
            while (parking.over()) {
                auto* fullest = parking.fullest();
                REQUIRE(fullest != nullptr);
                const int f = fullest->tp.partition;
                const auto first = *fullest->parked.begin();
                drop(f);
                rewind(f, first);
            }
        };
        // The serial of a record handed back, checked against what was parked.
        auto serial_of = [&](const Item& it) {
            const int p = it.part->tp.partition;
            REQUIRE(it.part == parts[p]);
            REQUIRE(it.state == ItemState::pending);
            const auto& k = model[p].at(key_id(it.record.key));
            const std::size_t serial = k.records.at(it.record.offset);
            const auto& value = serials[serial].value;
            REQUIRE(it.record.value.has_value() == value.has_value());
            if (value)
                REQUIRE(it.record.value->data() == value->data()); // the same payload, not a copy
            return serial;
        };

        for (int step = 0; step < 250; ++step) {
            const int what = static_cast<int>(rng() % 100);
            const int p = static_cast<int>(rng() % partitions);
            if (what < 15) {
                // A handler failure parks its key (the later deadline wins).
                hold(p, keys[rng() % keys.size()], now + milliseconds(rng() % 300));
            } else if (what < 60) {
                // A polled record: parked when its key is, else it runs and
                // finishes. Mostly of a parked key, as a hot key's are.
                std::vector<std::size_t> held;
                for (std::size_t i = 0; i < keys.size(); ++i)
                    if (model[p].count(keys[i]))
                        held.push_back(i);
                // The record's key views `keys`, which outlives it.
                const auto& key = keys[!held.empty() && chance(70) ? held[rng() % held.size()] : rng() % keys.size()];
                const std::int64_t offset = next[p]++;
                const std::optional<std::string_view> key_view =
                    key ? std::optional<std::string_view>(*key) : std::nullopt;
                if (!parking.parked(parts[p], key_view)) {
                    ledger.complete(*parts[p], offset);
                    continue;
                }
                auto& s = serials.emplace_back();
                if (!chance(10))
                    s.value = std::string(rng() % 13, 'v');
                s.bytes = (key ? key->size() : 0) + (s.value ? s.value->size() : 0);
                const std::optional<std::string_view> value =
                    s.value ? std::optional<std::string_view>(*s.value) : std::nullopt;
                park(polled(*parts[p], offset, key_view, value), serials.size() - 1);
                bound();
            } else if (what < 80) {
                // Time passes; the keys whose backoff is over run again.
                now += milliseconds(rng() % 200);
                std::vector<Item> out;
                parking.take_due(now, out);
                std::map<std::pair<int, KeyId>, std::vector<std::int64_t>> got;
                std::set<std::pair<int, KeyId>> seen;
                std::vector<std::size_t> serial(out.size());
                for (std::size_t i = 0; i < out.size(); ++i) {
                    const std::pair<int, KeyId> pk{out[i].part->tp.partition, key_id(out[i].record.key)};
                    if (i == 0 || out[i - 1].part != out[i].part || out[i - 1].record.key != out[i].record.key)
                        REQUIRE(seen.insert(pk).second); // each key's records together
                    got[pk].push_back(out[i].record.offset);
                    serial[i] = serial_of(out[i]);
                    REQUIRE(live.erase(serial[i]) == 1);
                    REQUIRE(taken.insert(serial[i]).second);
                }
                for (int q = 0; q < partitions; ++q)
                    for (auto k = model[q].begin(); k != model[q].end();) {
                        const auto g = got.find({q, k->first});
                        if (k->second.until > now) {
                            REQUIRE(g == got.end());
                            ++k;
                            continue;
                        }
                        std::vector<std::int64_t> expected;
                        for (const auto& [offset, s] : k->second.records)
                            expected.push_back(offset);
                        REQUIRE((g == got.end() ? std::vector<std::int64_t>{} : g->second) == expected);
                        k = model[q].erase(k);
                    }
                // They run. Most finish; a handler failure parks its key
                // again (that record and its key's later ones), or holds the
                // whole partition (rewound to it).
                std::map<int, std::int64_t> rewound;
                for (std::size_t i = 0; i < out.size(); ++i) {
                    auto& it = out[i];
                    const int q = it.part->tp.partition;
                    if (rewound.count(q) && it.record.offset >= rewound[q])
                        continue; // it comes again from Kafka
                    const auto key = key_id(it.record.key);
                    if (parking.parked(it.part, it.record.key) || chance(8)) {
                        if (!parking.parked(it.part, it.record.key))
                            hold(q, key, now + milliseconds(rng() % 300));
                        REQUIRE(taken.erase(serial[i]) == 1);
                        park(std::move(it), serial[i]);
                        continue;
                    }
                    if (chance(5)) {
                        rewind(q, it.record.offset);
                        rewound[q] = it.record.offset;
                        continue;
                    }
                    ledger.complete(*it.part, it.record.offset);
                }
                bound();
            } else if (what < 89) {
                // A partition hold rewinds to an earlier offset.
                rewind(p, next[p] == 0 ? 0 : static_cast<std::int64_t>(rng() % next[p]));
            } else if (what < 97) {
                // The circuit breaker holds the partition at its first parked
                // record, or a revoke takes it.
                const bool revoke = chance(50);
                const auto first = parts[p]->parked.empty() ? next[p] : *parts[p]->parked.begin();
                drop(p);
                if (revoke) {
                    ledger.revoke({parts[p]->tp});
                    parts[p] = &ledger.assign({"t", p});
                    next[p] = 0;
                } else {
                    rewind(p, first);
                }
            } else {
                parking.drop_from(parts[p], next[p]); // nothing parked from there on
            }
            check();
        }
        // Every deadline passes: what is still parked comes back, once.
        now += milliseconds(1000);
        std::vector<Item> out;
        parking.take_due(now, out);
        for (const auto& it : out) {
            const auto serial = serial_of(it);
            REQUIRE(live.erase(serial) == 1);
            REQUIRE(taken.insert(serial).second);
        }
        CHECK(live.empty());
        CHECK(taken.size() + dropped.size() == serials.size());
        CHECK(parking.empty());
        CHECK(parking.records() == 0);
        CHECK(parking.bytes() == 0);
        CHECK(parking.keys() == 0);
    }
}
