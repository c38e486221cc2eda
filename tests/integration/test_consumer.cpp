// End-to-end: IdempotentConsumer against a real PostgreSQL and a
// Kafka-protocol broker. Every test counts effects in the database.

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

// One effect table per test: the business write each handler call makes.
std::string make_effect_table(const std::string& name)
{
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, entity text NOT NULL,"
                     " grp text NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)",
                     name));
    return name;
}

void insert_effect(pqxx::work& tx, const std::string& table, const TestEvent& e, const Context& ctx,
                   const std::string& group)
{
    detail::pg::exec_params(tx,
                            fmt::format("INSERT INTO {} (event_id, entity, grp, kafka_partition, kafka_offset)"
                                        " VALUES ($1::uuid, $2, $3, $4, $5)",
                                        table),
                            e.id.to_string(), e.entity, group, ctx.partition(), ctx.offset());
}

std::int64_t claims(const std::string& group)
{
    return scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group));
}

// Publishes `unique` new events and `resends` re-sends of earlier ones (same
// payload, so the same event id arrives again at a new offset).
std::vector<TestEvent> publish_events(const std::string& topic, int unique, int resends, unsigned seed = 7)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    std::vector<TestEvent> events;
    std::mt19937 rng(seed);
    for (int i = 0; i < unique; ++i) {
        TestEvent e{new_event_id(), fmt::format("order-{}", i), 100 + i};
        events.push_back(e);
        pub.publish_async(topic, e.entity, encode(e));
        if (resends > 0 && i > 0 && rng() % static_cast<unsigned>(unique) < static_cast<unsigned>(resends)) {
            const auto& again = events[rng() % events.size()];
            pub.publish_async(topic, again.entity, encode(again));
            --resends;
        }
    }
    while (resends-- > 0) {
        const auto& again = events[rng() % events.size()];
        pub.publish_async(topic, again.entity, encode(again));
    }
    pub.flush();
    return events;
}

} // namespace

TEST_CASE("duplicates with new offsets are skipped by event id", "[integration]")
{
    for (std::size_t max_batch : {std::size_t(500), std::size_t(1)}) {
        INFO("max_batch = " << max_batch);
        const auto topic = unique_name("dup");
        const auto group = unique_name("g");
        create_topic(topic, 3);
        const auto effects = make_effect_table(unique_name("effect"));
        const auto events = publish_events(topic, 700, 300);

        auto cfg = consumer_config(group, topic);
        cfg.max_batch = max_batch;
        std::atomic<int> calls{0};
        Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            insert_effect(tx, effects, e, ctx, group);
            ++calls;
        });
        {
            Runner<Consumer> run(consumer);
            REQUIRE(wait_until([&] { return consumer.metrics().snapshot().consumed >= 1000; }, 60s));
            run.join();
            REQUIRE_FALSE(run.error());
        }
        const auto m = consumer.metrics().snapshot();
        CHECK(m.consumed == 1000);
        CHECK(m.claimed == 700);
        CHECK(m.duplicates == 300);
        CHECK(calls == 700);
        CHECK(scalar("SELECT count(*) FROM " + effects) == 700);
        CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 700);
        CHECK(claims(group) == 700);
        CHECK(m.decode_errors == 0);
        CHECK(m.handler_failures == 0);
    }
}

TEST_CASE("crash after the DB commit and before the offset commit repeats no handler call", "[integration]")
{
    const auto topic = unique_name("crash");
    const auto group = unique_name("g");
    create_topic(topic, 2);
    const auto effects = make_effect_table(unique_name("effect"));
    publish_events(topic, 200, 0);

    struct SimulatedCrash {};
    std::atomic<int> first_calls{0};
    BatchInfo crashed_batch;
    {
        auto cfg = consumer_config(group, topic);
        cfg.max_batch = 1000;
        cfg.max_batch_wait = 3s; // all 200 records in one batch
        cfg.hooks.after_db_commit = [&](const BatchInfo& info) {
            crashed_batch = info;
            throw SimulatedCrash{};
        };
        Consumer a(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            insert_effect(tx, effects, e, ctx, group);
            ++first_calls;
        });
        REQUIRE_THROWS_AS(a.run(), SimulatedCrash);
    }
    // The batch is in PostgreSQL, its offsets are not in Kafka.
    REQUIRE(crashed_batch.claimed > 0);
    REQUIRE(scalar("SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(crashed_batch.claimed));

    std::atomic<int> second_calls{0};
    auto cfg = consumer_config(group, topic);
    Consumer b(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, effects, e, ctx, group);
        ++second_calls;
    });
    {
        Runner<Consumer> run(b);
        REQUIRE(wait_until([&] { return b.metrics().snapshot().consumed >= 200; }, 60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = b.metrics().snapshot();
    CHECK(m.consumed == 200);                     // every record came again: no offset was committed
    CHECK(m.duplicates == crashed_batch.claimed); // ... and dedup absorbed the committed ones
    CHECK(second_calls == 200 - static_cast<int>(crashed_batch.claimed));
    CHECK(first_calls + second_calls == 200);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 200);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 200);
    CHECK(claims(group) == 200);
}

TEST_CASE("run() left by an exception while other workers hold units: the consumer is destroyed cleanly",
          "[integration]")
{
    // The after_db_commit hook throws at the first merge while a second
    // worker still holds a unit: the consumer's destruction must wait for
    // that unit, and the last revoke of its close must find a consistent
    // state (run under AddressSanitizer by the asan lane).
    const auto topic = unique_name("crash_units");
    const auto group = unique_name("g");
    create_topic(topic, 4);
    const auto effects = make_effect_table(unique_name("effect"));
    publish_events(topic, 40, 0);

    struct SimulatedCrash {};
    std::atomic<int> calls{0};
    std::atomic<int> second_started{0};
    std::atomic<bool> thrown{false};
    {
        auto cfg = consumer_config(group, topic);
        cfg.workers = 4;
        cfg.max_batch = 4;            // a unit of one record per worker
        cfg.ordering = Ordering::key; // every record a lane of its own (one key each): any worker takes any
        cfg.hooks.after_db_commit = [&](const BatchInfo&) {
            thrown = true;
            throw SimulatedCrash{};
        };
        Consumer a(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            insert_effect(tx, effects, e, ctx, group);
            // The first call waits until a second unit runs; every later
            // call waits until the hook has thrown: when it does, a unit is
            // in flight.
            if (calls.fetch_add(1) == 0)
                wait_until([&] { return second_started.load() > 0; }, 10s);
            else {
                ++second_started;
                wait_until([&] { return thrown.load(); }, 10s);
            }
        });
        REQUIRE_THROWS_AS(a.run(), SimulatedCrash);
        CHECK(second_started > 0);
    } // destroyed here: the units in flight end and nothing more is committed
    REQUIRE(thrown);

    // Nothing was committed to Kafka: every record comes again, dedup absorbs
    // what PostgreSQL holds, and each event has its effect once.
    auto cfg = consumer_config(group, topic);
    cfg.workers = 4;
    Consumer b(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, effects, e, ctx, group);
    });
    {
        Runner<Consumer> run(b);
        REQUIRE(wait_until([&] { return b.metrics().snapshot().consumed >= 40; }, 60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    CHECK(b.metrics().snapshot().consumed == 40);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 40);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 40);
    CHECK(claims(group) == 40);
}

TEST_CASE("a handler that throws once: rolled back, retried, offset never passes it", "[integration]")
{
    const auto topic = unique_name("retry");
    const auto group = unique_name("g");
    create_topic(topic, 2);
    const auto effects = make_effect_table(unique_name("effect"));
    const auto events = publish_events(topic, 60, 0);
    const EventId target = events[25].id;

    std::atomic<int> target_attempts{0};
    std::atomic<int> failed_attempt_number{0};
    auto cfg = consumer_config(group, topic);
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, effects, e, ctx, group); // written, then rolled back on the throw
        if (e.id == target) {
            ++target_attempts;
            if (ctx.attempt() == 1) {
                failed_attempt_number = ctx.attempt();
                throw std::runtime_error("payment provider timed out");
            }
        }
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return scalar("SELECT count(*) FROM " + effects) == 60; }, 60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(target_attempts == 2);
    CHECK(failed_attempt_number == 1);
    CHECK(m.handler_failures == 1);
    CHECK(m.claimed == 60);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 60);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 60);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", effects, target.to_string())) == 1);
    CHECK(claims(group) == 60);
    // Order within the failed record's partition is kept: nothing after it
    // committed before it did.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {0} a JOIN {0} t ON t.event_id = '{1}' "
                             "WHERE a.kafka_partition = t.kafka_partition AND a.kafka_offset > t.kafka_offset "
                             "AND a.seq < t.seq",
                             effects, target.to_string())) == 0);
}

TEST_CASE("two consumer groups each process every event once", "[integration]")
{
    const auto topic = unique_name("groups");
    create_topic(topic, 2);
    const auto effects = make_effect_table(unique_name("effect"));
    publish_events(topic, 300, 60);
    const auto billing = unique_name("billing");
    const auto analytics = unique_name("analytics");

    auto make = [&](const std::string& group) {
        return std::make_unique<Consumer>(consumer_config(group, topic), decode, event_id_of,
                                          [&effects, group](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                                              insert_effect(tx, effects, e, ctx, group);
                                          });
    };
    auto a = make(billing);
    auto b = make(analytics);
    {
        Runner<Consumer> ra(*a);
        Runner<Consumer> rb(*b);
        REQUIRE(wait_until(
            [&] { return a->metrics().snapshot().consumed >= 360 && b->metrics().snapshot().consumed >= 360; }, 60s));
        ra.join();
        rb.join();
        REQUIRE_FALSE(ra.error());
        REQUIRE_FALSE(rb.error());
    }
    for (const auto& g : {billing, analytics}) {
        INFO("group " << g);
        CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE grp = '{}'", effects, g)) == 300);
        CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {} WHERE grp = '{}'", effects, g)) == 300);
        CHECK(claims(g) == 300);
    }
    CHECK(a->metrics().snapshot().duplicates == 60);
    CHECK(b->metrics().snapshot().duplicates == 60);
}

TEST_CASE("poison records go to the dead-letter topic with their reason, and the partition moves on", "[integration]")
{
    const auto topic = unique_name("poison");
    const auto group = unique_name("g");
    create_topic(topic, 1);
    const auto effects = make_effect_table(unique_name("effect"));
    const std::string too_large(2048, 'x');
    const std::vector<std::pair<std::string, std::string>> poison = {
        {"not an event", "decode_error"},
        {"not-a-uuid,bad,1", "invalid_event_id"},
        {"00000000-0000-0000-0000-000000000000,nil,1", "invalid_event_id"},
        {"", "empty_payload"},
        {too_large, "payload_too_large"},
    };
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 10; ++i)
            pub.publish_async(topic, "k", encode(TestEvent{new_event_id(), "good", i}));
        for (const auto& p : poison)
            pub.publish_async(topic, "k", p.first, {Header{"trace-id", std::string("t-") + p.second}});
        for (int i = 10; i < 20; ++i)
            pub.publish_async(topic, "k", encode(TestEvent{new_event_id(), "good", i}));
        pub.flush();
    }
    std::mutex mu;
    std::vector<std::string> lines;
    auto cfg = consumer_config(group, topic);
    cfg.max_payload_bytes = 1024;
    cfg.log = [&](LogLevel level, std::string_view msg) {
        if (level >= LogLevel::error && msg.find("dead-lettered") != std::string_view::npos) {
            std::lock_guard<std::mutex> lock(mu);
            lines.emplace_back(msg);
        }
    };
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, effects, e, ctx, group);
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return scalar("SELECT count(*) FROM " + effects) == 20; }, 60s));
        REQUIRE(wait_until([&] { return consumer.metrics().snapshot().dead_lettered_total() == poison.size(); }, 30s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::invalid_event_id) == 2);
    CHECK(m.dead_lettered_for(DeadLetterReason::empty_payload) == 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::payload_too_large) == 1);
    CHECK(m.claimed == 20);
    CHECK(m.handler_failures == 0);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 20);
    {
        std::lock_guard<std::mutex> lock(mu);
        REQUIRE(lines.size() == poison.size());
        for (const auto& l : lines)
            CHECK(l.find(topic + "/0@") != std::string::npos); // each line names its coordinates
    }

    const auto dlq = read_topic(group + ".dlq", poison.size(), 30s);
    REQUIRE(dlq.size() == poison.size());
    std::multiset<std::string> reasons, expected;
    for (const auto& p : poison)
        expected.insert(p.second);
    for (const auto& r : dlq) {
        reasons.insert(r.header("idemkafka.reason"));
        CHECK(r.header("idemkafka.original.topic") == topic);
        CHECK(r.header("idemkafka.original.partition") == "0");
        CHECK(r.header("idemkafka.consumer_group") == group);
        CHECK_FALSE(r.header("idemkafka.error").empty());
        CHECK(r.key == std::optional<std::string>("k"));
        // The original record travels unchanged: value and the producer's own headers.
        CHECK(r.header("trace-id") == "t-" + r.header("idemkafka.reason"));
        const auto offset = std::stoll(r.header("idemkafka.original.offset"));
        CHECK(offset >= 10);
        CHECK(offset < 15);
        CHECK(r.value.value_or("") == poison[static_cast<std::size_t>(offset - 10)].first);
    }
    CHECK(reasons == expected);
}

TEST_CASE("configured table names are quoted, never executed", "[integration]")
{
    const auto sentinel = unique_name("sentinel");
    exec(fmt::format("CREATE TABLE {} (x int)", sentinel));
    const std::string evil = fmt::format("pe\"; DROP TABLE {}; --", sentinel);
    ProcessedEventStore store(unique_name("odd schema"), evil);
    store.ensure_schema(pg());
    store.ensure_schema(pg()); // twice is fine
    CHECK(scalar(fmt::format("SELECT count(*) FROM pg_tables WHERE tablename = '{}'", sentinel)) == 1);
    pqxx::connection c(pg());
    pqxx::work tx(c);
    CHECK(scalar(fmt::format("SELECT count(*) FROM pg_tables WHERE tablename = {}", tx.quote(evil))) == 1);
    const std::vector<EventId> ids{new_event_id(), new_event_id()};
    CHECK(store.claim(tx, "g", ids).size() == 2);
    CHECK(store.claim(tx, "g", ids).empty());
    CHECK(store.claim(tx, "other", ids).size() == 2);
}

namespace {

// A batch handler's one statement for the whole batch: arrays of ids and entities.
void insert_effects(pqxx::work& tx, const std::string& table, const Batch<TestEvent>& batch, const std::string& group)
{
    std::string ids = "{", entities = "{";
    for (const auto& [event, ctx] : batch) {
        if (ids.size() > 1) {
            ids += ',';
            entities += ',';
        }
        ids += event.id.to_string();
        entities += '"' + event.entity + '"';
        (void)ctx;
    }
    ids += '}';
    entities += '}';
    detail::pg::exec_params(tx,
                            fmt::format("INSERT INTO {} (event_id, entity, grp, kafka_partition, kafka_offset)"
                                        " SELECT unnest($1::uuid[]), unnest($2::text[]), $3, -1, -1",
                                        table),
                            ids, entities, group);
}

} // namespace

TEST_CASE("a batch handler applies a transaction's claimed events in one call", "[integration]")
{
    const auto topic = unique_name("bh");
    const auto group = unique_name("g");
    create_topic(topic, 3);
    const auto effects = make_effect_table(unique_name("effect"));
    publish_events(topic, 700, 300);

    auto cfg = consumer_config(group, topic);
    std::atomic<int> calls{0}, empty_calls{0};
    std::atomic<std::size_t> events{0}, largest{0};
    std::mutex mu;
    bool ordered = true;
    // Counted here and checked on the test's thread: Catch2's assertions are
    // not thread-safe, and the handler runs on a worker thread.
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const Batch<TestEvent>& batch) {
        if (batch.empty())
            ++empty_calls;
        {
            // Record order within each partition.
            std::lock_guard<std::mutex> lock(mu);
            std::map<std::int32_t, std::int64_t> last;
            for (const auto& entry : batch) {
                auto [pos, fresh] = last.emplace(entry.context.partition(), entry.context.offset());
                if (!fresh) {
                    ordered = ordered && pos->second < entry.context.offset();
                    pos->second = entry.context.offset();
                }
            }
        }
        insert_effects(tx, effects, batch, group);
        ++calls;
        events += batch.size();
        std::size_t seen = largest.load();
        while (seen < batch.size() && !largest.compare_exchange_weak(seen, batch.size())) {
        }
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return consumer.metrics().snapshot().consumed >= 1000; }, 60s));
        REQUIRE(wait_until([&] { return events.load() >= 700; }, 30s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(m.consumed == 1000);
    CHECK(m.claimed == 700);
    CHECK(m.duplicates == 300);
    CHECK(events == 700);
    CHECK(empty_calls == 0);
    CHECK(calls == static_cast<int>(m.db_commits));
    CHECK(largest > 1);
    CHECK(ordered);
    CHECK(m.batch_splits == 0);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 700);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 700);
    CHECK(claims(group) == 700);
}

TEST_CASE("a batch handler that throws has its failing record found; the rest commits once", "[integration]")
{
    const auto topic = unique_name("bhfail");
    const auto group = unique_name("g");
    create_topic(topic, 2);
    const auto effects = make_effect_table(unique_name("effect"));
    const auto published = publish_events(topic, 300, 0);
    const auto bad = published[150].id;

    auto cfg = consumer_config(group, topic);
    cfg.retry_backoff = 10ms;
    std::atomic<int> calls{0}, singles{0};
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const Batch<TestEvent>& batch) {
        ++calls;
        if (batch.size() == 1)
            ++singles;
        insert_effects(tx, effects, batch, group); // written, then rolled back when the batch fails
        for (const auto& entry : batch)
            if (entry.event.id == bad)
                throw NonRetryableError("cannot charge this order");
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until(
            [&] {
                const auto s = consumer.metrics().snapshot();
                return s.claimed >= 299 && s.dead_lettered_total() >= 1;
            },
            60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(m.claimed == 299);
    CHECK(m.handler_failures == 1);
    CHECK(m.batch_splits >= 1);
    CHECK(singles >= 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::non_retryable) == 1);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 299);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 299);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", effects, bad.to_string())) == 0);
    CHECK(claims(group) == 299);
    const auto dlq = read_topic(group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() == 1);
    CHECK(dlq[0].header("idemkafka.event_id") == bad.to_string());
    CHECK(dlq[0].header("idemkafka.reason") == "non_retryable");
}

TEST_CASE("offset commits are coalesced by commit_interval and flushed by stop()", "[integration]")
{
    const auto topic = unique_name("coalesce");
    const auto group = unique_name("g");
    create_topic(topic, 1);
    const auto effects = make_effect_table(unique_name("effect"));
    publish_events(topic, 60, 0);

    auto cfg = consumer_config(group, topic);
    cfg.max_batch = 1;                           // 60 transactions
    cfg.commit_interval = std::chrono::hours(1); // only the first batch's commit goes out before stop()
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        insert_effect(tx, effects, e, ctx, group);
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return consumer.metrics().snapshot().claimed >= 60; }, 60s));
        const auto m = consumer.metrics().snapshot();
        CHECK(m.db_commits == 60);
        CHECK(m.offset_commits <= 1);
        CHECK(committed_offset(group, topic, 0) <= 1); // Kafka is behind PostgreSQL, never ahead
        run.join();
        REQUIRE_FALSE(run.error());
    }
    CHECK(committed_offset(group, topic, 0) == 60);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 60);
}
