// The pipeline: the next batch is polled and decoded while the running one's
// transaction is in the workers' hands. Real PostgreSQL, real broker.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

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

std::string make_effects()
{
    const auto table = unique_name("effect");
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL,"
                     " kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)",
                     table));
    return table;
}

std::vector<TestEvent> publish(const std::string& topic, int n)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    std::vector<TestEvent> sent;
    for (int i = 0; i < n; ++i) {
        sent.push_back(TestEvent{new_event_id(), fmt::format("order-{}", i), i});
        pub.publish_async(topic, sent.back().entity, encode(sent.back()));
    }
    pub.flush();
    return sent;
}

// Pairs of one partition's effects committed against offset order.
std::int64_t out_of_order(const std::string& effects)
{
    return scalar(fmt::format("SELECT count(*) FROM {0} a JOIN {0} b ON a.kafka_partition = b.kafka_partition"
                              " AND a.kafka_offset > b.kafka_offset AND a.seq < b.seq",
                              effects));
}

} // namespace

TEST_CASE("pipeline: the next batch is decoded while a handler runs, on another thread", "[integration]")
{
    const auto topic = unique_name("pipe");
    const auto group = unique_name("g");
    create_topic(topic, 1);
    const auto effects = make_effects();
    const auto sent = publish(topic, 300);
    const EventId target = sent[120].id; // neither in the first nor in the last batch

    auto cfg = consumer_config(group, topic);
    cfg.max_batch = 50;
    std::mutex mu;
    std::condition_variable decoded_more;
    std::int64_t last_decoded = -1; // highest offset decoded so far
    std::set<std::thread::id> decode_threads, handler_threads;
    bool overlapped = false;
    Consumer consumer(
        cfg,
        [&](const Record& r) {
            auto e = decode(r.value.value_or(""));
            std::lock_guard<std::mutex> lock(mu);
            last_decoded = std::max(last_decoded, r.offset);
            decode_threads.insert(std::this_thread::get_id());
            decoded_more.notify_all();
            return e;
        },
        event_id_of,
        [&](pqxx::work& tx, const Batch<TestEvent>& batch) {
            bool has_target = false;
            std::int64_t last = -1;
            for (const auto& [event, ctx] : batch) {
                last = std::max(last, ctx.offset());
                detail::pg::exec_params(tx,
                                        fmt::format("INSERT INTO {} (event_id, kafka_partition, kafka_offset)"
                                                    " VALUES ($1::uuid, $2, $3)",
                                                    effects),
                                        event.id.to_string(), ctx.partition(), ctx.offset());
                has_target = has_target || event.id == target;
            }
            std::unique_lock<std::mutex> lock(mu);
            handler_threads.insert(std::this_thread::get_id());
            if (has_target) {
                // The records after this batch are already fetched: with the
                // pipeline they are decoded before this transaction ends
                // (one after the other, never before the commit).
                overlapped = decoded_more.wait_for(lock, 30s, [&] { return last_decoded > last; });
            }
        });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return scalar("SELECT count(*) FROM " + effects) == 300; }, 90s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(overlapped);
    CHECK(m.claimed == 300);
    CHECK(m.consumed == 300);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", effects)) == 300);
    CHECK(out_of_order(effects) == 0);
    REQUIRE(decode_threads.size() == 1);
    REQUIRE(handler_threads.size() == 1);
    CHECK(*decode_threads.begin() != *handler_threads.begin());
}

TEST_CASE("pipeline: records polled behind a rewound partition are dropped and come again in order", "[integration]")
{
    const auto topic = unique_name("pipe-rewind");
    const auto group = unique_name("g");
    create_topic(topic, 4);
    const auto effects = make_effects();
    const auto sent = publish(topic, 800);
    std::set<EventId> failing;
    for (std::size_t i = 7; i < sent.size(); i += 41)
        failing.insert(sent[i].id);

    auto cfg = consumer_config(group, topic);
    cfg.max_batch = 20; // many batches, each handed over while the next is polled
    cfg.retry_backoff = 10ms;
    cfg.retry_backoff_max = 20ms;
    std::atomic<int> failures{0};
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        detail::pg::exec_params(
            tx,
            fmt::format("INSERT INTO {} (event_id, kafka_partition, kafka_offset) VALUES ($1::uuid, $2, $3)", effects),
            e.id.to_string(), ctx.partition(), ctx.offset());
        if (ctx.attempt() == 1 && failing.count(e.id)) {
            ++failures;
            throw std::runtime_error("first attempt fails");
        }
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return scalar("SELECT count(*) FROM " + effects) == 800; }, 120s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    const auto m = consumer.metrics().snapshot();
    CHECK(failures == static_cast<int>(failing.size()));
    CHECK(m.handler_failures == failing.size());
    CHECK(m.claimed == 800);
    CHECK(m.duplicates == 0);
    CHECK(m.in_flight_records == 0);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {}", effects)) == 800);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", effects)) == 800);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group)) == 800);
    CHECK(out_of_order(effects) == 0);
}
