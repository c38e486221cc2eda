// IdempotentConsumer on retained claims tables, against a real PostgreSQL and the
// broker: redeliveries days later into a partitioned table are duplicates (effect
// count exact), and a purge running beside a busy consumer takes only expired rows.

#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include <fmt/ranges.h>

#include "retention_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

std::string make_effect_table()
{
    const std::string name = unique_name("ret_effect");
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL)", name));
    return name;
}

void publish(const std::string& topic, const std::vector<TestEvent>& events)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    for (const auto& e : events)
        pub.publish_async(topic, e.entity, encode(e));
    pub.flush();
}

// Runs a consumer of `group` on `table` until it has consumed `records` more records.
MetricsSnapshot consume(const std::string& group, const std::string& topic, const std::string& table,
                        const std::string& effects, std::uint64_t records,
                        const std::optional<RetentionConfig>& retention = std::nullopt)
{
    auto cfg = consumer_config(group, topic);
    cfg.table = table;
    if (retention)
        cfg.retention = *retention;
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        detail::pg::exec_params(tx, fmt::format("INSERT INTO {} (event_id) VALUES ($1::uuid)", effects),
                                e.id.to_string());
    });
    Runner<Consumer> run(consumer);
    const bool done = wait_until([&] { return consumer.metrics().snapshot().consumed >= records; }, 120s);
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(done);
    return consumer.metrics().snapshot();
}

} // namespace

TEST_CASE("consumer on a partitioned table: redeliveries days later stay duplicates, effects exact",
          "[retention][integration]")
{
    const ProcessedEventStore store("public", unique_name("pe_consumer"));
    DropTable drop{store.qualified_name()};
    const auto effects = make_effect_table();
    DropTable drop_effects{effects};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    Maintenance m(store, RetentionConfig{}, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);

    // 300 events created over the last five days and the next one, 50 created ten days
    // ahead (beyond every partition, e.g. a producer with a fast clock), 20% re-sent.
    std::vector<TestEvent> events;
    for (int i = 0; i < 300; ++i)
        events.push_back(
            {v7_at(t0 - 5 * day_ms + i * 20 * 60000, static_cast<std::uint64_t>(i)), fmt::format("o{}", i), i});
    std::vector<TestEvent> future;
    for (int i = 0; i < 50; ++i)
        future.push_back(
            {v7_at(t0 + 10 * day_ms + i * 60000, static_cast<std::uint64_t>(1000 + i)), fmt::format("f{}", i), i});
    std::vector<TestEvent> all = events;
    all.insert(all.end(), future.begin(), future.end());
    std::vector<TestEvent> first = all;
    for (std::size_t i = 0; i < all.size(); i += 5)
        first.push_back(all[i]);

    const auto topic = unique_name("ret_part");
    const auto group = unique_name("g");
    create_topic(topic, 3);
    publish(topic, first);
    auto snap = consume(group, topic, store.table(), effects, first.size());
    CHECK(snap.claimed == all.size());
    CHECK(snap.duplicates == first.size() - all.size());
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(all.size()));
    CHECK(partition_of(*conn, store, future[0].id) == default_partition_name(store.table()));

    // Two days later maintenance has moved on; everything is redelivered to the same
    // group (a replay through another topic): every record is a duplicate.
    clock.set(t0 + 2 * day_ms);
    REQUIRE(m.run_once(*conn).acted);
    const auto before = count_rows(*conn, "SELECT count(*) FROM " + effects);
    const auto replay_topic = unique_name("ret_part_replay");
    create_topic(replay_topic, 3);
    publish(replay_topic, all);
    snap = consume(group, replay_topic, store.table(), effects, all.size());
    CHECK(snap.claimed == 0);
    CHECK(snap.duplicates == all.size());
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + effects) == before);

    // Nine days on, the partitions of the future events exist: their claims were moved
    // out of the default partition, and a redelivery is still a duplicate.
    clock.set(t0 + 9 * day_ms);
    const auto rep = m.run_once(*conn);
    CHECK(rep.rows_moved >= future.size());
    CHECK(partition_of(*conn, store, future[0].id) != default_partition_name(store.table()));
    const auto future_topic = unique_name("ret_part_future");
    create_topic(future_topic, 2);
    publish(future_topic, future);
    snap = consume(group, future_topic, store.table(), effects, future.size());
    CHECK(snap.claimed == 0);
    CHECK(snap.duplicates == future.size());
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + effects) == before);
}

TEST_CASE("purge beside a consumer at full speed deletes only expired claims", "[retention][integration]")
{
    const ProcessedEventStore store("public", unique_name("pe_consumer_purge"));
    DropTable drop{store.qualified_name()};
    const auto effects = make_effect_table();
    DropTable drop_effects{effects};
    RetentionConfig cfg;
    cfg.mode = RetentionMode::purge;
    cfg.purge_batch = 500;
    cfg.purge_pause = 5ms;
    Maintenance m(store, cfg);
    auto conn = connect();
    m.migrate(*conn);
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) SELECT gen_random_uuid(), 'old', "
                     "now() - interval '8 days' - random() * interval '30 days' FROM generate_series(1, 30000)",
                     store.qualified_name()));
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) SELECT gen_random_uuid(), 'recent', "
                     "now() - random() * interval '6 days' FROM generate_series(1, 2000)",
                     store.qualified_name()));

    const auto topic = unique_name("ret_purge");
    const auto group = unique_name("g");
    create_topic(topic, 3);
    std::vector<TestEvent> events;
    for (int i = 0; i < 4000; ++i)
        events.push_back({new_event_id(), fmt::format("o{}", i), i});
    std::vector<TestEvent> sent = events;
    for (std::size_t i = 0; i < events.size(); i += 10)
        sent.push_back(events[i]);
    publish(topic, sent);

    auto ccfg = consumer_config(group, topic);
    ccfg.table = store.table();
    ccfg.retention = cfg;
    ccfg.retention.maintenance = false; // this test runs the purge itself, beside the consumer
    Consumer consumer(ccfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        detail::pg::exec_params(tx, fmt::format("INSERT INTO {} (event_id) VALUES ($1::uuid)", effects),
                                e.id.to_string());
    });
    MaintenanceReport rep;
    std::uint64_t consumed_at_purge_start = 0, consumed_at_purge_end = 0;
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return consumer.metrics().snapshot().consumed > 0; }, 60s));
        consumed_at_purge_start = consumer.metrics().snapshot().consumed;
        rep = m.run_once(*conn);
        consumed_at_purge_end = consumer.metrics().snapshot().consumed;
        REQUIRE(wait_until([&] { return consumer.metrics().snapshot().consumed >= sent.size(); }, 120s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    INFO("consumed during the purge: " << consumed_at_purge_start << " .. " << consumed_at_purge_end);
    CHECK(rep.rows_purged == 30000);
    CHECK(rep.purge_batches == 61);
    CHECK_FALSE(rep.purge_incomplete);
    const auto snap = consumer.metrics().snapshot();
    CHECK(snap.claimed == events.size());
    CHECK(snap.duplicates == sent.size() - events.size());
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(events.size()));
    CHECK(count_rows(*conn, "SELECT count(DISTINCT event_id) FROM " + effects) ==
          static_cast<std::int64_t>(events.size()));
    CHECK(count_rows(*conn,
                     fmt::format("SELECT count(*) FROM {} WHERE consumer_group = 'old'", store.qualified_name())) == 0);
    CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = 'recent'",
                                        store.qualified_name())) == 2000);
    CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", store.qualified_name(),
                                        group)) == static_cast<std::int64_t>(events.size()));
}

TEST_CASE("two groups on one claims table: maintenance with the shorter retention keeps the longer one's claims",
          "[retention][integration]")
{
    // billing keeps its claims 30 days; analytics, on the same table, the default 7.
    // Maintenance run with analytics' settings (its own runner, or `idemkafka-admin
    // maintain` with the defaults) must not take billing's claims of 10-day-old
    // events: their redeliveries would be charged again.
    const ProcessedEventStore store("public", unique_name("pe_shared"));
    DropTable drop{store.qualified_name()};
    const auto effects = make_effect_table();
    DropTable drop_effects{effects};
    RetentionConfig billing;
    billing.retention = std::chrono::hours(24 * 30);
    billing.maintenance = false;
    RetentionConfig analytics;
    analytics.maintenance = false;
    auto conn = connect();
    Maintenance(store, billing).migrate(*conn);

    std::vector<TestEvent> events;
    const std::int64_t t0 = now_ms();
    for (int i = 0; i < 200; ++i)
        events.push_back(
            {v7_at(t0 - 10 * day_ms + i * 60000, static_cast<std::uint64_t>(i)), fmt::format("o{}", i), i});
    const auto topic = unique_name("ret_shared");
    const auto billing_group = unique_name("billing");
    create_topic(topic, 2);
    publish(topic, events);
    auto snap = consume(billing_group, topic, store.table(), effects, events.size(), billing);
    REQUIRE(snap.claimed == events.size());

    const auto other_topic = unique_name("ret_shared_other");
    create_topic(other_topic, 1);
    publish(other_topic, {{new_event_id(), "a", 1}});
    const auto other_effects = make_effect_table();
    DropTable drop_other{other_effects};
    consume(unique_name("analytics"), other_topic, store.table(), other_effects, 1, analytics);
    const auto rep = Maintenance(store, analytics).run_once(*conn);
    INFO(fmt::format("{}", fmt::join(rep.actions, "\n")));
    CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", store.qualified_name(),
                                        billing_group)) == static_cast<std::int64_t>(events.size()));

    // The same events again, to billing: every one a duplicate, nothing charged twice.
    const auto replay_topic = unique_name("ret_shared_replay");
    create_topic(replay_topic, 2);
    publish(replay_topic, events);
    snap = consume(billing_group, replay_topic, store.table(), effects, events.size(), billing);
    CHECK(snap.claimed == 0);
    CHECK(snap.duplicates == events.size());
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(events.size()));
}
