// Upgrades in place: each released schema layout (fixtures/schema_v<N>.sql,
// frozen DDL of that release, never generated from the code) is created,
// filled with claims, effects and stored positions as that release's consumer
// left them, and upgraded by `idemkafka-admin migrate` or by consumer start-up
// (create_schema). A consumer of this library then reads the topic: every
// record already claimed is a duplicate, every stored position is where it
// was, nothing is doubled. A schema newer than the library is refused with
// both versions named; an older one too when the consumer may not upgrade it.

#include <chrono>
#include <fstream>
#include <map>
#include <set>

#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "pg/exec.hpp"
#include "schema_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

std::string fixture(int version)
{
    return fmt::format("{}/schema_v{}.sql", IDEMKAFKA_SCHEMA_FIXTURES, version);
}

// Creates the layout of schema version `version` in `schema`.
void create_fixture(int version, const std::string& schema)
{
    const std::string file = fixture(version);
    INFO(file);
    REQUIRE(std::ifstream(file).good());
    const auto r = run_sql_file(file, schema);
    INFO(r.out << r.err);
    REQUIRE(r.rc == 0);
}

// The `columns` of every row of a table as one text, to compare before and after.
std::string rows_of(const std::string& qualified, const std::string& columns)
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    return tx
        .exec(fmt::format("SELECT coalesce(string_agg(({0})::text, E'\\n' ORDER BY {0}), '') FROM {1}", columns,
                          qualified))[0][0]
        .as<std::string>();
}

int version_of(const std::string& schema, const std::string& table)
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    const auto comment =
        detail::pg::exec_params(tx, "SELECT coalesce(obj_description(to_regclass($1), 'pg_class'), '')",
                                quote_identifier(schema) + "." + quote_identifier(table))[0][0]
            .as<std::string>();
    const auto at = comment.rfind(' ');
    return at == std::string::npos ? 0 : std::atoi(comment.c_str() + at + 1);
}

enum class Upgrade { admin_migrate, consumer_start };

// One fixture layout through an upgrade and a consumer of this library.
void upgrade_and_consume(int from, const std::string& table, RetentionMode mode, Upgrade how)
{
    const auto started = std::chrono::steady_clock::now();
    const std::string schema = unique_name("ik_up");
    DropSchema drop{schema};
    const std::string s = quote_identifier(schema);
    create_fixture(from, schema);
    REQUIRE(version_of(schema, table) == from);
    const std::string claims = s + "." + quote_identifier(table);
    const std::string positions = s + "." + quote_identifier("consumer_offset");
    const std::string effects = s + ".effect";
    exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, amount bigint NOT NULL)", effects));

    const std::string topic = unique_name("upgrade");
    const std::string group = unique_name("g");
    const std::string other_group = unique_name("other");
    constexpr int partitions = 3;
    create_topic(topic, partitions);

    // What the release's consumer processed: claims, effects and positions,
    // committed together as it commits them.
    constexpr int old_events = 150;
    constexpr int new_events = 120;
    std::vector<TestEvent> old, fresh;
    for (int i = 0; i < old_events; ++i)
        old.push_back({new_event_id(), fmt::format("e{}", i % 23), i + 1});
    for (int i = 0; i < new_events; ++i)
        fresh.push_back({new_event_id(), fmt::format("e{}", i % 23), 1000 + i});
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (const auto& e : old)
            pub.publish_async(topic, e.entity, encode(e));
        pub.flush();
    }
    std::map<std::int32_t, std::int64_t> end;
    for (const auto& r : read_topic(topic, old_events, 60s))
        end[r.partition] = std::max(end[r.partition], r.offset + 1);
    std::int64_t end_total = 0;
    for (const auto& [p, next] : end)
        end_total += next;
    REQUIRE(end_total == old_events);
    {
        pqxx::connection c(pg());
        pqxx::work tx(c);
        std::vector<EventId> ids;
        for (const auto& e : old) {
            ids.push_back(e.id);
            detail::pg::exec_params(tx, fmt::format("INSERT INTO {} VALUES ($1::uuid, $2)", effects), e.id.to_string(),
                                    e.amount);
        }
        // The release's own claim statement, for this group and (half of them) another one.
        ProcessedEventStore(schema, table).claim(tx, group, ids);
        ids.resize(ids.size() / 2);
        ProcessedEventStore(schema, table).claim(tx, other_group, ids);
        for (const auto& [p, next] : end)
            detail::pg::exec_params(tx,
                                    fmt::format("INSERT INTO {} (consumer_group, topic, partition, next_offset, "
                                                "epoch) VALUES ($1, $2, $3, $4, 4)",
                                                positions),
                                    group, topic, p, next);
        detail::pg::exec_params(
            tx,
            fmt::format("INSERT INTO {} (consumer_group, topic, partition, next_offset) VALUES ($1, 'x', 0, 7)",
                        positions),
            other_group);
        tx.commit();
    }
    const std::string claims_before = rows_of(claims, "event_id, consumer_group, processed_at");
    const std::string positions_before =
        rows_of(positions, "consumer_group, topic, partition, next_offset, epoch, updated_at");

    // After the upgrade: new events, and every old one again with a new offset
    // (a producer retry, a replay), interleaved; some old ids also with another
    // payload: their claims have no fingerprint, so these are plain
    // duplicates too, also for a consumer with payload_fingerprint.
    constexpr int changed = 10;
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < std::max(old_events, new_events); ++i) {
            if (i < new_events)
                pub.publish_async(topic, fresh[i].entity, encode(fresh[i]));
            if (i < old_events)
                pub.publish_async(topic, old[i].entity, encode(old[i]));
            if (i < changed) {
                auto other = old[i];
                other.amount = -other.amount;
                pub.publish_async(topic, other.entity, encode(other));
            }
        }
        pub.flush();
    }

    auto cfg = consumer_config(group, topic);
    cfg.schema = schema;
    cfg.table = table;
    cfg.retention.mode = mode;
    cfg.retention.maintenance = false;
    cfg.offsets_in_database = true;
    cfg.payload_fingerprint = true;
    OutboxConfig ob;
    ob.schema = schema;
    ob.relay = false;
    cfg.outbox = ob;
    if (how == Upgrade::admin_migrate) {
        std::vector<std::string> args = {"migrate", "--postgres", pg(),        "--schema", schema,
                                         "--table", table,        "--offsets", "--outbox"};
        const auto m = admin(args);
        INFO(m.out << m.err);
        REQUIRE(m.rc == 0);
        CHECK(has(m.out, fmt::format("{} upgraded to schema version {}", claims, schema_version)));
        CHECK(has(m.out, fmt::format("{} upgraded to schema version {}", positions, schema_version)));
        // Nothing lost by the upgrade itself.
        CHECK(rows_of(claims, "event_id, consumer_group, processed_at") == claims_before);
        CHECK(rows_of(positions, "consumer_group, topic, partition, next_offset, epoch, updated_at") ==
              positions_before);
        cfg.create_schema = false; // the upgraded tables pass the start-up check
    }
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        detail::pg::exec_params(tx, fmt::format("INSERT INTO {} VALUES ($1::uuid, $2)", effects), e.id.to_string(),
                                e.amount);
    });
    {
        Runner<Consumer> runner(consumer);
        const bool done = wait_until(
            [&] {
                const auto snap = consumer.metrics().snapshot();
                return snap.claimed + snap.duplicates + snap.dead_lettered_total() >=
                           static_cast<std::uint64_t>(new_events + old_events + changed) ||
                       runner.finished();
            },
            120s);
        runner.join();
        fail_if_threw(runner.error(), "the consumer stopped with");
        REQUIRE(done);
    }
    const auto snap = consumer.metrics().snapshot();
    // Every redelivery of a claim from before the upgrade is a duplicate; had a
    // stored position been lost, the old records would have been read twice
    // (a duplicate each more).
    CHECK(snap.claimed == static_cast<std::uint64_t>(new_events));
    CHECK(snap.duplicates == static_cast<std::uint64_t>(old_events + changed));
    CHECK(snap.dead_lettered_total() == 0);
    CHECK(scalar("SELECT count(*) FROM " + effects) == old_events + new_events);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == old_events + new_events);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", claims, group)) ==
          old_events + new_events);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", claims, other_group)) ==
          old_events / 2);
    // The new claims carry their payload's fingerprint, the old ones none.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}' AND payload_fingerprint IS NOT NULL",
                             claims, group)) == new_events);
    CHECK(scalar(fmt::format("SELECT coalesce(sum(next_offset), 0) FROM {} WHERE consumer_group = '{}'", positions,
                             group)) == 2 * old_events + new_events + changed);
    CHECK(scalar(fmt::format("SELECT next_offset FROM {} WHERE consumer_group = '{}'", positions, other_group)) == 7);
    for (const auto& t : {table, std::string("consumer_offset"), std::string("outbox")}) {
        INFO(t);
        CHECK(version_of(schema, t) == schema_version);
    }
    pqxx::connection conn(pg());
    for (const auto& c : check_schema(conn, SchemaSpec::of(cfg))) {
        INFO(c.qualified);
        CHECK(c.ok());
    }
    if (mode == RetentionMode::partitioned) {
        // The release's range partition is still there, and the claims that
        // were in the default partition moved to the partitions the upgrade's
        // migration created for them.
        CHECK(scalar(fmt::format("SELECT count(*) FROM pg_inherits WHERE inhparent = '{}'::regclass AND "
                                 "inhrelid = '{}.processed_event_p20261101_0000'::regclass",
                                 claims, s)) == 1);
        CHECK(scalar(fmt::format("SELECT count(*) FROM {}.processed_event_default", s)) == 0);
    }
    WARN("upgrade from schema version "
         << from << " (" << to_string(mode) << ", "
         << (how == Upgrade::admin_migrate ? "idemkafka-admin migrate" : "start-up") << ") and consumer took "
         << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
         << " ms");
}

} // namespace

TEST_CASE("upgrade: every released layout, filled with claims and positions, upgrades in place; every redelivery "
          "is a duplicate and every position is kept",
          "[retention][upgrade]")
{
    for (int from = 1; from < schema_version; ++from) {
        DYNAMIC_SECTION("from version " << from << ", partitioned claims, idemkafka-admin migrate")
        {
            upgrade_and_consume(from, "processed_event", RetentionMode::partitioned, Upgrade::admin_migrate);
        }
        DYNAMIC_SECTION("from version " << from << ", plain claims, consumer start-up")
        {
            upgrade_and_consume(from, "processed_event_plain", RetentionMode::purge, Upgrade::consumer_start);
        }
    }
}

TEST_CASE("upgrade: a consumer refuses a schema newer than it understands, and an older one when it may not "
          "upgrade it, naming both versions",
          "[retention][upgrade]")
{
    const std::string schema = unique_name("ik_ver");
    DropSchema drop{schema};
    const std::string s = quote_identifier(schema);
    create_fixture(1, schema);
    auto cfg = consumer_config(unique_name("g"), unique_name("upgrade_refused"));
    cfg.schema = schema;
    cfg.offsets_in_database = true;
    cfg.retention.maintenance = false;
    auto refusal = [&cfg] {
        Consumer consumer(cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
        const auto t0 = std::chrono::steady_clock::now();
        try {
            consumer.run();
        } catch (const ConfigError& e) {
            CHECK(std::chrono::steady_clock::now() - t0 < 10s); // at once: no group join
            return std::string(e.what());
        }
        FAIL("run() started");
        return std::string();
    };

    if (schema_version > 1) {
        cfg.create_schema = false;
        const std::string message = refusal();
        INFO(message);
        CHECK(has(message, fmt::format("{}.\"processed_event\" has schema version 1, this library needs version {}", s,
                                       schema_version)));
        CHECK(has(message, fmt::format("{}.\"consumer_offset\" has schema version 1", s)));
        CHECK(has(message, "`idemkafka-admin migrate --schema " + schema + " --offsets`"));
        CHECK(version_of(schema, "processed_event") == 1);
    }

    // Maintenance of this release does not make partitions the older table could not attach.
    if (schema_version > 1) {
        const auto mt = admin({"maintain", "--postgres", pg(), "--schema", schema});
        INFO(mt.out << mt.err);
        CHECK(mt.rc == 0);
        CHECK(has(mt.err, fmt::format("no partitions created: {}.\"processed_event\" has schema version 1", s)));
        // Nothing but the default partition and the fixture's (dropped now: expired).
        CHECK(scalar(fmt::format("SELECT count(*) FROM pg_inherits WHERE inhparent = '{}.processed_event'::regclass "
                                 "AND inhrelid::regclass::text NOT LIKE '%_default' AND inhrelid::regclass::text NOT "
                                 "LIKE '%_p20261101_0000'",
                                 s)) == 0);
    }

    const int newer = schema_version + 1;
    exec(fmt::format("COMMENT ON TABLE {}.processed_event IS 'idemkafka claims table, schema version {}'", s, newer));
    const std::string both =
        fmt::format("has schema version {}, newer than this library understands (version {})", newer, schema_version);
    for (const bool create : {true, false}) {
        cfg.create_schema = create;
        const std::string message = refusal();
        INFO(message);
        CHECK(has(message, s + ".\"processed_event\" " + both));
    }
    // Nothing was changed, the other tables included: one transaction.
    CHECK(version_of(schema, "processed_event") == newer);
    CHECK(version_of(schema, "consumer_offset") == 1);
    const auto m = admin({"migrate", "--postgres", pg(), "--schema", schema, "--offsets"});
    INFO(m.out << m.err);
    CHECK(m.rc == 1);
    CHECK(has(m.err, both));
    CHECK(version_of(schema, "consumer_offset") == 1);
}

TEST_CASE("upgrade: migrate --print-sql --from-version applied with psql gives the tables migrate upgrades "
          "(pg_dump)",
          "[retention][upgrade]")
{
    for (int from = 1; from < schema_version; ++from) {
        DYNAMIC_SECTION("from version " << from)
        {
            const std::string by_migrate = unique_name("ik_upm");
            const std::string by_sql = unique_name("ik_ups");
            DropSchema d1{by_migrate}, d2{by_sql};
            create_fixture(from, by_migrate);
            create_fixture(from, by_sql);
            // The plain claims table: migrate adds no partitions of its own to compare.
            const std::vector<std::string> common = {"--table", "processed_event_plain", "--offsets", "--outbox"};
            auto args = std::vector<std::string>{"migrate", "--postgres", pg(), "--schema", by_migrate};
            args.insert(args.end(), common.begin(), common.end());
            const auto m = admin(args);
            INFO(m.out << m.err);
            REQUIRE(m.rc == 0);

            args = {"migrate", "--print-sql", "--from-version", std::to_string(from), "--schema", by_sql};
            args.insert(args.end(), common.begin(), common.end());
            const auto p = admin(args);
            INFO(p.out << p.err);
            REQUIRE(p.rc == 0);
            CHECK(has(p.out, fmt::format("upgrade from version {} to {}", from, schema_version)));
            CHECK(has(p.out, "pg_advisory_xact_lock"));
            const auto applied = run_sql(p.out);
            INFO(applied.out << applied.err);
            REQUIRE(applied.rc == 0);
            CHECK(dump_schema(by_migrate) == dump_schema(by_sql));
            CHECK(version_of(by_sql, "processed_event_plain") == schema_version);
            CHECK(version_of(by_sql, "processed_event") == from); // not in the spec: untouched

            // An upgraded table is the table this release creates: the frozen
            // layout and the upgrade steps agree with the current DDL.
            const std::string fresh = unique_name("ik_upf");
            DropSchema d3{fresh};
            args = {"migrate", "--postgres", pg(), "--schema", fresh, "--mode", "purge"};
            args.insert(args.end(), common.begin(), common.end());
            const auto f = admin(args);
            INFO(f.out << f.err);
            REQUIRE(f.rc == 0);
            const std::vector<std::string> tables = {"processed_event_plain", "consumer_offset", "outbox",
                                                     "outbox_id_seq"};
            CHECK(dump_schema(by_sql, tables) == dump_schema(fresh, tables));
        }
    }
    const auto same = admin({"migrate", "--print-sql", "--from-version", std::to_string(schema_version)});
    CHECK(same.rc == 0);
    CHECK(has(same.out, "Nothing to do"));
    const auto bad = admin({"migrate", "--print-sql", "--from-version", std::to_string(schema_version + 1)});
    CHECK(bad.rc == 2);
    CHECK(has(bad.err, fmt::format("--from-version: schema version {} is not one of idemkafka's", schema_version + 1)));
}
