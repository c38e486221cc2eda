// Schema as code for DBA-managed databases: `idemkafka-admin migrate` creates
// every table, `--print-sql` prints exactly what it runs (compared through
// pg_dump), and a consumer with create_schema = false runs under a role with
// only the documented privileges, or fails at once naming the missing table
// and the migrate command.

#include <chrono>
#include <sstream>

#include <sys/wait.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "pg/exec.hpp"
#include "retention_support.hpp"
#include "schema_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// The test database's connection string as another role (key=value form or URI).
std::string as_role(const std::string& role)
{
    const std::string base = pg();
    if (base.rfind("postgres://", 0) == 0 || base.rfind("postgresql://", 0) == 0)
        return base + (base.find('?') == std::string::npos ? "?" : "&") + "user=" + role;
    return base + " user=" + role; // libpq takes the last value of a repeated key
}

// Drops a role and everything granted to it when the test ends.
struct DropRole {
    std::string name;
    ~DropRole()
    {
        try {
            exec("DROP OWNED BY " + quote_identifier(name));
            exec("DROP ROLE IF EXISTS " + quote_identifier(name));
        } catch (...) {
        }
    }
};

std::int64_t count_in(const std::string& sql)
{
    return scalar(sql);
}

} // namespace

TEST_CASE("schema: migrate --offsets --outbox, then a consumer under a least-privilege role with "
          "create_schema = false processes a topic with exact counts",
          "[retention][schema]")
{
    const auto started = std::chrono::steady_clock::now();
    const std::string schema = unique_name("ik_lp");
    DropSchema drop_schema{schema};
    const std::string s = quote_identifier(schema);

    // Three at once on the empty schema: all succeed, exactly one creates each table.
    int offsets_created = 0, outbox_created = 0;
    const std::vector<std::string> migrate = {"migrate", "--postgres", pg(),      "--schema",
                                              schema,    "--offsets",  "--outbox"};
    int shell_status = 0;
    const auto runs = admin_parallel({migrate, migrate, migrate}, &shell_status);
    REQUIRE(WIFEXITED(shell_status));
    for (const auto& p : runs) {
        INFO(p.out << p.err);
        CHECK(p.rc == 0);
        CHECK(has(p.out, fmt::format("schema version {}", schema_version)));
        offsets_created += has(p.out, "consumer_offset\" created") ? 1 : 0;
        outbox_created += has(p.out, "outbox\" created") ? 1 : 0;
    }
    CHECK(offsets_created == 1);
    CHECK(outbox_created == 1);
    auto m = admin({"migrate", "--postgres", pg(), "--schema", schema, "--offsets", "--outbox"});
    // Another run changes nothing and says so.
    INFO(m.out << m.err);
    REQUIRE(m.rc == 0);
    CHECK(has(m.out, "consumer_offset\" exists"));
    CHECK(has(m.out, "outbox\" exists"));

    // The role has exactly the privileges docs/operations.md's "Least privilege" lists for
    // claims + offsets + outbox with maintenance off; nothing else.
    const std::string role = unique_name("ik_runtime");
    DropRole drop_role{role};
    const std::string r = quote_identifier(role);
    const std::string effects = s + ".effect";
    exec(fmt::format("CREATE TABLE {} (event_id uuid PRIMARY KEY, amount bigint NOT NULL)", effects));
    exec(fmt::format("CREATE ROLE {} LOGIN", r));
    std::string database;
    {
        pqxx::connection c(pg());
        pqxx::nontransaction tx(c);
        database = tx.exec("SELECT current_database()")[0][0].as<std::string>();
    }
    exec(fmt::format("GRANT CONNECT ON DATABASE {} TO {}", quote_identifier(database), r));
    exec(fmt::format("GRANT USAGE ON SCHEMA {} TO {}", s, r));
    exec(fmt::format("GRANT SELECT, INSERT, DELETE ON {}.processed_event TO {}", s, r));
    exec(fmt::format("GRANT SELECT, INSERT, UPDATE ON {}.processed_event_retention TO {}", s, r));
    exec(fmt::format("GRANT SELECT, INSERT, UPDATE ON {}.consumer_offset TO {}", s, r));
    exec(fmt::format("GRANT SELECT, INSERT, UPDATE, DELETE ON {}.outbox TO {}", s, r));
    exec(fmt::format("GRANT USAGE ON SEQUENCE {}.outbox_id_seq TO {}", s, r));
    exec(fmt::format("GRANT SELECT, INSERT ON {} TO {}", effects, r)); // the handler's own table

    // The role really cannot change the schema.
    {
        pqxx::connection c(as_role(role));
        pqxx::work tx(c);
        CHECK_THROWS_AS(tx.exec(fmt::format("CREATE TABLE {}.intruder (x int)", s)), pqxx::sql_error);
    }

    const std::string topic = unique_name("schema_lp");
    const std::string out_topic = unique_name("schema_lp_out");
    const std::string group = unique_name("g");
    create_topic(topic, 3);
    create_topic(out_topic, 1);
    constexpr int unique_events = 300;
    constexpr int resent = 60;
    std::vector<TestEvent> events;
    for (int i = 0; i < unique_events; ++i)
        events.push_back({new_event_id(), fmt::format("e{}", i % 17), i + 1});
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (const auto& e : events)
            pub.publish_async(topic, e.entity, encode(e));
        for (int i = 0; i < resent; ++i)
            pub.publish_async(topic, events[static_cast<std::size_t>(i * 5)].entity,
                              encode(events[static_cast<std::size_t>(i * 5)]));
        pub.flush();
    }

    auto cfg = consumer_config(group, topic);
    cfg.postgres = as_role(role);
    cfg.schema = schema;
    cfg.create_schema = false;
    cfg.offsets_in_database = true;
    cfg.retention.maintenance = false;
    OutboxConfig ob;
    ob.schema = schema;
    ob.relay_options.poll_interval = 50ms;
    cfg.outbox = ob;
    const Outbox outbox = ob.outbox();
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        detail::pg::exec_params(tx, fmt::format("INSERT INTO {} (event_id, amount) VALUES ($1::uuid, $2)", effects),
                                e.id.to_string(), e.amount);
        outbox.enqueue(tx, out_topic, e.entity, encode(e), {}, e.id);
    });
    {
        Runner<Consumer> runner(consumer);
        const bool done = wait_until(
            [&] {
                const auto snap = consumer.metrics().snapshot();
                return snap.claimed + snap.duplicates >= unique_events + resent || runner.finished();
            },
            120s);
        // Every outbox row published by the relay under the same role.
        const bool sent = done && wait_until(
                                      [&] {
                                          return count_in(fmt::format("SELECT count(*) FROM {}.outbox WHERE sent_at IS "
                                                                      "NOT NULL",
                                                                      s)) >= unique_events ||
                                                 runner.finished();
                                      },
                                      120s);
        runner.join();
        fail_if_threw(runner.error(), "the consumer stopped with");
        REQUIRE(done);
        CHECK(sent);
    }
    const auto snap = consumer.metrics().snapshot();
    CHECK(snap.claimed == static_cast<std::uint64_t>(unique_events));
    CHECK(snap.duplicates == static_cast<std::uint64_t>(resent));
    CHECK(count_in("SELECT count(*) FROM " + effects) == unique_events);
    CHECK(count_in("SELECT coalesce(sum(amount), 0) FROM " + effects) ==
          static_cast<std::int64_t>(unique_events) * (unique_events + 1) / 2);
    CHECK(count_in(fmt::format("SELECT count(*) FROM {}.processed_event WHERE consumer_group = '{}'", s, group)) ==
          unique_events);
    // Positions in the database cover every record of the topic.
    CHECK(count_in(fmt::format("SELECT coalesce(sum(next_offset), 0) FROM {}.consumer_offset WHERE consumer_group = "
                               "'{}'",
                               s, group)) == unique_events + resent);
    CHECK(count_in(fmt::format("SELECT count(*) FROM {}.outbox", s)) == unique_events);
    CHECK(count_in(fmt::format("SELECT count(*) FROM {}.outbox WHERE sent_at IS NOT NULL", s)) == unique_events);
    CHECK(read_topic(out_topic, unique_events, 60s).size() == static_cast<std::size_t>(unique_events));

    // status (an operator's command: it counts rows of every partition, so it
    // runs as the owner) agrees: every table there, at this library's version.
    const auto st = admin({"status", "--postgres", pg(), "--schema", schema, "--offsets", "--outbox"});
    INFO(st.out << st.err);
    CHECK(st.rc == 0);
    const std::string current = fmt::format(": version {}, ok", schema_version);
    CHECK(has(st.out, "claims   " + s + ".\"processed_event\"" + current));
    CHECK(has(st.out, "offsets  " + s + ".\"consumer_offset\"" + current));
    CHECK(has(st.out, "outbox   " + s + ".\"outbox\"" + current));
    WARN("least-privilege consumer test took "
         << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
         << " ms");
}

TEST_CASE("schema: --print-sql applied with psql -f gives the schema migrate creates (pg_dump)", "[retention][schema]")
{
    const auto started = std::chrono::steady_clock::now();
    for (const std::string& mode : std::vector<std::string>{"partitioned", "purge"}) {
        DYNAMIC_SECTION("mode " << mode)
        {
            const std::string by_migrate = unique_name("ik_mig");
            const std::string by_sql = unique_name("ik_sql");
            DropSchema d1{by_migrate}, d2{by_sql};
            // A fixed "now": both place the same initial partitions.
            const std::vector<std::string> common = {
                "--mode",     mode,          "--offsets", "--outbox",          "--now",
                "2031-05-06", "--retention", "3d",        "--partition-width", "12h"};
            auto args = std::vector<std::string>{"migrate", "--postgres", pg(), "--schema", by_migrate};
            args.insert(args.end(), common.begin(), common.end());
            const auto m = admin(args);
            INFO(m.out << m.err);
            REQUIRE(m.rc == 0);

            args = {"migrate", "--print-sql", "--schema", by_sql};
            args.insert(args.end(), common.begin(), common.end());
            const auto p = admin(args);
            INFO(p.err);
            REQUIRE(p.rc == 0);
            CHECK(has(p.out, "for PostgreSQL 13 or later"));
            if (mode == "partitioned") {
                CHECK(has(p.out, "`idemkafka-admin maintain`"));
                CHECK(has(p.out, "ATTACH PARTITION"));
                // 3 days back to 3 windows ahead of 12 hours: 10 partitions.
                std::size_t attach = 0;
                for (auto at = p.out.find("ATTACH PARTITION"); at != std::string::npos;
                     at = p.out.find("ATTACH PARTITION", at + 1))
                    ++attach;
                CHECK(attach == 10);
            }
            const auto applied = run_sql(p.out);
            INFO(applied.out << applied.err);
            REQUIRE(applied.rc == 0);

            const std::string a = dump_schema(by_migrate);
            const std::string b = dump_schema(by_sql);
            CHECK(has(a, "CREATE TABLE SCHEMA.consumer_offset"));
            CHECK(has(a, "CREATE TABLE SCHEMA.outbox"));
            CHECK(has(a, fmt::format("schema version {}", schema_version)));
            CHECK(a == b);

            // migrate over the applied file finds everything in place and changes nothing.
            args = {"migrate", "--postgres", pg(), "--schema", by_sql};
            args.insert(args.end(), common.begin(), common.end());
            const auto again = admin(args);
            INFO(again.out << again.err);
            REQUIRE(again.rc == 0);
            CHECK(dump_schema(by_sql) == b);
        }
    }
    WARN("print-sql / pg_dump test took "
         << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
         << " ms");
}

TEST_CASE("schema: a consumer against a schema missing one table fails at once, naming the table and the "
          "migrate command",
          "[retention][schema]")
{
    const auto started = std::chrono::steady_clock::now();
    const std::string schema = unique_name("ik_missing");
    DropSchema drop_schema{schema};
    const std::string s = quote_identifier(schema);
    // Claims only: the offsets table is missing.
    const auto m = admin({"migrate", "--postgres", pg(), "--schema", schema});
    INFO(m.out << m.err);
    REQUIRE(m.rc == 0);

    const std::string topic = unique_name("schema_missing");
    auto cfg = consumer_config(unique_name("g"), topic);
    cfg.schema = schema;
    cfg.create_schema = false;
    cfg.offsets_in_database = true;
    cfg.retention.maintenance = false;
    const std::string command = "idemkafka-admin migrate --schema " + schema + " --offsets";
    Consumer consumer(cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
    const auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
        consumer.run();
        FAIL("run() started against a schema without the offsets table");
    } catch (const ConfigError& e) {
        message = e.what();
    }
    const auto took = std::chrono::steady_clock::now() - t0;
    INFO(message);
    CHECK(has(message, s + ".\"consumer_offset\" does not exist"));
    CHECK(has(message, "`" + command + "`"));
    CHECK_FALSE(has(message, "processed_event")); // the table that is there is not blamed
    // At once: no group join, no retry loop (generous for a loaded machine).
    CHECK(took < 10s);

    // status says the same, with the same command.
    auto st = admin({"status", "--postgres", pg(), "--schema", schema, "--offsets"});
    INFO(st.out << st.err);
    CHECK(st.rc == 1);
    CHECK(has(st.out, "offsets  " + s + ".\"consumer_offset\": missing, does not exist"));
    CHECK(has(st.err, "`" + command + "`"));

    // A table that is there but older (a column missing) is named with what it lacks.
    exec(fmt::format("CREATE TABLE {}.consumer_offset (consumer_group text NOT NULL, topic text NOT NULL, partition "
                     "integer NOT NULL, next_offset bigint, PRIMARY KEY (consumer_group, topic, partition))",
                     s));
    try {
        Consumer again(cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
        again.run();
        FAIL("run() started against an offsets table without epoch");
    } catch (const ConfigError& e) {
        message = e.what();
    }
    CHECK(has(message, s + ".\"consumer_offset\" has no column epoch (bigint)"));
    CHECK(has(message, "`" + command + "`"));
    // migrate does not alter a table it did not create that way; it says what is wrong.
    const auto bad = admin({"migrate", "--postgres", pg(), "--schema", schema, "--offsets"});
    CHECK(bad.rc == 1);
    CHECK(has(bad.err, "has no column epoch"));

    // The command from the message, run as the owner, fixes a missing table.
    exec(fmt::format("DROP TABLE {}.consumer_offset", s));
    const auto fixed = admin({"migrate", "--postgres", pg(), "--schema", schema, "--offsets"});
    INFO(fixed.out << fixed.err);
    REQUIRE(fixed.rc == 0);
    pqxx::connection conn(pg());
    for (const auto& c : check_schema(conn, SchemaSpec::of(cfg))) {
        INFO(c.qualified);
        CHECK(c.ok());
        CHECK(c.version == std::optional<int>(schema_version));
    }
    WARN("missing-table test took "
         << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count()
         << " ms");
}
