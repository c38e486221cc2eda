// Gauges against a real PostgreSQL and broker: per-partition lag (from the
// watermarks and from librdkafka's statistics), records in flight, and the age
// of the group's oldest claim. Every expected figure is computed from what was
// produced and what the handler let through; every wait is for a condition.

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/health.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/retention.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "consumer/claim_age.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;
constexpr int partitions = 4;

std::int64_t now_ms()
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// What was produced and how far the handler may go on each partition.
struct Plan {
    std::array<std::int64_t, partitions> count{};            // records per partition (its high watermark)
    std::array<std::int64_t, partitions> stop{};             // the handler throws from this offset on
    std::int64_t oldest_processed_ms = -1;                   // UUIDv7 time of the oldest id that gets claimed
    std::int64_t published_from_ms = 0, published_to_ms = 0; // the records' Kafka timestamps lie in between
    std::int64_t claimed() const
    {
        std::int64_t n = 0;
        for (auto s : stop)
            n += s;
        return n;
    }
};

// Publishes `n` events whose ids are UUIDv7s minted at first_ms, first_ms + 1, ...
// and reads them back to learn where each landed.
Plan publish_and_plan(const std::string& topic, int n, std::int64_t first_ms)
{
    const auto from_ms = now_ms();
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < n; ++i) {
            const TestEvent e{EventId::from_v7_parts(static_cast<std::uint64_t>(first_ms + i), 0,
                                                     0x5a5a5a5a5a5aULL + static_cast<std::uint64_t>(i)),
                              fmt::format("entity-{}", i), i};
            pub.publish_async(topic, e.entity, encode(e));
        }
        pub.flush();
    }
    const auto records = read_topic(topic, static_cast<std::size_t>(n), 60s);
    REQUIRE(records.size() == static_cast<std::size_t>(n));
    Plan plan;
    plan.published_from_ms = from_ms;
    plan.published_to_ms = now_ms();
    for (const auto& r : records)
        ++plan.count[static_cast<std::size_t>(r.partition)];
    for (std::size_t p = 0; p < partitions; ++p)
        REQUIRE(plan.count[p] >= 3); // the keys spread; each partition gets a share
    // Partition 0 stops after its first record, 1 a third in, 2 two thirds in,
    // 3 is consumed to the end.
    plan.stop = {1, plan.count[1] / 3 + 1, 2 * plan.count[2] / 3, plan.count[3]};
    for (const auto& r : records)
        if (r.offset < plan.stop[static_cast<std::size_t>(r.partition)]) {
            const auto ms = static_cast<std::int64_t>(decode(*r.value).id.unix_ms());
            if (plan.oldest_processed_ms < 0 || ms < plan.oldest_processed_ms)
                plan.oldest_processed_ms = ms;
        }
    return plan;
}

std::string describe(const MetricsSnapshot& m)
{
    std::ostringstream out;
    out << "lag " << m.lag << ", assigned " << m.assigned_partitions << ", in flight " << m.in_flight_records << "/"
        << m.in_flight_bytes << " bytes, oldest claim " << m.oldest_claim_unix_ms << ";";
    for (const auto& p : m.partitions)
        out << " " << p.topic << "/" << p.partition << ": lag " << p.lag << " position " << p.position << " committed "
            << p.committed << " hw " << p.high_watermark << " (" << to_string(p.source) << ")";
    return out.str();
}

// True when every partition the consumer holds shows exactly the records the
// handler has not let through, from the expected source, and nothing is in flight.
bool settled(const MetricsSnapshot& m, const std::string& topic, const Plan& plan, LagSource source)
{
    if (m.in_flight_records != 0 || m.in_flight_bytes != 0 || m.partitions.empty() ||
        static_cast<std::int64_t>(m.partitions.size()) != m.assigned_partitions)
        return false;
    std::int64_t total = 0;
    for (const auto& p : m.partitions) {
        const auto i = static_cast<std::size_t>(p.partition);
        if (p.topic != topic || p.source != source || p.lag != plan.count[i] - plan.stop[i] ||
            p.high_watermark != plan.count[i] || p.position != plan.stop[i] || p.committed != plan.stop[i])
            return false;
        total += p.lag;
    }
    return m.lag == total;
}

// Seconds behind: 0 where caught up; where a refused record waits, from its
// Kafka timestamp (the publish time) to now, growing while it waits; in /metrics.
void check_lag_seconds(const Consumer& c, const Plan& plan)
{
    const auto before = now_ms();
    const auto m = c.metrics().snapshot();
    const auto after = now_ms();
    std::int32_t waiting = -1;
    double first = -1;
    for (const auto& p : m.partitions) {
        CAPTURE(p.partition, p.lag, p.lag_seconds);
        if (p.lag == 0) {
            CHECK(p.lag_seconds == 0);
            continue;
        }
        CHECK(p.lag_seconds >= static_cast<double>(before - plan.published_to_ms - 250) / 1000.0);
        CHECK(p.lag_seconds <= static_cast<double>(after - plan.published_from_ms + 250) / 1000.0);
        waiting = p.partition;
        first = p.lag_seconds;
    }
    REQUIRE(waiting >= 0);
    CHECK(wait_until(
        [&] {
            for (const auto& p : c.metrics().snapshot().partitions)
                if (p.partition == waiting)
                    return p.lag_seconds >= first + 0.5;
            return false;
        },
        10s));
    // Ready and live while it runs; a partition that does not move for longer
    // than its bound, with records waiting, is not live.
    const auto h = health_of(c.metrics().snapshot(), now_ms());
    CAPTURE(h.to_json());
    CHECK(h.ready);
    CHECK(h.live);
    HealthConfig strict;
    strict.partition_stall_after = std::chrono::milliseconds(500);
    CHECK(wait_until([&] { return !health_of(c.metrics().snapshot(), now_ms(), strict).live; }, 10s));
    CHECK(health_of(c.metrics().snapshot(), now_ms(), strict).to_json().find("has not moved") != std::string::npos);
    const auto text = m.to_prometheus("g");
    CHECK(text.find("# TYPE idemkafka_lag_seconds gauge") != std::string::npos);
    CHECK(text.find(fmt::format("idemkafka_lag_seconds{{group=\"g\",topic=\"{}\",partition=\"{}\"}}",
                                m.partitions[0].topic, m.partitions[0].partition)) != std::string::npos);
}

std::set<std::int32_t> held_partitions(const MetricsSnapshot& m)
{
    std::set<std::int32_t> out;
    for (const auto& p : m.partitions)
        out.insert(p.partition);
    return out;
}

void run_scenario(bool statistics)
{
    const auto topic = unique_name(statistics ? "gauge-stats" : "gauge-wm");
    const auto group = unique_name("g");
    create_topic(topic, partitions);
    // Two hours old: well inside the dedup horizon, far from "now".
    const auto minted = now_ms() - 2 * 3600 * 1000;
    const auto plan = publish_and_plan(topic, 80, minted);
    const auto source = statistics ? LagSource::statistics : LagSource::watermarks;

    auto cfg = consumer_config(group, topic);
    cfg.max_batch = 16;
    // A record the handler refuses waits long enough to leave the consumer idle.
    cfg.retry_backoff = 600s;
    cfg.retry_backoff_max = 600s;
    cfg.max_attempts = 1000;
    cfg.oldest_claim_refresh = 200ms;
    if (statistics)
        cfg.kafka["statistics.interval.ms"] = "100";

    struct Refused : std::runtime_error {
        using std::runtime_error::runtime_error;
    };
    std::atomic<std::int64_t> seen_in_flight{0}, seen_bytes{0};
    auto make_handler = [&](Consumer* const* self) {
        return [&plan, self, &seen_in_flight, &seen_bytes](pqxx::work&, const TestEvent&, const Context& ctx) {
            // Inside the handler its record is in flight.
            const auto m = (*self)->metrics().snapshot();
            seen_in_flight.store(std::max(seen_in_flight.load(), m.in_flight_records));
            seen_bytes.store(std::max(seen_bytes.load(), m.in_flight_bytes));
            if (ctx.offset() >= plan.stop[static_cast<std::size_t>(ctx.partition())])
                throw Refused(fmt::format("refused {}@{}", ctx.partition(), ctx.offset()));
        };
    };
    Consumer* a_ptr = nullptr;
    Consumer a(cfg, decode, event_id_of, make_handler(&a_ptr));
    a_ptr = &a;
    Runner<Consumer> run_a(a);

    INFO("statistics " << statistics);
    bool ok = wait_until([&] { return settled(a.metrics().snapshot(), topic, plan, source); }, 60s);
    INFO(describe(a.metrics().snapshot()));
    REQUIRE(ok);
    REQUIRE_FALSE(run_a.error());
    {
        const auto m = a.metrics().snapshot();
        CHECK(m.assigned_partitions == partitions);
        CHECK(m.claimed == static_cast<std::uint64_t>(plan.claimed()));
        CHECK(m.dead_lettered_total() == 0);
        std::int64_t remaining = 0;
        for (std::size_t p = 0; p < partitions; ++p)
            remaining += plan.count[p] - plan.stop[p];
        CHECK(m.lag == remaining);
        CHECK(seen_in_flight.load() >= 1);
        // The running batch and, with the pipeline, the one polled meanwhile.
        CHECK(seen_in_flight.load() <= static_cast<std::int64_t>(2 * cfg.max_batch));
        CHECK(seen_bytes.load() >= 36); // at least one payload with its event id
    }
    check_lag_seconds(a, plan);
    // The oldest claim is the earliest id the handler let through, to the millisecond.
    ok = wait_until([&] { return a.metrics().snapshot().oldest_claim_unix_ms == plan.oldest_processed_ms; }, 30s);
    INFO("oldest claim " << a.metrics().snapshot().oldest_claim_unix_ms << ", expected " << plan.oldest_processed_ms);
    REQUIRE(ok);
    {
        const auto before = now_ms();
        const auto m = a.metrics().snapshot();
        const auto after = now_ms();
        CHECK(m.oldest_claim_age_seconds >= static_cast<double>(before - plan.oldest_processed_ms) / 1000.0);
        CHECK(m.oldest_claim_age_seconds <= static_cast<double>(after - plan.oldest_processed_ms) / 1000.0);
        CHECK(m.oldest_claim_age_seconds >= 7200.0);
        CHECK(m.oldest_claim_age_seconds < 7200.0 + 600.0);
    }

    // A second member takes partitions over: they leave the first one's list,
    // and both show exact lags for what they hold.
    {
        Consumer* b_ptr = nullptr;
        Consumer b(cfg, decode, event_id_of, make_handler(&b_ptr));
        b_ptr = &b;
        Runner<Consumer> run_b(b);
        ok = wait_until(
            [&] {
                const auto ma = a.metrics().snapshot();
                const auto mb = b.metrics().snapshot();
                if (ma.assigned_partitions == 0 || mb.assigned_partitions == 0)
                    return false;
                if (!settled(ma, topic, plan, source) || !settled(mb, topic, plan, source))
                    return false;
                auto all = held_partitions(ma);
                const auto theirs = held_partitions(mb);
                all.insert(theirs.begin(), theirs.end());
                return all.size() == partitions && ma.partitions.size() + mb.partitions.size() == partitions;
            },
            60s);
        INFO("first: " << describe(a.metrics().snapshot()));
        INFO("second: " << describe(b.metrics().snapshot()));
        REQUIRE(ok);
        run_b.join();
        REQUIRE_FALSE(run_b.error());
    }
    // Back to one member: it holds all four again, each with its exact lag.
    ok = wait_until(
        [&] {
            const auto m = a.metrics().snapshot();
            return m.partitions.size() == partitions && settled(m, topic, plan, source);
        },
        60s);
    INFO(describe(a.metrics().snapshot()));
    REQUIRE(ok);
    run_a.join();
    REQUIRE_FALSE(run_a.error());

    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group)) ==
          plan.claimed());
    for (std::int32_t p = 0; p < partitions; ++p)
        CHECK(committed_offset(group, topic, p) == plan.stop[static_cast<std::size_t>(p)]);
    // After run() the consumer holds nothing.
    const auto end = a.metrics().snapshot();
    CHECK(end.in_flight_records == 0);
    CHECK(end.in_flight_bytes == 0);
}

} // namespace

TEST_CASE("per-partition lag, in-flight records and oldest claim age: watermarks", "[integration]")
{
    run_scenario(false);
}

TEST_CASE("per-partition lag from librdkafka statistics matches the remaining records", "[integration]")
{
    run_scenario(true);
}

TEST_CASE("oldest claim: an index walk, the UUIDv7 time, processed_at for other ids", "[integration]")
{
    for (const auto mode : {RetentionMode::partitioned, RetentionMode::purge}) {
        INFO("mode " << to_string(mode));
        const ProcessedEventStore store("public", unique_name("claims_age"));
        RetentionConfig rc;
        rc.mode = mode;
        pqxx::connection conn(pg());
        Maintenance(store, rc).migrate(conn);

        // The walk must be able to come from the primary key in id order: with
        // sorts and sequential scans made as expensive as can be, no Sort node.
        {
            pqxx::work tx(conn);
            tx.exec("SET LOCAL enable_sort = off");
            tx.exec("SET LOCAL enable_seqscan = off");
            std::string plan;
            for (const auto& row :
                 detail::pg::exec_params(tx, "EXPLAIN (COSTS OFF) " + detail::oldest_claim_sql(store), "g"))
                plan += std::string(row[0].c_str()) + "\n";
            INFO(plan);
            CHECK(plan.find("Index Only Scan") != std::string::npos);
            CHECK_FALSE(std::regex_search(plan, std::regex(R"((^|->  )Sort\b)")));
        }

        const auto base = now_ms() - 3 * 3600 * 1000;
        const auto v7 = [](std::int64_t ms, std::uint64_t n) {
            return EventId::from_v7_parts(static_cast<std::uint64_t>(ms), 1, n).to_string();
        };
        const auto insert = [&](const std::string& id, const std::string& group, std::int64_t processed_ms) {
            pqxx::work tx(conn);
            detail::pg::exec_params(tx,
                                    fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) "
                                                "VALUES ($1::uuid, $2, to_timestamp($3::bigint / 1000.0))",
                                                store.qualified_name()),
                                    id, group, processed_ms);
            tx.commit();
        };
        // Group "a": UUIDv7 ids; its oldest is the smallest id, whatever processed_at says.
        insert(v7(base + 5000, 1), "a", base + 9000);
        insert(v7(base + 1000, 2), "a", base + 9500);
        insert(v7(base + 3000, 3), "a", base + 100);
        // Another group's older claims come first in the index and are walked past.
        for (std::uint64_t i = 0; i < 50; ++i)
            insert(v7(base - 100000 + static_cast<std::int64_t>(i), 10 + i), "other", base);
        // Group "b": its smallest id is a random (version 4) one, which says nothing about age.
        insert("00000000-0000-4000-8000-000000000001", "b", base + 7000);
        insert(v7(base + 2000, 4), "b", base + 4000);
        insert(v7(base + 2500, 5), "b", base + 6000);

        using detail::oldest_claim_ms;
        CHECK(oldest_claim_ms(conn, store, "a", 5s) == std::optional<std::int64_t>(base + 1000));
        CHECK(oldest_claim_ms(conn, store, "other", 5s) == std::optional<std::int64_t>(base - 100000));
        CHECK(oldest_claim_ms(conn, store, "b", 5s) == std::optional<std::int64_t>(base + 4000));
        CHECK_FALSE(oldest_claim_ms(conn, store, "nobody", 5s).has_value());
        exec("DROP TABLE " + store.qualified_name());
    }
}
