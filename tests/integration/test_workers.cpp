// Parallel paths: several workers, per-key ordering, bounded batches. These
// test correctness (exact effects, kept order), not speed.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/entity_lock.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

struct Setup {
    std::string topic = unique_name("workers");
    std::string group = unique_name("g");
    std::string effects = unique_name("effect");

    explicit Setup(int partitions)
    {
        create_topic(topic, partitions);
        exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, entity text NOT NULL,"
                         " n bigint NOT NULL, kafka_partition int NOT NULL, worker text NOT NULL)",
                         effects));
    }

    void insert(pqxx::work& tx, const TestEvent& e, const Context& ctx) const
    {
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, entity, n, kafka_partition, worker)"
                                            " VALUES ($1::uuid, $2, $3, $4, $5)",
                                            effects),
                                e.id.to_string(), e.entity, e.amount, ctx.partition(),
                                std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())));
    }

    std::int64_t rows() const { return scalar("SELECT count(*) FROM " + effects); }

    void check_exact(std::int64_t unique) const
    {
        CHECK(rows() == unique);
        CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == unique);
        CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group)) == unique);
    }
};

// `unique` events over `keys` keys, amount = sequence number within its key,
// plus `resends` re-sends of earlier events (same payload and key).
std::int64_t publish_keyed(const std::string& topic, int unique, int keys, int resends)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    std::vector<TestEvent> sent;
    std::map<std::string, int> next_seq;
    for (int i = 0; i < unique; ++i) {
        const auto key = fmt::format("key-{}", i % keys);
        TestEvent e{new_event_id(), key, next_seq[key]++};
        sent.push_back(e);
        pub.publish_async(topic, key, encode(e));
        if (resends > 0 && i % 3 == 2) {
            const auto& again = sent[static_cast<std::size_t>(i) / 2];
            pub.publish_async(topic, again.entity, encode(again));
            --resends;
        }
    }
    pub.flush();
    return unique;
}

void run_to_completion(Consumer& c, const std::function<bool()>& done)
{
    Runner<Consumer> run(c);
    const bool ok = wait_until(done, 120s);
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(ok);
}

} // namespace

TEST_CASE("4 workers over 16 partitions with 30% duplicates: exact effects", "[integration]")
{
    Setup s(16);
    const int unique = 3000;
    publish_keyed(s.topic, unique, 200, 900); // 900 re-sends = 30% of 3000
    auto cfg = consumer_config(s.group, s.topic);
    cfg.workers = 4;
    cfg.max_batch = 200;
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        s.insert(tx, e, ctx);
        ++calls;
    });
    run_to_completion(c, [&] { return c.metrics().snapshot().consumed >= 3900 && c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(m.consumed == 3900);
    CHECK(m.claimed == static_cast<std::uint64_t>(unique));
    CHECK(m.duplicates == 900);
    CHECK(calls == unique);
    s.check_exact(unique);
    // The work was really spread: more than one worker thread wrote effects.
    CHECK(scalar("SELECT count(DISTINCT worker) FROM " + s.effects) > 1);
    // Per-partition order: within a key (one partition) the sequence never goes back.
    CHECK(scalar(fmt::format("SELECT count(*) FROM (SELECT n, lag(n) OVER (PARTITION BY entity ORDER BY seq) AS prev"
                             " FROM {}) t WHERE prev IS NOT NULL AND n <= prev",
                             s.effects)) == 0);
}

TEST_CASE("per-key mode: one hot partition uses several workers, each key stays in order", "[integration]")
{
    Setup s(1);
    const int unique = 2000;
    publish_keyed(s.topic, unique, 40, 300);
    auto cfg = consumer_config(s.group, s.topic);
    cfg.workers = 4;
    cfg.ordering = Ordering::key;
    cfg.max_batch = 250;
    // One failure in the middle: its key (and partition tail) is retried while
    // other keys' records of the same batch commit.
    std::atomic<bool> failed{false};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        s.insert(tx, e, ctx);
        if (e.entity == "key-7" && e.amount == 20 && !failed.exchange(true))
            throw std::runtime_error("transient");
    });
    run_to_completion(c, [&] { return s.rows() == unique && c.metrics().snapshot().lag == 0; });
    s.check_exact(unique);
    CHECK(failed);
    CHECK(c.metrics().snapshot().handler_failures == 1);
    // Several workers took records of the single partition ...
    CHECK(scalar("SELECT count(DISTINCT worker) FROM " + s.effects) > 1);
    // ... and every key's events committed in their order: 0, 1, 2, ...
    CHECK(scalar(fmt::format("SELECT count(*) FROM (SELECT n, row_number() OVER (PARTITION BY entity ORDER BY seq) - 1"
                             " AS expected FROM {}) t WHERE n <> expected",
                             s.effects)) == 0);
}

TEST_CASE("small batch and prefetch caps bound what is in flight without losing anything", "[integration]")
{
    Setup s(4);
    const int unique = 2000;
    publish_keyed(s.topic, unique, 100, 0);
    auto cfg = consumer_config(s.group, s.topic);
    cfg.max_batch = 1000;
    cfg.max_batch_bytes = 4096;         // records are 45..60 bytes with their key: at most ~92 per batch
    cfg.max_prefetch_bytes = 64 * 1024; // the client pauses fetching beyond this
    std::atomic<std::size_t> largest{0};
    cfg.hooks.after_db_commit = [&](const BatchInfo& info) {
        if (info.records > largest)
            largest = info.records;
    };
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { s.insert(tx, e, ctx); });
    run_to_completion(c, [&] { return s.rows() == unique && c.metrics().snapshot().lag == 0; });
    s.check_exact(unique);
    CHECK(largest > 0);
    CHECK(largest <= 4096 / 45 + 1);
    CHECK(c.metrics().snapshot().db_commits >= static_cast<std::uint64_t>(unique / (4096 / 45 + 1)));
}

TEST_CASE("lock_entity serialises read-modify-write of one entity across consumer groups", "[integration]")
{
    // Two groups (say, billing and a ledger) update the same account from the
    // same events; without the lock their read-modify-write would lose updates.
    Setup s(2);
    const auto accounts = unique_name("account");
    exec(fmt::format("CREATE TABLE {} (id text PRIMARY KEY, balance bigint NOT NULL)", accounts));
    exec(fmt::format("INSERT INTO {} VALUES ('acct-1', 0)", accounts));
    publish_keyed(s.topic, 200, 7, 0); // amounts are per-key sequence numbers
    auto handler = [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        lock_entity(tx, "acct-1");
        const auto balance =
            tx.exec(fmt::format("SELECT balance FROM {} WHERE id = 'acct-1'", accounts))[0][0].as<std::int64_t>();
        std::this_thread::sleep_for(std::chrono::microseconds(200)); // widen the race window
        detail::pg::exec_params(tx, fmt::format("UPDATE {} SET balance = $1 WHERE id = 'acct-1'", accounts),
                                balance + e.amount);
    };
    auto c1 = consumer_config(unique_name("billing"), s.topic);
    auto c2 = consumer_config(unique_name("ledger"), s.topic);
    c1.max_batch = c2.max_batch = 20;
    Consumer a(c1, decode, event_id_of, handler);
    Consumer b(c2, decode, event_id_of, handler);
    {
        Runner<Consumer> ra(a);
        Runner<Consumer> rb(b);
        REQUIRE(wait_until(
            [&] { return a.metrics().snapshot().claimed == 200 && b.metrics().snapshot().claimed == 200; }, 120s));
        ra.join();
        rb.join();
        REQUIRE_FALSE(ra.error());
        REQUIRE_FALSE(rb.error());
    }
    // Each key k has ceil((200-k)/7) events with amounts 0,1,2,...: sum them.
    std::int64_t one_group = 0;
    for (int k = 0; k < 7; ++k) {
        const int n = (200 - k + 6) / 7;
        one_group += static_cast<std::int64_t>(n) * (n - 1) / 2;
    }
    CHECK(scalar(fmt::format("SELECT balance FROM {} WHERE id = 'acct-1'", accounts)) == 2 * one_group);
}

// A slow handler call holds back only its own key, never the other workers:
// one key's call blocks until the test releases it, and records of other keys
// published after it started all commit meanwhile (no batch waits for its
// slowest worker).
TEST_CASE("per-key mode: one blocked handler call does not hold back other keys' later records", "[integration]")
{
    Setup s(4);
    auto cfg = consumer_config(s.group, s.topic);
    cfg.workers = 4;
    cfg.ordering = Ordering::key;
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false;
    bool released = false;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        s.insert(tx, e, ctx);
        if (e.entity != "slow")
            return;
        std::unique_lock<std::mutex> lock(mu);
        entered = true;
        cv.notify_all();
        // Bounded, so that a failing case ends instead of hanging.
        cv.wait_for(lock, 60s, [&] { return released; });
    });
    auto release = [&] {
        std::lock_guard<std::mutex> lock(mu);
        released = true;
        cv.notify_all();
    };
    publish_keyed(s.topic, 1, 1, 0); // "key-0": warms the group up
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return s.rows() == 1; }, 60s));
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish_async(s.topic, "slow", encode(TestEvent{new_event_id(), "slow", 0}));
        pub.flush();
    }
    const bool blocked = wait_until(
        [&] {
            std::lock_guard<std::mutex> lock(mu);
            return entered;
        },
        60s);
    if (!blocked)
        release();
    REQUIRE(blocked);
    const int others = 200;
    publish_keyed(s.topic, others, 20, 0); // keys key-0 .. key-19, none of them "slow"
    const auto other_rows = [&] {
        return scalar(fmt::format("SELECT count(*) FROM {} WHERE entity <> 'slow'", s.effects));
    };
    // A hang guard, not a timing threshold: 200 fast records take well under a second.
    const bool others_done = wait_until([&] { return other_rows() == 1 + others; }, 15s);
    const auto slow_rows_meanwhile = scalar(fmt::format("SELECT count(*) FROM {} WHERE entity = 'slow'", s.effects));
    release();
    const bool all_done = wait_until([&] { return s.rows() == 2 + others && c.metrics().snapshot().lag == 0; }, 60s);
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(all_done);
    s.check_exact(2 + others);
    CHECK(slow_rows_meanwhile == 0); // its transaction was still open
    CHECK(others_done);
}
