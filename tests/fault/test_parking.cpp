// Per-key parking (Ordering::key): a failing record parks only its key. The
// partition's other keys flow past it, the failing key's records keep their
// order, the committed offset stays at the parked record, and a SIGKILL while
// keys are parked loses and doubles nothing.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

constexpr auto backoff = 1s;
const std::string bad_key = "bad";

// One partition: 99 keys of 10 records each, and 5 records of `bad_key`
// spread over the first half of the partition.
struct ParkingFixture {
    std::string topic = unique_name("park");
    std::string group = unique_name("g");
    std::string effects = unique_name("park_effect");
    std::vector<TestEvent> events;
    std::vector<std::int64_t> bad_offsets; // in publish order = offset order

    ParkingFixture()
    {
        create_topic(topic, 1);
        exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, entity text NOT NULL,"
                         " kafka_offset bigint NOT NULL, attempt int NOT NULL,"
                         " at timestamptz NOT NULL DEFAULT clock_timestamp())",
                         effects));
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 995; ++i) {
            const bool bad = i % 100 == 10 && bad_offsets.size() < 5;
            TestEvent e{new_event_id(), bad ? bad_key : fmt::format("key-{}", i % 99), i};
            if (bad)
                bad_offsets.push_back(i);
            events.push_back(e);
            pub.publish(topic, e.entity, encode(e)); // one at a time: offset i is event i
        }
        pub.flush();
    }

    ConsumerConfig config() const
    {
        auto cfg = consumer_config(group, topic);
        cfg.ordering = Ordering::key;
        cfg.workers = 2;
        cfg.max_batch = 100;
        cfg.retry_backoff = backoff;
        cfg.retry_backoff_max = backoff;
        cfg.max_attempts = 20;
        return cfg;
    }

    void insert(pqxx::work& tx, const TestEvent& e, const Context& ctx) const
    {
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, entity, kafka_offset, attempt)"
                                            " VALUES ($1::uuid, $2, $3, $4)",
                                            effects),
                                e.id.to_string(), e.entity, ctx.offset(), ctx.attempt());
    }

    std::int64_t count(const std::string& where) const
    {
        return scalar(fmt::format("SELECT count(*) FROM {} WHERE {}", effects, where));
    }
    std::int64_t others() const { return count(fmt::format("entity <> '{}'", bad_key)); }
    std::int64_t bads() const { return count(fmt::format("entity = '{}'", bad_key)); }

    // Every event once, nothing else; the bad key's effects in offset order.
    void check_exact() const
    {
        const auto n = static_cast<std::int64_t>(events.size());
        CHECK(count("true") == n);
        CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", effects)) == n);
        CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group)) == n);
        CHECK(bads() == static_cast<std::int64_t>(bad_offsets.size()));
        // Out of order: a later record of the key committed before an earlier one.
        CHECK(scalar(fmt::format("SELECT count(*) FROM {0} a JOIN {0} b ON a.entity = b.entity AND a.seq < b.seq"
                                 " WHERE a.entity = '{1}' AND a.kafka_offset > b.kafka_offset",
                                 effects, bad_key)) == 0);
        CHECK(committed_offset(group, topic, 0) == n);
    }
};

template <class F> bool run_until(Consumer& c, F&& done, std::chrono::seconds timeout = 90s)
{
    Runner<Consumer> run(c);
    const bool ok = wait_until(std::forward<F>(done), timeout);
    run.join();
    if (auto e = run.error()) {
        try {
            std::rethrow_exception(e);
        } catch (const std::exception& ex) {
            FAIL("run() threw: " << ex.what());
        }
    }
    return ok;
}

const char* env(const char* name)
{
    const char* v = std::getenv(name);
    return v ? v : "";
}

} // namespace

TEST_CASE("a failing key parks only itself: the other keys of its partition flow, its records keep their order",
          "[fault][parking]")
{
    ParkingFixture f;
    const auto bad_first = f.bad_offsets.front();
    std::atomic<int> failures{0};
    Consumer c(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (ctx.offset() == bad_first && ctx.attempt() <= 4) {
            ++failures;
            throw std::runtime_error("payment provider unavailable");
        }
    });
    const auto others = static_cast<std::int64_t>(f.events.size() - f.bad_offsets.size());
    Runner<Consumer> run(c);
    // The other keys do not wait for the four backoffs (4 s) of the bad key.
    REQUIRE(wait_until([&] { return f.others() == others; }, 60s));
    const bool bad_still_parked = f.bads() == 0;
    // While the bad key is parked, Kafka's committed offset stays at its first record.
    const auto committed_while_parked = committed_offset(f.group, f.topic, 0);
    const auto m_parked = c.metrics().snapshot();
    REQUIRE(wait_until([&] { return f.bads() == static_cast<std::int64_t>(f.bad_offsets.size()); }, 60s));
    REQUIRE(wait_until(
        [&] { return committed_offset(f.group, f.topic, 0) == static_cast<std::int64_t>(f.events.size()); }, 30s));
    run.join();
    REQUIRE(!run.error());

    // Measured from the first effect (the group join before it is not the point).
    const auto span_ms = [&](const std::string& where) {
        return scalar(fmt::format("SELECT (extract(epoch FROM max(at) - (SELECT min(at) FROM {0})) * 1000)::bigint"
                                  " FROM {0} WHERE {1}",
                                  f.effects, where));
    };
    const auto others_ms = span_ms(fmt::format("entity <> '{}'", bad_key));
    const auto bad_ms = span_ms(fmt::format("entity = '{}'", bad_key));
    WARN(fmt::format("from the first effect: the {} records of the other keys done in {} ms, the bad key's {} in {} "
                     "ms (4 failures, backoff {} ms)",
                     others, others_ms, f.bad_offsets.size(), bad_ms, std::chrono::milliseconds(backoff).count()));
    CHECK(others_ms < bad_ms);
    CHECK(failures == 4);
    CHECK(bad_still_parked);
    CHECK(committed_while_parked <= bad_first);
    CHECK(m_parked.parked_keys >= 1);
    CHECK(bad_ms >= 4 * std::chrono::milliseconds(backoff).count() * 9 / 10); // the backoff was honoured
    const auto m = c.metrics().snapshot();
    CHECK(m.handler_failures == 4);
    CHECK(m.retries == 4);
    CHECK(m.parked >= f.bad_offsets.size());
    CHECK(m.parking_overflows == 0);
    CHECK(m.dead_lettered_total() == 0);
    // Every other-key effect committed before the bad record's success.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {0} WHERE entity <> '{1}' AND at > (SELECT min(at) FROM {0} WHERE "
                             "entity = '{1}')",
                             f.effects, bad_key)) == 0);
    f.check_exact();
}

// Run by the next test in a child process (then killed with SIGKILL): a
// consumer whose bad key always fails, with the fixture named by the environment.
TEST_CASE("parking child", "[.][parking-child]")
{
    auto cfg = consumer_config(env("IK_PARK_GROUP"), env("IK_PARK_TOPIC"));
    cfg.ordering = Ordering::key;
    cfg.workers = 2;
    cfg.max_batch = 20; // many small batches: others progress while the key is parked
    cfg.retry_backoff = backoff;
    cfg.retry_backoff_max = backoff;
    cfg.max_attempts = 1000;
    const std::string table = env("IK_PARK_TABLE");
    const std::string marks = env("IK_PARK_MARKS");
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, entity, kafka_offset, attempt)"
                                            " VALUES ($1::uuid, $2, $3, $4)",
                                            table),
                                e.id.to_string(), e.entity, ctx.offset(), ctx.attempt());
        if (e.entity == bad_key) {
            std::ofstream(marks, std::ios::app) << ctx.offset() << '\n';
            throw std::runtime_error("payment provider unavailable");
        }
    });
    c.run(); // until killed
}

TEST_CASE("SIGKILL while a key is parked: after a restart every record is processed once, the key in order",
          "[fault][parking]")
{
    ParkingFixture f;
    const std::string marks = fmt::format("/tmp/{}.marks", f.effects);
    std::remove(marks.c_str());
    const pid_t pid = spawn_self("[parking-child]", {"IK_PARK_GROUP=" + f.group, "IK_PARK_TOPIC=" + f.topic,
                                                     "IK_PARK_TABLE=" + f.effects, "IK_PARK_MARKS=" + marks});
    struct Reap {
        pid_t pid;
        ~Reap()
        {
            if (pid <= 0)
                return;
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    } reap{pid};

    auto failed_calls = [&] {
        std::ifstream in(marks);
        return static_cast<int>(std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
    };
    // Killed while the key is parked (failed at least twice) and the other
    // keys have moved past its first record.
    const bool parked = wait_until(
        [&] { return failed_calls() >= 2 && f.count(fmt::format("kafka_offset > {}", f.bad_offsets.front())) >= 200; },
        60s);
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    reap.pid = -1;
    REQUIRE(parked);
    REQUIRE(WIFSIGNALED(status));
    const auto before = f.count("true");
    INFO("effects when killed: " << before);
    CHECK(f.bads() == 0);
    CHECK(committed_offset(f.group, f.topic, 0) <= f.bad_offsets.front());

    // The restarted member: the bad key fails once more, then succeeds.
    Consumer c(f.config(), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (e.entity == bad_key && ctx.offset() == f.bad_offsets.front() && ctx.attempt() == 1)
            throw std::runtime_error("payment provider unavailable");
    });
    REQUIRE(run_until(c, [&] {
        return f.count("true") == static_cast<std::int64_t>(f.events.size()) &&
               committed_offset(f.group, f.topic, 0) == static_cast<std::int64_t>(f.events.size());
    }));
    f.check_exact();
    std::remove(marks.c_str());
}
