// Retention against a real PostgreSQL: partitioned mode (dedup across partition
// boundaries, partitions ahead, the default partition, expiry), purge mode, migration
// and the maintenance lock. Time is simulated by choosing event ids and moving the
// maintenance clock.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include <idemkafka/error.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include <fmt/ranges.h>

#include "retention_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

std::int64_t floor_day(std::int64_t ms)
{
    return ms - ms % day_ms;
}

std::size_t range_partitions(pqxx::connection& conn, const ProcessedEventStore& store)
{
    const auto names = partitions(conn, store);
    return static_cast<std::size_t>(std::count_if(
        names.begin(), names.end(), [&](const std::string& n) { return n != default_partition_name(store.table()); }));
}

bool contains(const std::vector<std::string>& v, const std::string& s)
{
    return std::find(v.begin(), v.end(), s) != v.end();
}

} // namespace

TEST_CASE("fresh install: partitions from now - retention to partitions ahead, claims land in theirs", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_fresh"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    Maintenance m(store, RetentionConfig{}, {}, clock.fn());
    auto conn = connect();

    const auto r = m.migrate(*conn);
    CHECK(r.created);
    CHECK(r.mode == RetentionMode::partitioned);
    CHECK(r.partitions_created.size() == 11); // 7 days back, today, 3 ahead
    CHECK(range_partitions(*conn, store) == 11);
    const auto names = partitions(*conn, store);
    CHECK(contains(names, default_partition_name(store.table())));
    CHECK(contains(names, partition_name(store.table(), floor_day(t0))));
    CHECK(contains(names, partition_name(store.table(), floor_day(t0) + 3 * day_ms)));
    CHECK(contains(names, partition_name(store.table(), floor_day(t0) - 7 * day_ms)));
    // The default partition is purged by processed_at, through an index.
    CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM pg_indexes WHERE tablename = '{}' AND indexdef LIKE "
                                        "'%(processed_at)%'",
                                        default_partition_name(store.table()))) == 1);

    const auto id = v7_at(t0);
    CHECK(claim(*conn, store, "billing", id));
    CHECK(partition_of(*conn, store, id) == partition_name(store.table(), floor_day(t0)));
    CHECK_FALSE(claim(*conn, store, "billing", id));
    CHECK(claim(*conn, store, "analytics", id)); // another group processes it once too
    CHECK_FALSE(claim(*conn, store, "analytics", id));

    const auto st = m.status(*conn);
    CHECK(st.exists);
    CHECK(st.mode == RetentionMode::partitioned);
    CHECK(st.rows == 2);
    REQUIRE(st.groups.size() == 2);
    CHECK(st.groups[0].consumer_group == "analytics");
    CHECK(st.groups[1].rows == 1);
    CHECK(st.partitions.size() == 12);
    CHECK(st.partitions.back().is_default);
    REQUIRE(st.partitions_from);
    CHECK(to_ms(*st.partitions_from) == floor_day(t0) - 7 * day_ms);
    CHECK(to_ms(*st.partitions_to) == floor_day(t0) + 4 * day_ms);
    CHECK(st.dedup_horizon == std::chrono::hours(24 * 6));
    CHECK(to_ms(st.horizon_cutoff) == t0 - 6 * day_ms);
}

TEST_CASE("a redelivery days later, across partition boundaries, is still a duplicate", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_redeliver"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    RetentionConfig cfg; // 7 d retention, daily partitions, horizon 6 d
    Maintenance m(store, cfg, {}, clock.fn());
    const HorizonGuard guard(cfg);
    auto conn = connect();
    m.migrate(*conn);

    // Events created over the last three days, first claimed now.
    std::vector<EventId> ids;
    for (int i = 0; i < 12; ++i)
        ids.push_back(v7_at(t0 - i * 6 * hour_ms - 1, static_cast<std::uint64_t>(i)));
    for (const auto& id : ids)
        REQUIRE(claim(*conn, store, "billing", id));
    const std::string first_home = partition_of(*conn, store, ids[0]);

    // Days pass; maintenance runs every "day" and the current partition moves on.
    for (int day = 1; day <= 3; ++day) {
        clock.set(t0 + day * day_ms);
        const auto rep = m.run_once(*conn);
        REQUIRE(rep.acted);
        INFO("day " << day);
        CHECK(rep.partitions_created.size() == 1);
        CHECK(rep.partitions_dropped.size() == 1);
        for (const auto& id : ids) {
            CHECK(guard.check(id, at(clock.get())).action == HorizonAction::process);
            CHECK_FALSE(claim(*conn, store, "billing", id)); // redelivered: a duplicate
        }
    }
    // The claim never moved, whatever partition is current now.
    CHECK(partition_of(*conn, store, ids[0]) == first_home);
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == 12);

    // Past the dedup horizon (6 d) the guard stops the event before the claim could be
    // gone; the margin keeps the claim for another day.
    clock.set(to_ms(ids[0].timestamp()) + 6 * day_ms);
    m.run_once(*conn);
    const auto d = guard.check(ids[0], at(clock.get()));
    CHECK(d.beyond_horizon);
    CHECK(d.action == HorizonAction::dead_letter);
    CHECK_FALSE(claim(*conn, store, "billing", ids[0]));

    // Once its whole partition is older than the retention it is dropped, and the
    // claim with it: exactly the events the guard already dead-letters.
    clock.set(floor_day(to_ms(ids[0].timestamp())) + day_ms + 7 * day_ms);
    const auto rep = m.run_once(*conn);
    CHECK(contains(rep.partitions_dropped, first_home));
    CHECK(partition_of(*conn, store, ids[0]).empty());
    CHECK(guard.check(ids[0], at(clock.get())).action == HorizonAction::dead_letter);
}

TEST_CASE("ids past the last partition go to the default partition and move when theirs is created", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_ahead"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    Maintenance m(store, RetentionConfig{}, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);

    // The consumer runs on for ten days with no maintenance at all.
    const std::int64_t ahead = floor_day(t0) + 10 * day_ms + 12 * hour_ms;
    const auto late = v7_at(ahead, 1), later = v7_at(ahead + hour_ms, 2);
    CHECK(claim(*conn, store, "billing", late));
    CHECK(claim(*conn, store, "analytics", later));
    CHECK(partition_of(*conn, store, late) == default_partition_name(store.table()));
    CHECK_FALSE(claim(*conn, store, "billing", late));

    clock.set(t0 + 8 * day_ms);
    const auto dry = m.run_once(*conn, true);
    CHECK(dry.dry_run);
    CHECK(dry.rows_moved == 2);
    CHECK(partition_of(*conn, store, late) == default_partition_name(store.table()));

    const auto rep = m.run_once(*conn);
    CHECK(rep.rows_moved == 2);
    const std::string home = partition_name(store.table(), floor_day(to_ms(late.timestamp())));
    CHECK(contains(rep.partitions_created, home));
    CHECK(partition_of(*conn, store, late) == home);
    CHECK(partition_of(*conn, store, later) == home);
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + quote_identifier(default_partition_name(store.table()))) == 0);
    // Still duplicates after the move.
    CHECK_FALSE(claim(*conn, store, "billing", late));
    CHECK_FALSE(claim(*conn, store, "analytics", later));
    CHECK(claim(*conn, store, "billing", later));
}

TEST_CASE("a partition over too many default-partition rows waits until they have aged out", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_move_cap"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    RetentionConfig cfg;
    cfg.max_move_rows = 5;
    Maintenance m(store, cfg, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);
    for (std::uint64_t i = 0; i < 10; ++i)
        REQUIRE(claim(*conn, store, "g", v7_at(t0 + 10 * day_ms, i)));

    // Eight days on, those claims (processed "now") are older than the retention,
    // but their ids say they are from two days ahead: the horizon guard would
    // let their redeliveries through, so the claims stay (in the default
    // partition: their own partition, over the move cap, is skipped).
    clock.set(t0 + 8 * day_ms);
    auto rep = m.run_once(*conn);
    const std::string home = partition_name(store.table(), floor_day(t0 + 10 * day_ms));
    CHECK_FALSE(contains(rep.partitions_created, home));
    CHECK(std::any_of(rep.actions.begin(), rep.actions.end(),
                      [](const std::string& a) { return a.rfind("skipped", 0) == 0; }));
    CHECK(rep.rows_purged == 0);
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == 10);
    // Once their ids' time is past the retention too, they are purged; their
    // partition, expired by then, is never created.
    clock.set(t0 + 18 * day_ms);
    rep = m.run_once(*conn);
    CHECK(rep.rows_purged == 10);
    CHECK_FALSE(contains(rep.partitions_created, home));
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == 0);
}

TEST_CASE("expired partitions are dropped whole; a dry run changes nothing", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_expire"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    Maintenance m(store, RetentionConfig{}, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);
    const auto old_id = v7_at(t0 - 2 * day_ms);
    REQUIRE(claim(*conn, store, "g", old_id));
    const auto before = partitions(*conn, store);

    clock.set(t0 + 20 * day_ms);
    const auto dry = m.run_once(*conn, true);
    CHECK(dry.acted);
    CHECK(dry.partitions_dropped.size() == 11);
    CHECK(dry.partitions_created.size() == 11);
    CHECK(partitions(*conn, store) == before);
    CHECK_FALSE(partition_of(*conn, store, old_id).empty());

    const auto rep = m.run_once(*conn);
    CHECK(rep.partitions_dropped.size() == 11);
    CHECK(rep.partitions_created.size() == 11);
    CHECK(partition_of(*conn, store, old_id).empty());
    const auto st = m.status(*conn);
    REQUIRE(st.partitions_from);
    CHECK(to_ms(*st.partitions_from) == floor_day(t0 + 13 * day_ms));
    CHECK(range_partitions(*conn, store) == 11);

    // Nothing left to do on the same day.
    const auto again = m.run_once(*conn);
    CHECK(again.partitions_created.empty());
    CHECK(again.partitions_dropped.empty());
}

TEST_CASE("claims keep flowing while maintenance creates and drops partitions", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_busy"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    RetentionConfig cfg;
    cfg.partition_width = std::chrono::hours(1);
    cfg.retention = std::chrono::hours(24);
    cfg.horizon_margin = std::chrono::hours(2);
    cfg.partitions_ahead = 2;
    Maintenance m(store, cfg, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);

    // Ids from two hours back to one hour ahead of the (fast-moving) clock: inside the
    // partitions kept ahead, as with producers whose clocks are roughly right.
    std::atomic<bool> stop{false};
    std::atomic<int> claimed{0}, failures{0};
    std::mutex mu;
    std::string last_error;
    std::thread claimer([&] {
        auto c = connect();
        std::uint64_t n = 0;
        while (!stop) {
            std::vector<EventId> batch;
            for (int i = 0; i < 20; ++i)
                batch.push_back(v7_at(clock.get() + (i % 4 - 2) * hour_ms, n++));
            try {
                pqxx::work tx(*c);
                claimed += static_cast<int>(store.claim(tx, "g", batch).size());
                tx.commit();
            } catch (const std::exception& e) {
                ++failures;
                std::lock_guard<std::mutex> lock(mu);
                last_error = e.what();
            }
        }
    });
    std::size_t created = 0, dropped = 0;
    for (int step = 1; step <= 30; ++step) {
        clock.set(t0 + step * hour_ms);
        const auto rep = m.run_once(*conn);
        CHECK(rep.acted);
        created += rep.partitions_created.size();
        dropped += rep.partitions_dropped.size();
        std::this_thread::sleep_for(20ms);
    }
    stop = true;
    claimer.join();
    INFO("last claim failure: " << last_error);
    CHECK(failures == 0);
    CHECK(claimed > 0);
    CHECK(created == 30);
    CHECK(dropped >= 5);
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) > 0);
}

TEST_CASE("a claim racing the attach of its partition fails cleanly and succeeds when retried", "[retention]")
{
    // Ids beyond the partitions ahead go to the default partition. A claim routed there
    // while maintenance attaches the partition covering it is refused by PostgreSQL
    // (SQLSTATE 23514: the default partition's constraint changed under it). The
    // transaction rolls back whole, so the consumer retries it; nothing is lost or doubled.
    const ProcessedEventStore store("public", unique_name("pe_race"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    const std::int64_t t0 = clock.get();
    RetentionConfig cfg;
    cfg.partition_width = std::chrono::hours(1);
    cfg.retention = std::chrono::hours(24);
    cfg.horizon_margin = std::chrono::hours(2);
    cfg.partitions_ahead = 1;
    Maintenance m(store, cfg, {}, clock.fn());
    auto conn = connect();
    m.migrate(*conn);

    std::atomic<bool> stop{false};
    std::atomic<int> claimed{0}, refused{0}, other{0};
    std::mutex mu;
    std::string other_error;
    std::thread claimer([&] {
        auto c = connect();
        std::uint64_t n = 0;
        while (!stop) {
            std::vector<EventId> batch;
            for (int i = 0; i < 20; ++i)
                batch.push_back(v7_at(clock.get() + hour_ms + i * 3 * 60000, n++)); // the next window
            for (;;) {
                try {
                    pqxx::work tx(*c);
                    claimed += static_cast<int>(store.claim(tx, "g", batch).size());
                    tx.commit();
                    break;
                } catch (const pqxx::sql_error& e) {
                    if (e.sqlstate() == "23514") {
                        ++refused;
                        continue;
                    }
                    ++other;
                    std::lock_guard<std::mutex> lock(mu);
                    other_error = e.what();
                    break;
                }
            }
        }
    });
    for (int step = 1; step <= 10; ++step) {
        clock.set(t0 + step * hour_ms);
        CHECK(m.run_once(*conn).acted);
        std::this_thread::sleep_for(30ms);
    }
    stop = true;
    claimer.join();
    INFO("other failure: " << other_error << "; refused and retried: " << refused.load());
    CHECK(other == 0);
    CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == claimed);
}

TEST_CASE("purge mode deletes only expired rows, in bounded batches, while claims go on", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_purge"));
    DropTable drop{store.qualified_name()};
    RetentionConfig cfg;
    cfg.mode = RetentionMode::purge;
    cfg.purge_batch = 100;
    cfg.purge_pause = 10ms;
    Maintenance m(store, cfg);
    auto conn = connect();
    const auto r = m.migrate(*conn);
    CHECK(r.mode == RetentionMode::purge);
    CHECK(partitions(*conn, store).empty());
    CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND "
                                        "tablename = '{}' AND indexdef LIKE '%(processed_at)%'",
                                        store.table())) == 1);
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) SELECT gen_random_uuid(), 'old', "
                     "now() - interval '10 days' FROM generate_series(1, 1050)",
                     store.qualified_name()));
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) SELECT gen_random_uuid(), 'kept', "
                     "now() - interval '6 days 23 hours' FROM generate_series(1, 300)",
                     store.qualified_name()));

    SECTION("dry run counts, deletes nothing")
    {
        const auto dry = m.run_once(*conn, true);
        CHECK(dry.rows_purged == 1050);
        CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == 1350);
    }
    SECTION("a run is bounded by purge_max_batches")
    {
        RetentionConfig few = cfg;
        few.purge_max_batches = 3;
        const auto rep = Maintenance(store, few).run_once(*conn);
        CHECK(rep.rows_purged == 300);
        CHECK(rep.purge_batches == 3);
        CHECK(rep.purge_incomplete);
        CHECK(count_rows(*conn, "SELECT count(*) FROM " + store.qualified_name()) == 1050);
    }
    SECTION("with claims going on")
    {
        std::atomic<bool> stop{false};
        std::atomic<int> claimed{0}, failures{0};
        std::atomic<int> during{0};
        std::atomic<bool> purging{false};
        std::mutex mu;
        std::string last_error;
        std::thread claimer([&] {
            auto c = connect();
            while (!stop) {
                std::vector<EventId> batch;
                for (int i = 0; i < 25; ++i)
                    batch.push_back(new_event_id());
                try {
                    pqxx::work tx(*c);
                    const int n = static_cast<int>(store.claim(tx, "live", batch).size());
                    tx.commit();
                    claimed += n;
                    if (purging)
                        during += n;
                } catch (const std::exception& e) {
                    ++failures;
                    std::lock_guard<std::mutex> lock(mu);
                    last_error = e.what();
                }
            }
        });
        std::this_thread::sleep_for(50ms);
        purging = true;
        const auto rep = m.run_once(*conn);
        purging = false;
        std::this_thread::sleep_for(50ms);
        stop = true;
        claimer.join();
        INFO("last claim failure: " << last_error);
        CHECK(rep.acted);
        CHECK(rep.mode == RetentionMode::purge);
        CHECK(rep.rows_purged == 1050);
        CHECK(rep.purge_batches == 11); // ten full batches of 100 and one of 50
        CHECK_FALSE(rep.purge_incomplete);
        CHECK(failures == 0);
        CHECK(during > 0);
        CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = 'old'",
                                            store.qualified_name())) == 0);
        CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = 'kept'",
                                            store.qualified_name())) == 300);
        CHECK(count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = 'live'",
                                            store.qualified_name())) == claimed);
        const auto again = m.run_once(*conn);
        CHECK(again.rows_purged == 0);
        CHECK(again.purge_batches == 1);
    }
}

TEST_CASE("groups sharing a table: expiry keeps claims for the longest registered retention until it is forgotten",
          "[retention]")
{
    for (const auto mode : {RetentionMode::purge, RetentionMode::partitioned}) {
        DYNAMIC_SECTION(to_string(mode))
        {
            const ProcessedEventStore store("public", unique_name("pe_registry"));
            DropTable drop{store.qualified_name()};
            TestClock clock;
            const std::int64_t t0 = clock.get();
            RetentionConfig short_cfg; // 7 days
            short_cfg.mode = mode;
            RetentionConfig long_cfg = short_cfg;
            long_cfg.retention = std::chrono::hours(24 * 30);
            Maintenance billing(store, long_cfg, {}, clock.fn());
            Maintenance analytics(store, short_cfg, {}, clock.fn());
            auto conn = connect();
            billing.migrate(*conn);
            CHECK_FALSE(billing.register_group(*conn, "billing"));
            CHECK_FALSE(analytics.register_group(*conn, "analytics"));
            CHECK(*billing.register_group(*conn, "billing") == long_cfg.retention); // again: unchanged
            // Claims of events created (and processed) 10 and 40 days ago, of both groups.
            std::vector<EventId> ten, forty;
            for (int i = 0; i < 40; ++i) {
                ten.push_back(v7_at(t0 - 10 * day_ms + i * 1000, static_cast<std::uint64_t>(i)));
                forty.push_back(v7_at(t0 - 40 * day_ms + i * 1000, static_cast<std::uint64_t>(i)));
            }
            for (const char* group : {"billing", "analytics"}) {
                for (const auto& id : ten)
                    REQUIRE(claim(*conn, store, group, id));
                for (const auto& id : forty)
                    REQUIRE(claim(*conn, store, group, id));
            }
            exec(fmt::format("UPDATE {} SET processed_at = to_timestamp(('x' || substr(event_id::text, 1, 8) || "
                             "substr(event_id::text, 10, 4))::bit(48)::bigint / 1000.0)",
                             store.qualified_name()));
            auto rows = [&](const char* group) {
                return count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'",
                                                     store.qualified_name(), group));
            };

            // Maintenance with the 7-day retention keeps everything younger than 30 days.
            const auto rep = analytics.run_once(*conn);
            INFO(fmt::format("{}", fmt::join(rep.actions, "\n")));
            CHECK(rep.retention == long_cfg.retention);
            CHECK(rep.retention_group == "billing");
            CHECK(rows("billing") == 40);
            CHECK(rows("analytics") == 40);
            const auto st = analytics.status(*conn);
            REQUIRE(st.registered.size() == 2);
            CHECK(st.registered[0].consumer_group == "billing");
            CHECK(st.registered[0].retention == long_cfg.retention);
            CHECK(st.registered[1].consumer_group == "analytics");

            // billing retired: its registration forgotten, the 7 days apply to all.
            CHECK(analytics.forget_group(*conn, "billing"));
            CHECK_FALSE(analytics.forget_group(*conn, "billing"));
            const auto after = analytics.run_once(*conn);
            CHECK(after.retention == short_cfg.retention);
            CHECK(after.retention_group.empty());
            CHECK(rows("billing") == 0);
            CHECK(rows("analytics") == 0);
        }
    }
}

TEST_CASE("purge mode: the claim of an event id from a fast clock lasts as long as the horizon guard lets its "
          "redelivery through",
          "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_future"));
    DropTable drop{store.qualified_name()};
    RetentionConfig cfg;
    cfg.mode = RetentionMode::purge;
    Maintenance m(store, cfg);
    auto conn = connect();
    m.migrate(*conn);
    const std::int64_t day = 24 * 3600 * 1000;
    const auto now = now_ms();
    // Processed 8 days ago (retention is 7), by ids minted: on time; by a
    // producer whose clock ran 9 days fast (its id says tomorrow); without a time.
    const EventId on_time = v7_at(now - 8 * day);
    const EventId fast = v7_at(now + day);
    const EventId no_time = EventId::parse("8d0f5a3c-1b2e-4c4d-9e8f-0123456789ab");
    for (const auto& id : {on_time, fast, no_time})
        exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) VALUES ('{}', 'g', "
                         "now() - interval '8 days')",
                         store.qualified_name(), id.to_string()));
    // A redelivery of the fast id now: the guard judges it by the id's time
    // and lets it through, so only its claim stands between it and a second run.
    const HorizonGuard guard(cfg);
    REQUIRE(guard.check(fast).action == HorizonAction::process);
    REQUIRE_FALSE(guard.check(fast).beyond_horizon);

    CHECK(m.run_once(*conn, true).rows_purged == 2);
    const auto rep = m.run_once(*conn);
    CHECK(rep.rows_purged == 2);
    auto has = [&](const EventId& id) {
        return count_rows(*conn, fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", store.qualified_name(),
                                             id.to_string())) == 1;
    };
    CHECK_FALSE(has(on_time));
    CHECK_FALSE(has(no_time));
    CHECK(has(fast));
    // Once the id's own time is past the cutoff, the claim goes too.
    exec(fmt::format("UPDATE {} SET event_id = '{}' WHERE event_id = '{}'", store.qualified_name(),
                     v7_at(now - 7 * day - 3600 * 1000).to_string(), fast.to_string()));
    CHECK(m.run_once(*conn).rows_purged == 1);
}

TEST_CASE("only one session maintains a table at a time", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_lock"));
    DropTable drop{store.qualified_name()};
    Maintenance m(store, RetentionConfig{});
    auto conn = connect();
    m.migrate(*conn);
    auto other = connect();
    {
        pqxx::nontransaction tx(*other);
        REQUIRE(detail::pg::exec_params(tx,
                                        "SELECT pg_try_advisory_lock(hashtext('idemkafka.maintenance'), hashtext($1))",
                                        store.qualified_name())[0][0]
                    .as<bool>());
    }
    const auto busy = m.run_once(*conn);
    CHECK_FALSE(busy.acted);
    CHECK(busy.partitions_created.empty());
    {
        pqxx::nontransaction tx(*other);
        detail::pg::exec_params(tx, "SELECT pg_advisory_unlock(hashtext('idemkafka.maintenance'), hashtext($1))",
                                store.qualified_name());
    }
    CHECK(m.run_once(*conn).acted);
    // The lock is released after a run: another session can take it.
    pqxx::nontransaction tx(*other);
    CHECK(detail::pg::exec_params(tx, "SELECT pg_try_advisory_lock(hashtext('idemkafka.maintenance'), hashtext($1))",
                                  store.qualified_name())[0][0]
              .as<bool>());
}

TEST_CASE("migrate is idempotent and safe to run concurrently", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_migrate"));
    DropTable drop{store.qualified_name()};
    std::vector<std::thread> threads;
    std::atomic<int> ok{0}, created{0};
    std::vector<std::string> errors(6);
    for (int i = 0; i < 6; ++i)
        threads.emplace_back([&, i] {
            try {
                auto c = connect();
                if (i == 5) {
                    // A consumer starting at the same moment (plain ensure_schema).
                    store.ensure_schema(pg());
                } else {
                    const auto r = Maintenance(store, RetentionConfig{}).migrate(*c);
                    created += r.created ? 1 : 0;
                }
                ++ok;
            } catch (const std::exception& e) {
                errors[static_cast<std::size_t>(i)] = e.what();
            }
        });
    for (auto& t : threads)
        t.join();
    for (const auto& e : errors)
        CHECK(e.empty());
    CHECK(ok == 6);
    CHECK(created <= 1);
    auto conn = connect();
    // Whichever came first decided the layout; both are valid. A second migrate changes nothing.
    const auto again = Maintenance(store, RetentionConfig{}).migrate(*conn);
    CHECK_FALSE(again.created);
    CHECK(again.partitions_created.empty());
    if (again.mode == RetentionMode::partitioned)
        CHECK(range_partitions(*conn, store) == 11);
    CHECK(claim(*conn, store, "g", new_event_id()));
}

TEST_CASE("an existing plain table is kept, or converted on request", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_convert"));
    DropTable drop{store.qualified_name()};
    store.ensure_schema(pg()); // as a consumer of an earlier version created it
    auto conn = connect();
    TestClock clock;
    const auto recent_id = v7_at(clock.get() - hour_ms, 1);
    const auto old_id = v7_at(clock.get() - 30 * day_ms, 2);
    REQUIRE(claim(*conn, store, "g", recent_id));
    REQUIRE(claim(*conn, store, "g", old_id));

    Maintenance m(store, RetentionConfig{}, {}, clock.fn());
    auto kept = m.migrate(*conn);
    CHECK(kept.mode == RetentionMode::purge);
    CHECK_FALSE(kept.converted);
    CHECK(partitions(*conn, store).empty());
    CHECK(m.run_once(*conn).mode == RetentionMode::purge); // maintained as what it is

    const auto conv = m.migrate(*conn, Maintenance::Existing::convert);
    CHECK(conv.converted);
    CHECK(conv.mode == RetentionMode::partitioned);
    CHECK(conv.partitions_created.size() == 11);
    // The old table is the default partition now; claims in the range of a new
    // partition moved into it, older ones stay and expire by processed_at. All of
    // them still deduplicate.
    CHECK(partition_of(*conn, store, old_id) == default_partition_name(store.table()));
    CHECK(partition_of(*conn, store, recent_id) ==
          partition_name(store.table(), floor_day(to_ms(recent_id.timestamp()))));
    CHECK_FALSE(claim(*conn, store, "g", old_id));
    CHECK_FALSE(claim(*conn, store, "g", recent_id));
    const auto fresh = v7_at(clock.get(), 7);
    CHECK(claim(*conn, store, "g", fresh));
    CHECK(partition_of(*conn, store, fresh) != default_partition_name(store.table()));

    // Converting twice is a no-op; back to plain is refused.
    CHECK_FALSE(m.migrate(*conn, Maintenance::Existing::convert).converted);
    RetentionConfig purge;
    purge.mode = RetentionMode::purge;
    CHECK_THROWS_AS(Maintenance(store, purge).migrate(*conn, Maintenance::Existing::convert), ConfigError);
    CHECK(Maintenance(store, purge).migrate(*conn).mode == RetentionMode::partitioned);
}

TEST_CASE("a table partitioned by anything but the event id is refused", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_by_time"));
    DropTable drop{store.qualified_name()};
    exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, consumer_group text NOT NULL, processed_at "
                     "timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (event_id, consumer_group, processed_at)) "
                     "PARTITION BY RANGE (processed_at)",
                     store.qualified_name()));
    auto conn = connect();
    Maintenance m(store, RetentionConfig{});
    CHECK_THROWS_AS(m.migrate(*conn), ConfigError);
    CHECK_THROWS_AS(m.run_once(*conn), ConfigError);
}

TEST_CASE("maintenance of a missing table fails clearly", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_missing"));
    auto conn = connect();
    Maintenance m(store, RetentionConfig{});
    try {
        m.run_once(*conn);
        FAIL("run_once on a missing table did not throw");
    } catch (const DatabaseError& e) {
        CHECK(std::string(e.what()).find("does not exist") != std::string::npos);
    }
    CHECK_FALSE(m.status(*conn).exists);
}

TEST_CASE("odd table names are quoted and injection attempts never run", "[retention]")
{
    const std::string canary = unique_name("canary");
    exec("CREATE TABLE " + canary + " (x int)");
    DropTable drop_canary{canary};
    const std::string schema = "Odd Schema \"q\" " + unique_name("s");
    struct DropSchema {
        std::string q;
        ~DropSchema()
        {
            try {
                exec("DROP SCHEMA IF EXISTS " + q + " CASCADE");
            } catch (...) {
            }
        }
    } drop_schema{quote_identifier(schema)};

    for (const std::string& table :
         {std::string("we\"ird; DROP TABLE ") + canary + "; --", std::string("Größe ñ ") + unique_name("t"),
          std::string(63 - 12, 'x') + unique_name("").substr(0, 12)}) {
        for (RetentionMode mode : {RetentionMode::partitioned, RetentionMode::purge}) {
            CAPTURE(table, to_string(mode));
            const ProcessedEventStore store(schema, table);
            DropTable drop{store.qualified_name()};
            TestClock clock;
            RetentionConfig cfg;
            cfg.mode = mode;
            Maintenance m(store, cfg, {}, clock.fn());
            auto conn = connect();
            m.migrate(*conn);
            const auto id = v7_at(clock.get());
            CHECK(claim(*conn, store, "g'; DROP TABLE x; --", id));
            CHECK_FALSE(claim(*conn, store, "g'; DROP TABLE x; --", id));
            clock.set(clock.get() + 20 * day_ms);
            const auto rep = m.run_once(*conn);
            CHECK(rep.acted);
            if (mode == RetentionMode::partitioned) {
                CHECK(rep.partitions_dropped.size() == 11);
                for (const auto& p : partitions(*conn, store))
                    CHECK(p.size() <= 63);
            }
            const auto st = m.status(*conn);
            CHECK(st.exists);
            CHECK(count_rows(*conn, "SELECT count(*) FROM " + canary) == 0); // still there
        }
    }
    CHECK_THROWS_AS(ProcessedEventStore("public", std::string("a\0b", 3)), ConfigError);
    CHECK_THROWS_AS(ProcessedEventStore("public", std::string(64, 'x')), ConfigError);
}

TEST_CASE("the maintenance runner runs on its schedule and stops promptly", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_runner"));
    DropTable drop{store.qualified_name()};
    TestClock clock;
    {
        auto conn = connect();
        Maintenance(store, RetentionConfig{}, {}, clock.fn()).migrate(*conn);
    }
    clock.set(clock.get() + 20 * day_ms);
    RetentionConfig cfg;
    cfg.maintenance_interval = 200ms;
    std::atomic<int> lines{0};
    MaintenanceRunner runner(
        pg(), store, cfg, [&](LogLevel, std::string_view) { ++lines; }, clock.fn());
    REQUIRE(wait_until([&] { return runner.runs() >= 3; }, 20s));
    const auto last = runner.last_report();
    REQUIRE(last);
    CHECK(last->acted);
    CHECK(runner.failures() == 0);
    CHECK(lines > 0);
    auto conn = connect();
    const auto st = Maintenance(store, cfg, {}, clock.fn()).status(*conn);
    REQUIRE(st.partitions_from);
    CHECK(to_ms(*st.partitions_from) == floor_day(clock.get() - 7 * day_ms));
    const auto t = std::chrono::steady_clock::now();
    runner.stop();
    CHECK(std::chrono::steady_clock::now() - t < 2s);

    // A database it cannot reach is logged and retried, never thrown.
    cfg.maintenance_interval = 50ms;
    MaintenanceRunner broken("host=/nonexistent port=1 dbname=x", store, cfg, [](LogLevel, std::string_view) {});
    CHECK(wait_until([&] { return broken.failures() >= 2; }, 10s));
    CHECK(broken.runs() == 0);
}
