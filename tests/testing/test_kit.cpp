// The test kit (idemkafka::testing) tested the way a user would use it: a real
// IdempotentConsumer against a TestBroker and a TestDatabase, exact counts of
// effects, claims and metrics. Needs nothing from scripts/test.sh: the broker
// runs in this process; the database is a schema on IDEMKAFKA_TEST_PG when it
// is set, else a throwaway cluster (and one test always makes one).

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <pqxx/pqxx>
#include <unistd.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/dead_letter.hpp>
#include <idemkafka/testing.hpp>

#include "catch_compat.hpp"
#include "charge_event.hpp"

using namespace std::chrono_literals;

namespace {

using idemkafka::ConsumerConfig;
using idemkafka::Context;
using idemkafka::EventId;
using idemkafka::TestBroker;
using idemkafka::TestDatabase;
using idemkafka::wait_until;

using kit_test::Charge;
using kit_test::decode;
using kit_test::encode;
using kit_test::event_id_of;

std::string unique(std::string_view prefix)
{
    static std::atomic<int> counter{0};
    return fmt::format("{}_{}_{}", prefix, static_cast<long>(getpid()), counter++);
}

using Consumer = idemkafka::IdempotentConsumer<Charge>;

// run() on a thread of its own; stop() and join() on destruction.
class Running {
public:
    explicit Running(Consumer& c)
        : c_(c), thread_([this] {
              try {
                  c_.run();
              } catch (...) {
                  error_ = std::current_exception();
              }
          })
    {
    }
    ~Running() { join(); }
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

    // Stops the consumer; the message of what run() threw, or "".
    std::string join()
    {
        if (thread_.joinable()) {
            c_.stop();
            thread_.join();
        }
        if (!error_)
            return "";
        try {
            std::rethrow_exception(error_);
        } catch (const std::exception& e) {
            return e.what();
        } catch (...) {
            return "unknown exception";
        }
    }

private:
    Consumer& c_;
    std::exception_ptr error_;
    std::thread thread_;
};

// A topic, its dead-letter topic, a group and a `charge` effects table
// (deliberately without a unique key, so a doubled effect shows as a row).
struct Kit {
    TestBroker broker;
    TestDatabase db;
    std::string topic = unique("charges");
    std::string group = unique("billing");

    explicit Kit(int partitions)
    {
        broker.create_topic(topic, partitions);
        broker.create_topic(group + ".dlq", 1);
        db.exec("CREATE TABLE charge (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, amount bigint NOT NULL)");
    }

    ConsumerConfig config() const
    {
        ConsumerConfig cfg;
        cfg.group_id = group;
        cfg.topics = {topic};
        broker.configure(cfg);
        db.configure(cfg);
        cfg.retry_backoff = 20ms;
        cfg.log = idemkafka::stderr_sink(idemkafka::LogLevel::error);
        return cfg;
    }

    static void handle(pqxx::work& tx, const Charge& c, const Context&)
    {
        tx.exec(fmt::format("INSERT INTO charge (event_id, amount) VALUES ('{}', {})", c.id.to_string(), c.amount));
    }

    Charge send(std::int64_t amount)
    {
        Charge c{idemkafka::new_event_id(), amount};
        resend(c);
        return c;
    }

    void resend(const Charge& c) { broker.produce(topic, fmt::format("account-{}", c.amount % 7), encode(c)); }

    std::int64_t effects() const { return db.scalar("SELECT count(*) FROM charge"); }
    std::int64_t distinct_effects() const { return db.scalar("SELECT count(DISTINCT event_id) FROM charge"); }
    std::int64_t claims() const
    {
        return db.scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group));
    }

    void check_exact(std::int64_t events) const
    {
        CHECK(effects() == events);
        CHECK(distinct_effects() == events);
        CHECK(claims() == events);
    }
};

bool process_gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    // A server whose parent (pg_ctl) is gone may wait as a zombie for a busy
    // init to reap it: it no longer runs.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string skip, state;
    stat >> skip >> skip >> state;
    return state == "Z";
}

} // namespace

TEST_CASE("TestBroker: produce and read_all round trip, headers and partitions", "[testing]")
{
    TestBroker broker;
    CHECK_FALSE(broker.bootstrap_servers().empty());
    CHECK(broker.broker_count() == 1);
    broker.create_topic("kit-roundtrip", 3);
    CHECK_THROWS_AS(broker.create_topic("kit-roundtrip", 3), idemkafka::KafkaError);
    CHECK_THROWS_AS(broker.create_topic("", 1), idemkafka::ConfigError);

    CHECK(broker.produce("kit-roundtrip", 2, std::string("k"), std::string("v0"),
                         {{"h1", std::string("x")}, {"h2", std::nullopt}}) == 0);
    CHECK(broker.produce("kit-roundtrip", 2, std::nullopt, std::string("v1")) == 1);
    CHECK(broker.produce("kit-roundtrip", 0, std::string("k0"), std::nullopt) == 0);

    const auto records = broker.read_all("kit-roundtrip");
    REQUIRE(records.size() == 3);
    CHECK(records[0].partition == 0);
    CHECK(records[0].key == std::optional<std::string>("k0"));
    CHECK_FALSE(records[0].value.has_value());
    CHECK(records[1].partition == 2);
    CHECK(records[1].offset == 0);
    CHECK(records[1].value == std::optional<std::string>("v0"));
    CHECK(records[1].header("h1") == std::optional<std::string>("x"));
    CHECK_FALSE(records[1].header("h2").has_value());
    CHECK_FALSE(records[1].header("none").has_value());
    CHECK(records[2].offset == 1);
    CHECK_FALSE(records[2].key.has_value());

    CHECK(broker.read_all("kit-no-such-topic").empty());
    // Never auto-created, whatever librdkafka's mock would do.
    CHECK_THROWS_AS(broker.produce("kit-no-such-topic", std::nullopt, std::string("v")), idemkafka::KafkaError);
    CHECK(broker.read_all("kit-no-such-topic").empty());
    CHECK_THROWS_AS(broker.produce("kit-roundtrip", 7, std::nullopt, std::string("v")), idemkafka::KafkaError);
    CHECK(broker.read_all("kit-roundtrip").size() == 3);
}

TEST_CASE("re-sent events are claimed once: exact effects, claims and duplicates", "[testing]")
{
    Kit kit(2);
    std::vector<Charge> sent;
    for (int i = 0; i < 30; ++i)
        sent.push_back(kit.send(i));

    Consumer c(kit.config(), decode, event_id_of, Kit::handle);
    Running run(c);
    REQUIRE(wait_until([&] { return c.metrics().snapshot().claimed == 30; }, 60s));
    // Re-sent after they were processed (a producer retry, a replay): new
    // offsets, same event ids.
    for (int i = 0; i < 10; ++i)
        kit.resend(sent[static_cast<std::size_t>(i) * 3]);
    for (int i = 30; i < 35; ++i)
        kit.send(i);
    REQUIRE(wait_until(
        [&] {
            const auto m = c.metrics().snapshot();
            return m.claimed == 35 && m.duplicates == 10;
        },
        60s));
    CHECK(run.join().empty());

    const auto m = c.metrics().snapshot();
    CHECK(m.claimed == 35);
    CHECK(m.duplicates == 10);
    CHECK(m.dead_lettered_total() == 0);
    kit.check_exact(35);
    // The library's claims table and the handler's table are in the test's schema.
    CHECK(kit.db.scalar(fmt::format("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                                    " WHERE n.nspname = '{}' AND c.relname IN ('processed_event', 'charge')",
                                    kit.db.schema())) == 2);
}

TEST_CASE("a crash between the database commit and the offset commit charges once", "[testing]")
{
    Kit kit(1);
    for (int i = 0; i < 20; ++i)
        kit.send(i);
    auto cfg = kit.config();
    std::atomic<std::size_t> committed_before_crash{0};
    cfg.hooks.after_db_commit = [&](const idemkafka::BatchInfo& batch) {
        committed_before_crash = batch.claimed;
        throw std::runtime_error("crash after the database commit");
    };
    {
        Consumer c(cfg, decode, event_id_of, Kit::handle);
        Running run(c);
        REQUIRE(wait_until([&] { return committed_before_crash > 0; }, 60s));
        CHECK(run.join() == "crash after the database commit");
    }
    REQUIRE(committed_before_crash > 0);
    CHECK(kit.effects() == static_cast<std::int64_t>(committed_before_crash.load()));

    // The restarted consumer gets the crashed batch again: skipped as duplicates.
    cfg.hooks = {};
    Consumer again(cfg, decode, event_id_of, Kit::handle);
    Running run(again);
    REQUIRE(wait_until(
        [&] {
            const auto m = again.metrics().snapshot();
            return m.claimed + m.duplicates == 20;
        },
        60s));
    CHECK(run.join().empty());
    CHECK(again.metrics().snapshot().duplicates == committed_before_crash);
    kit.check_exact(20);
}

TEST_CASE("fail_next_offset_commits: commits really fail and nothing is lost or doubled", "[testing]")
{
    Kit kit(2);
    for (int i = 0; i < 40; ++i)
        kit.send(i);
    kit.broker.fail_next_offset_commits(3);
    auto cfg = kit.config();
    cfg.max_batch = 10;
    cfg.commit_interval = 0ms; // a commit per batch
    {
        Consumer c(cfg, decode, event_id_of, Kit::handle);
        Running run(c);
        REQUIRE(wait_until(
            [&] {
                const auto m = c.metrics().snapshot();
                return m.claimed == 40 && m.offset_commit_failures > 0 && m.offset_commits > 0;
            },
            60s));
        CHECK(run.join().empty());
        CHECK(c.metrics().snapshot().offset_commit_failures > 0);
    }
    kit.broker.clear_offset_commit_failures();
    // A second member of the group gets what Kafka has not seen committed again:
    // dedup absorbs it.
    for (int i = 40; i < 50; ++i)
        kit.send(i);
    Consumer again(cfg, decode, event_id_of, Kit::handle);
    Running run(again);
    REQUIRE(wait_until([&] { return again.metrics().snapshot().claimed == 10; }, 60s));
    CHECK(run.join().empty());
    CHECK(again.metrics().snapshot().claimed == 10);
    kit.check_exact(50);
}

TEST_CASE("take_down and bring_up mid-run: the consumer resumes, counts stay exact", "[testing]")
{
    Kit kit(1);
    for (int i = 0; i < 20; ++i)
        kit.send(i);
    Consumer c(kit.config(), decode, event_id_of, Kit::handle);
    Running run(c);
    REQUIRE(wait_until([&] { return c.metrics().snapshot().claimed == 20; }, 60s));

    kit.broker.take_down();
    // The brokers really are down: a client cannot read the topic.
    CHECK_THROWS_AS(kit.broker.read_all(kit.topic, 1s), idemkafka::KafkaError);
    kit.broker.bring_up();

    for (int i = 20; i < 40; ++i)
        kit.send(i);
    REQUIRE(wait_until([&] { return c.metrics().snapshot().claimed == 40; }, 60s));
    CHECK(run.join().empty());
    kit.check_exact(40);
    CHECK(kit.broker.read_all(kit.topic).size() == 40);
}

TEST_CASE("a poison record ends in the dead-letter topic with reason decode_error", "[testing]")
{
    Kit kit(1);
    for (int i = 0; i < 5; ++i)
        kit.send(i);
    kit.broker.produce(kit.topic, std::string("account-x"), std::string("not a charge"),
                       {{"trace", std::string("t-1")}});
    for (int i = 5; i < 10; ++i)
        kit.send(i);

    Consumer c(kit.config(), decode, event_id_of, Kit::handle);
    Running run(c);
    REQUIRE(wait_until(
        [&] {
            const auto m = c.metrics().snapshot();
            return m.claimed == 10 && m.dead_lettered_total() == 1;
        },
        60s));
    CHECK(run.join().empty());
    CHECK(c.metrics().snapshot().dead_lettered_for(idemkafka::DeadLetterReason::decode_error) == 1);
    kit.check_exact(10);

    namespace h = idemkafka::dead_letter_header;
    const auto dead = kit.broker.read_all(kit.group + ".dlq");
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].header(h::reason) == std::optional<std::string>("decode_error"));
    CHECK(dead[0].header(h::original_topic) == std::optional<std::string>(kit.topic));
    CHECK(dead[0].header(h::original_offset) == std::optional<std::string>("5"));
    CHECK(dead[0].header("trace") == std::optional<std::string>("t-1"));
    CHECK(dead[0].key == std::optional<std::string>("account-x"));
    CHECK(dead[0].value == std::optional<std::string>("not a charge"));
}

TEST_CASE("TestDatabase: IDEMKAFKA_TEST_PG when set, else a cluster of its own", "[testing]")
{
    const char* env = std::getenv("IDEMKAFKA_TEST_PG");
    const bool have_server = env && *env;
    TestDatabase db;
    CHECK(db.cluster_directory().empty() == have_server);
    CHECK(db.connection_string().find(db.schema()) != std::string::npos);
    db.exec("CREATE TABLE t (n int); INSERT INTO t VALUES (1), (2), (3)");
    CHECK(db.scalar("SELECT sum(n) FROM t") == 6);
    CHECK(db.scalar(fmt::format("SELECT count(*) FROM pg_tables WHERE schemaname = '{}' AND tablename = 't'",
                                db.schema())) == 1);
    CHECK_THROWS_AS(db.scalar("SELECT NULL::int"), idemkafka::DatabaseError);
    CHECK_THROWS_AS(db.scalar("SELECT 1 WHERE false"), idemkafka::DatabaseError);
    CHECK_THROWS_AS(db.exec("SELECT * FROM no_such_table"), idemkafka::DatabaseError);
    CHECK_THROWS_AS(TestDatabase(std::string()), idemkafka::ConfigError);
}

TEST_CASE("TestDatabase on a named server drops its schema on destruction", "[testing]")
{
    // The server: IDEMKAFKA_TEST_PG when set, else a cluster of the kit's own.
    std::optional<TestDatabase> host;
    std::string server;
    if (const char* env = std::getenv("IDEMKAFKA_TEST_PG"); env && *env) {
        server = env;
    } else {
        host.emplace(TestDatabase::own_cluster());
        server = host->connection_string();
    }
    std::string schema;
    {
        TestDatabase db(server);
        schema = db.schema();
        CHECK(db.cluster_directory().empty());
        db.exec("CREATE TABLE left_behind (n int)");
        ConsumerConfig cfg;
        db.configure(cfg);
        CHECK(cfg.schema == schema);
        CHECK(cfg.postgres == db.connection_string());
        pqxx::connection c(server);
        pqxx::nontransaction tx(c);
        CHECK(tx.exec(fmt::format("SELECT 1 FROM pg_namespace WHERE nspname = '{}'", schema)).size() == 1);
    }
    pqxx::connection c(server);
    pqxx::nontransaction tx(c);
    CHECK(tx.exec(fmt::format("SELECT 1 FROM pg_namespace WHERE nspname = '{}'", schema)).empty());
}

TEST_CASE("TestDatabase's own cluster is stopped and removed on destruction", "[testing]")
{
    std::string dir;
    pid_t server_pid = 0;
    {
        auto db = TestDatabase::own_cluster();
        dir = db.cluster_directory();
        REQUIRE_FALSE(dir.empty());
        std::ifstream pidfile(dir + "/data/postmaster.pid");
        pidfile >> server_pid;
        REQUIRE(server_pid > 0);
        CHECK_FALSE(process_gone(server_pid));
        db.exec("CREATE TABLE t (n int); INSERT INTO t VALUES (7)");
        CHECK(db.scalar("SELECT n FROM t") == 7);
        // Moving keeps one owner of the cluster.
        TestDatabase moved = std::move(db);
        CHECK(moved.cluster_directory() == dir);
    }
    CHECK_FALSE(std::filesystem::exists(dir));
    CHECK(process_gone(server_pid));
}
