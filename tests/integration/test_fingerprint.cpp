// ConsumerConfig::payload_fingerprint: an event id reused with a different
// payload is dead-lettered (event_id_reused) instead of dropped as a
// duplicate, whether the first payload was claimed by an earlier transaction
// or earlier in the same batch; the same id with the same payload is still a
// duplicate; nothing is doubled. Without the option every one of them is a
// plain duplicate.

#include <map>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

struct Run {
    bool fingerprint = true;
    bool offsets_in_database = false;
    Ordering ordering = Ordering::partition;
    bool per_record = false; // ConsumerConfig::transaction_per_record
    std::size_t unit = 0;    // ConsumerConfig::batches_per_unit, with transactions of 4 records
};

void reused_ids(const Run& run)
{
    Fixture f(2);
    exec(fmt::format("ALTER TABLE {} ADD COLUMN amount bigint", f.effects));
    constexpr int first = 60;    // processed, then sent again:
    constexpr int same = 10;     //   byte for byte
    constexpr int changed = 10;  //   with another amount
    constexpr int in_batch = 10; // new events, each followed at once by its id with another amount
    std::vector<TestEvent> events, later;
    for (int i = 0; i < first; ++i)
        events.push_back({new_event_id(), fmt::format("k{}", i % 7), i + 1});
    for (int i = 0; i < in_batch; ++i)
        later.push_back({new_event_id(), fmt::format("k{}", i % 7), 500 + i});

    auto cfg = f.config();
    cfg.payload_fingerprint = run.fingerprint;
    cfg.offsets_in_database = run.offsets_in_database;
    cfg.ordering = run.ordering;
    cfg.transaction_per_record = run.per_record;
    if (run.unit > 0) {
        cfg.max_batch = 4;
        cfg.batches_per_unit = run.unit;
    }
    cfg.workers = run.ordering == Ordering::key ? 2 : 1;
    cfg.retention.maintenance = false;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        detail::pg::exec_params(tx, fmt::format("UPDATE {} SET amount = $2 WHERE event_id = $1::uuid", f.effects),
                                e.id.to_string(), e.amount);
    });
    Runner<Consumer> runner(consumer);
    auto settled = [&](std::uint64_t n) {
        return wait_until(
            [&] {
                const auto snap = consumer.metrics().snapshot();
                return snap.claimed + snap.duplicates + snap.dead_lettered_total() >= n || runner.finished();
            },
            90s);
    };
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (const auto& e : events)
            pub.publish_async(f.topic, e.entity, encode(e));
        pub.flush();
    }
    // The first payloads are committed before the others come: their claims conflict.
    REQUIRE(settled(first));
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < same; ++i)
            pub.publish_async(f.topic, events[i].entity, encode(events[i]));
        for (int i = 0; i < changed; ++i) {
            auto e = events[same + i];
            e.amount += 1000;
            pub.publish_async(f.topic, e.entity, encode(e));
        }
        for (const auto& e : later) {
            pub.publish_async(f.topic, e.entity, encode(e));
            auto other = e;
            other.amount = -other.amount;
            pub.publish_async(f.topic, other.entity, encode(other));
        }
        pub.flush();
    }
    const bool done = settled(first + same + changed + 2 * in_batch);
    runner.join();
    fail_if_threw(runner.error(), "the consumer stopped with");
    REQUIRE(done);

    const auto snap = consumer.metrics().snapshot();
    const auto reused = static_cast<std::uint64_t>(run.fingerprint ? changed + in_batch : 0);
    CHECK(snap.claimed == static_cast<std::uint64_t>(first + in_batch));
    CHECK(snap.duplicates == static_cast<std::uint64_t>(same + changed + in_batch) - reused);
    CHECK(snap.dead_lettered_for(DeadLetterReason::event_id_reused) == reused);
    CHECK(snap.dead_lettered_total() == reused);
    // Every event once, with its first payload.
    f.check_exact(first + in_batch);
    std::int64_t amounts = 0;
    for (const auto& e : events)
        amounts += e.amount;
    for (const auto& e : later)
        amounts += e.amount;
    CHECK(scalar("SELECT sum(amount) FROM " + f.effects) == amounts);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}' AND "
                             "payload_fingerprint IS {} NULL",
                             f.group, run.fingerprint ? "NOT" : "")) == first + in_batch);
    if (run.offsets_in_database)
        CHECK(scalar(fmt::format("SELECT sum(next_offset) FROM consumer_offset WHERE consumer_group = '{}'",
                                 f.group)) == first + same + changed + 2 * in_batch);
    if (!run.fingerprint)
        return;
    // The dead letters: the reused payloads, each once, with the reason.
    std::map<std::string, int> letters;
    for (const auto& r : read_topic(f.group + ".dlq", static_cast<std::size_t>(reused), 60s)) {
        CHECK(r.header("idemkafka.reason") == "event_id_reused");
        CHECK(r.header("idemkafka.error").find("with a different payload") != std::string::npos);
        ++letters[*r.value];
    }
    CHECK(letters.size() == reused);
    for (int i = 0; i < changed; ++i) {
        auto e = events[same + i];
        e.amount += 1000;
        CHECK(letters[encode(e)] == 1);
    }
    for (auto e : later) {
        e.amount = -e.amount;
        CHECK(letters[encode(e)] == 1);
    }
}

} // namespace

TEST_CASE("fingerprint: a reused event id with a different payload is dead-lettered event_id_reused, the same "
          "payload is a duplicate, nothing is doubled",
          "[integration][fingerprint]")
{
    for (const bool in_db : {false, true})
        for (const auto ordering : {Ordering::partition, Ordering::key}) {
            DYNAMIC_SECTION((in_db ? "offsets_in_database" : "default mode")
                            << ", " << (ordering == Ordering::key ? "Ordering::key, 2 workers" : "Ordering::partition"))
            {
                reused_ids(Run{true, in_db, ordering});
            }
        }
    // A transaction per record: a record dead-lettered at its claim ends its
    // transaction with nothing committed; the unit's later records still run.
    DYNAMIC_SECTION("transaction_per_record, offsets_in_database")
    {
        reused_ids(Run{true, true, Ordering::partition, true});
    }
    // Several transactions per unit: a reused id is met by the transaction
    // of its record, not by an earlier one that claimed the first payload.
    DYNAMIC_SECTION("batches_per_unit, offsets_in_database")
    {
        reused_ids(Run{true, true, Ordering::partition, false, 8});
    }
}

TEST_CASE("fingerprint: without payload_fingerprint a reused event id stays a duplicate", "[integration][fingerprint]")
{
    reused_ids(Run{false, false, Ordering::partition});
}
