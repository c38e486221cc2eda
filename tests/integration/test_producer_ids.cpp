// Event ids from the producers users already run, end to end: records written
// the way a CloudEvents SDK (binary and structured mode) and Debezium's outbox
// event router write them go through the broker, are re-sent with new
// offsets, and each effect happens once; records without a usable id and
// malformed envelopes are dead-lettered with a precise reason.

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/cloud_events.hpp>
#include <idemkafka/consumer.hpp>
#include <idemkafka/debezium_outbox.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// A record as a producer writes it, kept to be sent again.
struct Sent {
    std::string key;
    std::string value;
    std::vector<Header> headers;
};

void publish_all(const std::string& topic, const std::vector<Sent>& records)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    for (const auto& r : records)
        pub.publish_async(topic, r.key, r.value, r.headers);
    pub.flush();
}

// What a CloudEvents SDK writes for one event: binary mode (attributes in
// ce_* headers, the data as the value) or structured mode (a JSON envelope).
Sent cloud_event_record(const std::string& source, const std::string& id, const std::string& order, int amount,
                        bool structured)
{
    const auto data = fmt::format(R"({{"order_id":"{}","amount_cents":{}}})", order, amount);
    if (structured)
        return {order,
                fmt::format(R"({{"specversion":"1.0","id":"{}","source":"{}","type":"com.example.order.confirmed",)"
                            R"("time":"2026-12-02T08:00:00Z","datacontenttype":"application/json","data":{}}})",
                            id, source, data),
                {{"content-type", std::string("application/cloudevents+json; charset=UTF-8")}}};
    return {order,
            data,
            {{"ce_specversion", std::string("1.0")},
             {"ce_id", id},
             {"ce_source", source},
             {"ce_type", std::string("com.example.order.confirmed")},
             {"ce_time", std::string("2026-12-02T08:00:00Z")},
             {"content-type", std::string("application/json")}}};
}

std::int64_t claims(const std::string& group)
{
    return scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group));
}

// A record no id can be taken from, and the dead letter it must become.
struct Poison {
    Sent record;
    std::string reason;
    std::string says; ///< part of the dead letter's error
};

// Runs `consumer` until it consumed `records` records and dead-lettered `dead` of them.
template <class Consumer> void consume(Consumer& consumer, std::size_t records, std::size_t dead)
{
    Runner<Consumer> run(consumer);
    REQUIRE(wait_until([&] { return consumer.metrics().snapshot().consumed >= records; }, 60s));
    REQUIRE(wait_until([&] { return consumer.metrics().snapshot().dead_lettered_total() == dead; }, 30s));
    run.join();
    REQUIRE_FALSE(run.error());
}

// The dead letters of `group`, one per poison record, sent from offset `first` on.
void check_dead_letters(const std::string& group, std::int64_t first, const std::vector<Poison>& poison)
{
    std::map<std::int64_t, std::pair<std::string, std::string>> dlq;
    for (const auto& r : read_topic(group + ".dlq", poison.size(), 30s))
        dlq[std::stoll(r.header("idemkafka.original.offset"))] = {r.header("idemkafka.reason"),
                                                                  r.header("idemkafka.error")};
    REQUIRE(dlq.size() == poison.size());
    for (std::size_t i = 0; i < poison.size(); ++i) {
        const auto offset = first + static_cast<std::int64_t>(i);
        INFO("offset " << offset);
        REQUIRE(dlq.count(offset) == 1);
        INFO(dlq.at(offset).second);
        CHECK(dlq.at(offset).first == poison[i].reason);
        CHECK(dlq.at(offset).second.find(poison[i].says) != std::string::npos);
    }
}

} // namespace

TEST_CASE("CloudEvents in binary and structured mode: re-sent with new offsets, each effect once", "[integration]")
{
    const auto topic = unique_name("cloudevents");
    const auto group = unique_name("g");
    const auto effects = unique_name("effect");
    create_topic(topic, 1); // one partition: the dead letters' offsets are the test's indices
    exec(fmt::format("CREATE TABLE {} (event_key uuid NOT NULL, source text NOT NULL, id text NOT NULL,"
                     " data text NOT NULL, structured boolean NOT NULL)",
                     effects));

    // 40 events: ids that are not UUIDs (the common case), UUIDv4 and UUIDv7 ids,
    // and the same id string from a second source (a different event per the spec).
    struct Event {
        std::string source, id;
    };
    std::vector<Event> events;
    for (int i = 0; i < 16; ++i)
        events.push_back({"/orders", fmt::format("order-{}", i)});
    for (int i = 0; i < 8; ++i)
        events.push_back({"/refunds", fmt::format("order-{}", i)});
    for (const auto* v4 : {"f47ac10b-58cc-4372-a567-0e02b2c3d479", "9b2b7e0e-1c64-4c0c-9a53-3a6f0c1b7d11"})
        events.push_back({"/payments", v4});
    for (int i = 0; i < 14; ++i)
        events.push_back({"/ledger", new_event_id().to_string()});

    std::vector<Sent> records;
    for (std::size_t i = 0; i < events.size(); ++i)
        records.push_back(cloud_event_record(events[i].source, events[i].id, fmt::format("o-{}", i),
                                             static_cast<int>(100 + i), i % 2 == 1));
    // Poison, each at a known offset (40..45).
    const std::vector<Poison> poison = {
        {{"p",
          "{}",
          {{"ce_specversion", std::string("1.0")},
           {"ce_source", std::string("/orders")},
           {"ce_type", std::string("t")}}},
         "missing_event_id",
         "has no 'ce_id' header"},
        {{"p",
          "{}",
          {{"ce_specversion", std::string("1.0")},
           {"ce_id", std::string()},
           {"ce_source", std::string("/orders")},
           {"ce_type", std::string("t")}}},
         "missing_event_id",
         "has an empty 'ce_id' header"},
        {{"p",
          R"({"specversion":"1.0","id":"x-1","type":"t","data":{}})",
          {{"content-type", std::string("application/cloudevents+json")}}},
         "missing_event_id",
         "CloudEvents envelope has no 'source' attribute"},
        {{"p",
          R"({"specversion":"1.0","id":7,"source":"/orders","type":"t"})",
          {{"content-type", std::string("application/cloudevents+json")}}},
         "invalid_event_id",
         "'id' must be a string, got number"},
        {{"p",
          R"({"specversion":"1.0","id":"x-2","source":"/orders","type":"t","data":{"a":1})",
          {{"content-type", std::string("application/cloudevents+json")}}},
         "decode_error",
         "CloudEvents envelope is not JSON"},
        {{"p",
          R"({"specversion":"1.0","id":"x-3","source":"/orders","type":"t","data":1,"data_base64":"AA=="})",
          {{"content-type", std::string("application/cloudevents+json")}}},
         "decode_error",
         "both 'data' and 'data_base64'"},
    };
    for (const auto& p : poison)
        records.push_back(p.record);
    // Every event again at new offsets: the first half as it was, the second
    // half in the other mode (the same event's key in either mode).
    for (std::size_t i = 0; i < events.size(); ++i)
        records.push_back(cloud_event_record(events[i].source, events[i].id, fmt::format("o-{}", i),
                                             static_cast<int>(100 + i), (i % 2 == 1) != (i >= events.size() / 2)));
    publish_all(topic, records);

    auto cfg = consumer_config(group, topic);
    // Name-based ids carry no time: the partitioned claims table needs the opt-in.
    cfg.retention.non_v7 = NonV7Policy::process;
    IdempotentConsumer<CloudEvent> consumer(
        cfg, decode_cloud_event, &CloudEvent::event_id, [&](pqxx::work& tx, const CloudEvent& ev, const Context& ctx) {
            detail::pg::exec_params(tx,
                                    fmt::format("INSERT INTO {} (event_key, source, id, data, structured)"
                                                " VALUES ($1::uuid, $2, $3, $4, $5)",
                                                effects),
                                    ctx.event_id().to_string(), ev.source, ev.id, ev.data.value_or(""), ev.structured);
        });
    consume(consumer, records.size(), poison.size());
    const auto m = consumer.metrics().snapshot();
    CHECK(m.consumed == records.size());
    CHECK(m.claimed == events.size());
    CHECK(m.duplicates == events.size());
    CHECK(m.handler_failures == 0);
    CHECK(m.dead_lettered_for(DeadLetterReason::missing_event_id) == 3);
    CHECK(m.dead_lettered_for(DeadLetterReason::invalid_event_id) == 1);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == 2);
    CHECK(m.invalid_event_ids == 4);
    CHECK(m.decode_errors == 2);
    CHECK(scalar("SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(events.size()));
    CHECK(scalar("SELECT count(DISTINCT (source, id)) FROM " + effects) == static_cast<std::int64_t>(events.size()));
    CHECK(claims(group) == static_cast<std::int64_t>(events.size()));
    // The claims are the documented mapping: ids of UUIDv7 kept their time, the rest are UUIDv5.
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE substr(event_key::text, 15, 1) = '7'", effects)) == 14);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE substr(event_key::text, 15, 1) = '5'", effects)) == 26);
    for (const auto& e : events) {
        INFO(e.source << " " << e.id);
        CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_key = '{}' AND source = '{}' AND id = '{}'",
                                 effects, cloud_event_id(e.source, e.id).to_string(), e.source, e.id)) == 1);
    }
    // The data of either mode reaches the handler the same: the JSON the producer put in.
    CHECK(
        scalar(fmt::format(R"(SELECT count(*) FROM {} WHERE data::jsonb ? 'order_id' AND data::jsonb ? 'amount_cents')",
                           effects)) == static_cast<std::int64_t>(events.size()));

    check_dead_letters(group, static_cast<std::int64_t>(events.size()), poison);
}

TEST_CASE("CloudEvents binary mode with the service's own decoder: the id comes from the headers", "[integration]")
{
    const auto topic = unique_name("cloudevents_binary");
    const auto group = unique_name("g");
    create_topic(topic, 2);
    std::vector<Sent> records;
    for (int round = 0; round < 2; ++round)
        for (int i = 0; i < 30; ++i)
            records.push_back(
                cloud_event_record("/orders", fmt::format("order-{}", i), fmt::format("o-{}", i), i, false));
    publish_all(topic, records);

    struct Order {
        std::string payload;
    };
    auto cfg = consumer_config(group, topic);
    // The other way to take ids without a time: a plain claims table of its own
    // (the shared one is partitioned, and the layout a table has is kept).
    cfg.retention.mode = RetentionMode::purge;
    cfg.table = unique_name("claims_plain");
    std::mutex mu;
    std::multiset<std::string> handled;
    IdempotentConsumer<Order> consumer(
        cfg, [](std::string_view payload) { return Order{std::string(payload)}; }, cloud_event_record_id,
        [&](pqxx::work&, const Order& o, const Context& ctx) {
            std::lock_guard<std::mutex> lock(mu);
            handled.insert(std::string(*ctx.header("ce_id")) + " " + o.payload);
        });
    consume(consumer, records.size(), 0);
    const auto m = consumer.metrics().snapshot();
    CHECK(m.claimed == 30);
    CHECK(m.duplicates == 30);
    CHECK(m.dead_lettered_total() == 0);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", cfg.table, group)) == 30);
    CHECK(scalar(fmt::format("SELECT count(*) FROM pg_partitioned_table WHERE partrelid = '{}'::regclass",
                             cfg.table)) == 0);
    std::lock_guard<std::mutex> lock(mu);
    CHECK(handled.size() == 30);
    CHECK(std::set<std::string>(handled.begin(), handled.end()).size() == 30);
}

TEST_CASE("Debezium outbox records: the id header bare or quoted, re-sent with new offsets, each effect once",
          "[integration]")
{
    const auto topic = unique_name("outbox_event_order");
    const auto group = unique_name("g");
    const auto effects = unique_name("effect");
    create_topic(topic, 1);
    exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, aggregate text NOT NULL, payload text NOT NULL)",
                     effects));

    // As the event router writes a row (id, aggregateid, payload): the key is the
    // aggregate id, the payload the row's payload, the id in header `id`: bare
    // with the default header converter, a JSON string with JsonConverter.
    std::vector<EventId> ids;
    for (int i = 0; i < 20; ++i)
        ids.push_back(new_event_id());
    ids.push_back(EventId::parse("4d47e190-0402-4048-bc2c-89dd54343cdc")); // Debezium's docs: a UUIDv4
    auto row = [&](std::size_t i, bool quoted) {
        const auto id = ids[i].to_string();
        return Sent{fmt::format("aggregate-{}", i % 5),
                    fmt::format(R"({{"id":{},"lineItems":[{{"item":"Debezium in Action","quantity":2}}]}})", i),
                    {{"id", quoted ? "\"" + id + "\"" : id}}};
    };
    std::vector<Sent> records;
    for (std::size_t i = 0; i < ids.size(); ++i)
        records.push_back(row(i, false));
    const std::vector<Poison> poison = {
        {{"aggregate-0", "{}", {}}, "missing_event_id", "record has no 'id' header"},
        {{"aggregate-0", "{}", {{"id", std::string()}}},
         "missing_event_id",
         "'id' header (Debezium outbox event id) is empty"},
        {{"aggregate-0", "{}", {{"id", std::string("\"\"")}}}, "missing_event_id", "is empty"},
        {{"aggregate-0", "{}", {{"id", std::string("1001")}}}, "invalid_event_id", "expected 36 characters, got 4"},
    };
    for (const auto& p : poison)
        records.push_back(p.record);
    // Every row again (a connector restarted from an older position), now
    // through JsonConverter: the same id in quotes.
    for (std::size_t i = 0; i < ids.size(); ++i)
        records.push_back(row(i, true));
    publish_all(topic, records);

    struct OrderEvent {
        std::string payload;
    };
    auto cfg = consumer_config(group, topic);
    cfg.retention.non_v7 = NonV7Policy::process; // the UUIDv4 row
    IdempotentConsumer<OrderEvent> consumer(
        cfg, [](std::string_view payload) { return OrderEvent{std::string(payload)}; }, DebeziumOutboxId{},
        [&](pqxx::work& tx, const OrderEvent& e, const Context& ctx) {
            detail::pg::exec_params(
                tx, fmt::format("INSERT INTO {} (event_id, aggregate, payload) VALUES ($1::uuid, $2, $3)", effects),
                ctx.event_id().to_string(), std::string(ctx.key().value_or("")), e.payload);
        });
    consume(consumer, records.size(), poison.size());
    const auto m = consumer.metrics().snapshot();
    CHECK(m.consumed == records.size());
    CHECK(m.claimed == ids.size());
    CHECK(m.duplicates == ids.size());
    CHECK(m.dead_lettered_for(DeadLetterReason::missing_event_id) == 3);
    CHECK(m.dead_lettered_for(DeadLetterReason::invalid_event_id) == 1);
    CHECK(scalar("SELECT count(*) FROM " + effects) == static_cast<std::int64_t>(ids.size()));
    for (std::size_t i = 0; i < ids.size(); ++i) {
        INFO(ids[i].to_string());
        CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}' AND aggregate = 'aggregate-{}'",
                                 effects, ids[i].to_string(), i % 5)) == 1);
    }

    check_dead_letters(group, static_cast<std::int64_t>(ids.size()), poison);
}
