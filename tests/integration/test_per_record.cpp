// Several transactions per unit of work, each COMMIT carrying the next
// transaction's claim: ConsumerConfig::transaction_per_record (a transaction
// per record inside a unit of max_batch records) and batches_per_unit
// (transactions of max_batch records, several per unit). Every test counts
// effects, handler calls and transactions in the database.

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

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

// A consumer of a transaction per record over a fresh topic, with an effect
// table its handler writes to: the event, the server transaction's id, the
// record's coordinates, and the session's statement_timeout as the handler
// found it.
struct PerRecord {
    std::string topic = unique_name("perrec");
    std::string group = unique_name("g");
    std::string effects = unique_name("effect");
    std::vector<TestEvent> events;
    std::mutex mu;
    std::map<EventId, int> calls;   // handler calls per event
    std::vector<BatchInfo> commits; // after_db_commit, in order

    explicit PerRecord(int partitions)
    {
        create_topic(topic, partitions);
        exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, txid bigint NOT NULL, "
                         "kafka_partition int NOT NULL, kafka_offset bigint NOT NULL, statement_timeout text NOT NULL)",
                         effects));
    }

    // `unique` events, then `resends` of them again (same payload, new offsets).
    void publish(int unique, int resends = 0)
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < unique; ++i) {
            events.push_back(TestEvent{new_event_id(), fmt::format("order-{}", i % 7), i});
            pub.publish_async(topic, events.back().entity, encode(events.back()));
        }
        std::mt19937 rng(11);
        for (int i = 0; i < resends; ++i) {
            const auto& again = events[rng() % events.size()];
            pub.publish_async(topic, again.entity, encode(again));
        }
        pub.flush();
    }

    // A transaction per record in units of `max_batch`; or, with `unit`,
    // transactions of `max_batch` records, `unit` of them per unit.
    ConsumerConfig config(std::size_t max_batch, std::size_t unit = 0)
    {
        auto cfg = consumer_config(group, topic);
        cfg.transaction_per_record = unit == 0;
        cfg.batches_per_unit = unit == 0 ? 1 : unit;
        cfg.max_batch = max_batch;
        cfg.hooks.after_db_commit = [this](const BatchInfo& info) {
            std::lock_guard<std::mutex> lock(mu);
            commits.push_back(info);
        };
        return cfg;
    }

    // The effect of a handler call, and its count.
    void effect(pqxx::work& tx, const TestEvent& e, const Context& ctx)
    {
        {
            std::lock_guard<std::mutex> lock(mu);
            ++calls[e.id];
        }
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, txid, kafka_partition, kafka_offset, "
                                            "statement_timeout) VALUES ($1::uuid, txid_current(), $2, $3, "
                                            "current_setting('statement_timeout'))",
                                            effects),
                                e.id.to_string(), ctx.partition(), ctx.offset());
    }

    std::int64_t rows() const { return scalar("SELECT count(*) FROM " + effects); }
    std::size_t records_committed()
    {
        std::lock_guard<std::mutex> lock(mu);
        std::size_t n = 0;
        for (const auto& c : commits)
            n += c.records;
        return n;
    }
    int calls_of(const EventId& id)
    {
        std::lock_guard<std::mutex> lock(mu);
        auto c = calls.find(id);
        return c == calls.end() ? 0 : c->second;
    }
    // A run without failures: the metrics' claims and duplicates, and the
    // group's claim rows.
    void check_clean_run(const MetricsSnapshot& m, std::uint64_t claimed, std::uint64_t duplicates) const
    {
        CHECK(m.claimed == claimed);
        CHECK(m.duplicates == duplicates);
        CHECK(m.handler_failures == 0);
        CHECK(m.db_failures == 0);
        CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group)) ==
              static_cast<std::int64_t>(claimed));
    }
    // The most effects one server transaction wrote.
    std::int64_t largest_transaction() const
    {
        return scalar(
            fmt::format("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {} GROUP BY txid) t", effects));
    }
    // Events whose handler ran other than once.
    int not_once(const EventId* except = nullptr)
    {
        std::lock_guard<std::mutex> lock(mu);
        int n = 0;
        for (const auto& e : events)
            if ((!except || !(e.id == *except)) && calls[e.id] != 1)
                ++n;
        return n;
    }
};

// 80 records over two partitions, record 30's handler throwing at its first
// attempt (`unit`: see PerRecord::config): it runs twice, and besides it
// at most the records of its transaction run again (`most_again` in all:
// 1 with a transaction per record); every record has its one effect, and
// its partition's order is kept.
void failing_record(std::size_t max_batch, std::size_t unit, int most_again)
{
    PerRecord s(2);
    s.publish(80);
    const EventId target = s.events[30].id;
    Consumer c(s.config(max_batch, unit), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                   s.effect(tx, e, ctx); // written, then rolled back on the throw
                   if (e.id == target && ctx.attempt() == 1)
                       throw std::runtime_error("payment provider timed out");
               });
    run_until(c, [&] { return s.rows() == 80; });
    const auto m = c.metrics().snapshot();
    CHECK(m.handler_failures == 1);
    CHECK(s.calls_of(target) == 2);
    // The records of the transactions before it committed and were not run again.
    int again = 0;
    {
        std::lock_guard<std::mutex> lock(s.mu);
        for (const auto& e : s.events)
            again += s.calls[e.id] > 1 ? 1 : 0;
    }
    CHECK(again >= 1);
    CHECK(again <= most_again);
    CHECK(m.claimed == 80);
    CHECK(s.rows() == 80);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 80);
    CHECK(s.largest_transaction() <= static_cast<std::int64_t>(unit == 0 ? 1 : max_batch));
    // Order within the failed record's partition is kept.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {0} a JOIN {0} t ON t.event_id = '{1}' "
                             "WHERE a.kafka_partition = t.kafka_partition AND a.kafka_offset > t.kafka_offset "
                             "AND a.seq < t.seq",
                             s.effects, target.to_string())) == 0);
}

// Another session holds the claim of record 5 of 20 (one partition) in an
// open transaction, so the claim that the COMMIT before it carries waits:
// the consumer (`unit`: see PerRecord::config) commits the `before` records
// ahead of it, and once the claim is given up the rest. The COMMIT before
// the failed claim went through; its records ran again and found their
// claims: no handler ran twice, nothing is lost.
void next_claim_held(std::size_t max_batch, std::size_t unit, std::int64_t before)
{
    PerRecord s(1);
    s.publish(20);
    const EventId held = s.events[5].id;
    pqxx::connection blocker(pg());
    pqxx::work hold(blocker);
    hold.exec(fmt::format("INSERT INTO processed_event (event_id, consumer_group) VALUES ('{}', '{}')",
                          held.to_string(), s.group));
    auto cfg = s.config(max_batch, unit);
    cfg.max_batch_wait = 2s; // one unit of all 20
    cfg.lock_timeout = 300ms;
    cfg.retry_backoff = 100ms;
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { s.effect(tx, e, ctx); });
    {
        Runner<Consumer> run(c);
        REQUIRE(wait_until([&] { return c.metrics().snapshot().lock_timeouts >= 2; }, 60s));
        CHECK(s.rows() == before);
        hold.abort(); // the other session gives the claim up
        const bool done = wait_until([&] { return s.rows() == 20; }, 60s);
        run.join();
        REQUIRE_FALSE(run.error());
        REQUIRE(done);
    }
    CHECK(s.not_once() == 0);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 20);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", s.group)) == 20);
}

// With offsets_in_database, 60 records over two partitions: what the
// transactions before a handler's stored is never past its record, each
// transaction holds at most `max_batch` (with `unit`) or one record, and the
// positions end past every record.
void positions_never_ahead(std::size_t max_batch, std::size_t unit)
{
    PerRecord s(2);
    s.publish(60);
    auto cfg = s.config(max_batch, unit);
    cfg.offsets_in_database = true;
    std::atomic<int> ahead{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        const auto stored = detail::pg::exec_params(tx,
                                                    "SELECT coalesce(max(next_offset), 0) FROM consumer_offset "
                                                    "WHERE consumer_group = $1 AND topic = $2 AND partition = $3",
                                                    s.group, s.topic, ctx.partition())[0][0]
                                .as<std::int64_t>();
        if (stored > ctx.offset())
            ++ahead;
        s.effect(tx, e, ctx);
    });
    run_until(c, [&] { return s.rows() == 60; });
    CHECK(ahead == 0);
    CHECK(s.not_once() == 0);
    CHECK(s.largest_transaction() <= static_cast<std::int64_t>(unit == 0 ? 1 : max_batch));
    CHECK(scalar(fmt::format("SELECT sum(next_offset) FROM consumer_offset WHERE consumer_group = '{}'", s.group)) ==
          60);
}

} // namespace

TEST_CASE("transaction_per_record: each record commits alone, after_db_commit once per transaction", "[integration]")
{
    PerRecord s(3);
    s.publish(120, 30);
    Consumer c(s.config(40), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { s.effect(tx, e, ctx); });
    run_until(c, [&] { return s.records_committed() == 150; });
    const auto m = c.metrics().snapshot();
    CHECK(s.rows() == 120);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 120);
    // A server transaction per effect.
    CHECK(scalar(fmt::format("SELECT count(DISTINCT txid) FROM {}", s.effects)) == 120);
    CHECK(s.not_once() == 0);
    {
        std::lock_guard<std::mutex> lock(s.mu);
        REQUIRE(s.commits.size() == 150); // the re-sends too: a transaction that finds the claim taken
        std::size_t claimed = 0, duplicates = 0, single = 0;
        for (const auto& info : s.commits) {
            claimed += info.claimed;
            duplicates += info.duplicates;
            single += info.records == 1 ? 1 : 0;
        }
        CHECK(single == 150);
        CHECK(claimed == 120);
        CHECK(duplicates == 30);
    }
    CHECK(m.db_commits == 150);
    s.check_clean_run(m, 120, 30);
}

TEST_CASE("transaction_per_record: a failing record holds back only its partition's tail; what committed stays",
          "[integration]")
{
    failing_record(40, 0, 1); // every other record committed alone, before or after it
}

TEST_CASE("transaction_per_record: a handler's session SET stops the next claim; later records run clean, each once",
          "[integration]")
{
    PerRecord s(1);
    s.publish(60);
    const EventId setter = s.events[10].id;
    Consumer c(s.config(30), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        s.effect(tx, e, ctx);
        if (e.id == setter)
            tx.exec("SET statement_timeout = '4321ms'"); // the session's, not the transaction's
    });
    run_until(c, [&] { return s.rows() == 60; });
    const auto m = c.metrics().snapshot();
    // The record whose COMMIT began the next transaction committed: the
    // check stopped the next claim after it, so it did not run again.
    CHECK(s.not_once() == 0);
    // No later handler found the setting.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE statement_timeout <> '0'", s.effects)) == 0);
    CHECK(m.claimed == 60);
    CHECK(m.db_commits == 60);
    CHECK(m.handler_failures == 0);
    CHECK(m.db_failures == 0);
}

TEST_CASE("transaction_per_record: the next record's claim held by another session; nothing lost, nothing run twice",
          "[integration]")
{
    next_claim_held(20, 0, 5); // records 0 to 4 committed, each alone
}

TEST_CASE("transaction_per_record with offsets_in_database: each transaction stores its own record's position",
          "[integration]")
{
    positions_never_ahead(30, 0);
}

TEST_CASE("batches_per_unit: transactions of max_batch records, several per unit, each effect once", "[integration]")
{
    PerRecord s(3);
    s.publish(120, 30);
    Consumer c(s.config(10, 4), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { s.effect(tx, e, ctx); });
    run_until(c, [&] { return s.records_committed() == 150; });
    const auto m = c.metrics().snapshot();
    CHECK(s.rows() == 120);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 120);
    CHECK(s.largest_transaction() <= 10);
    // At least the 12 transactions 120 effects need, each with a commit of its own.
    CHECK(scalar(fmt::format("SELECT count(DISTINCT txid) FROM {}", s.effects)) >= 12);
    CHECK(s.not_once() == 0);
    {
        std::lock_guard<std::mutex> lock(s.mu);
        std::size_t claimed = 0, duplicates = 0, largest = 0;
        for (const auto& info : s.commits) {
            claimed += info.claimed;
            duplicates += info.duplicates;
            largest = std::max(largest, info.records);
        }
        CHECK(largest <= 10);
        CHECK(claimed == 120);
        CHECK(duplicates == 30);
        CHECK(m.db_commits == s.commits.size());
    }
    s.check_clean_run(m, 120, 30);
}

TEST_CASE("batches_per_unit: a failing record holds back its partition's tail; earlier transactions stay committed",
          "[integration]")
{
    failing_record(8, 5, 8); // its transaction's records handled before it ran again
}

TEST_CASE("batches_per_unit: a handler's session SET stops the next claim; later transactions run clean, each once",
          "[integration]")
{
    PerRecord s(1);
    s.publish(60);
    const EventId setter = s.events[10].id;
    Consumer c(s.config(4, 5), decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        s.effect(tx, e, ctx);
        if (e.id == setter)
            tx.exec("SET statement_timeout = '4321ms'"); // the session's, not the transaction's
    });
    run_until(c, [&] { return s.rows() == 60; });
    const auto m = c.metrics().snapshot();
    CHECK(s.not_once() == 0);
    // The setter's transaction committed with it: only the handlers after
    // the setter in that transaction found it; none of a later transaction.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {0} a JOIN {0} t ON t.event_id = '{1}' "
                             "WHERE a.statement_timeout <> '0' AND a.txid <> t.txid",
                             s.effects, setter.to_string())) == 0);
    CHECK(m.claimed == 60);
    CHECK(m.db_commits >= 15);
    CHECK(s.largest_transaction() <= 4);
    CHECK(m.handler_failures == 0);
    CHECK(m.db_failures == 0);
}

TEST_CASE("batches_per_unit: the next transaction's claim held by another session; nothing lost, nothing run twice",
          "[integration]")
{
    next_claim_held(4, 5, 4); // records 0 to 3 committed; the claim of 4 to 7 waits
}

TEST_CASE("batches_per_unit with offsets_in_database: each transaction stores the positions of its own records",
          "[integration]")
{
    positions_never_ahead(6, 5);
}
