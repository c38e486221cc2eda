// Outbox and OutboxRelay against a real PostgreSQL and a Kafka-protocol broker:
// what enqueue stores, what the relay publishes, in which order, and what
// happens when it crashes, fails or runs twice.

#include <atomic>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

struct SimulatedCrash {};

Outbox make_outbox(const std::string& schema = "public")
{
    Outbox ob(schema, unique_name("outbox"));
    ob.ensure_schema(pg());
    return ob;
}

OutboxRelayOptions relay_options()
{
    OutboxRelayOptions o;
    o.batch_size = 64;
    o.poll_interval = 20ms;
    o.retry_backoff = 20ms;
    o.retry_backoff_max = 200ms;
    o.publish_timeout = 20s;
    if (!std::getenv("IDEMKAFKA_TEST_VERBOSE"))
        o.log = log_sink(LogLevel::error);
    return o;
}

// For tests that fail on purpose: their error lines are expected.
OutboxRelayOptions quiet_relay_options()
{
    auto o = relay_options();
    if (!std::getenv("IDEMKAFKA_TEST_VERBOSE"))
        o.log = [](LogLevel, std::string_view) {};
    return o;
}

PublisherConfig publisher_config()
{
    PublisherConfig pc;
    pc.brokers = brokers();
    pc.log = log_sink();
    return pc;
}

std::int64_t pending(const Outbox& ob)
{
    return scalar("SELECT count(*) FROM " + ob.qualified_name() + " WHERE sent_at IS NULL");
}

std::int64_t rows(const Outbox& ob)
{
    return scalar("SELECT count(*) FROM " + ob.qualified_name());
}

// Runs cycles until nothing is unsent; returns the rows published.
std::size_t drain(OutboxRelay& relay, const Outbox& ob)
{
    std::size_t total = 0;
    const bool done = wait_until(
        [&] {
            total += relay.run_once();
            return pending(ob) == 0;
        },
        60s);
    REQUIRE(done);
    return total;
}

// Enqueues `n` events over `keys` keys ("k0", "k1", ...) in one transaction.
void enqueue_events(const Outbox& ob, const std::string& topic, int n, int keys)
{
    pqxx::connection conn(pg());
    pqxx::work tx(conn);
    for (int i = 0; i < n; ++i) {
        const EventId id = Outbox::new_event_id();
        ob.enqueue(tx, topic, std::string_view(fmt::format("k{}", i % keys)), encode(TestEvent{id, "k", i}), {}, id);
    }
    tx.commit();
}

std::string hex(std::string_view bytes)
{
    std::string out;
    for (unsigned char c : bytes)
        out += fmt::format("{:02x}", c);
    return out;
}

std::string text_of(const std::string& sql)
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    const auto r = tx.exec(sql);
    return r[0][0].is_null() ? std::string("<null>") : std::string(r[0][0].c_str());
}

std::string make_effect_table()
{
    std::string name = unique_name("effect");
    exec(
        fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, entity text NOT NULL)", name));
    return name;
}

// A downstream consumer of `topic` recording one effect per event; returns when
// it consumed `records` records, with its counters.
MetricsSnapshot consume_downstream(const std::string& topic, const std::string& effects, std::uint64_t records)
{
    Consumer c(consumer_config(unique_name("down"), topic), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context&) {
                   detail::pg::exec_params(
                       tx, fmt::format("INSERT INTO {} (event_id, entity) VALUES ($1::uuid, $2)", effects),
                       e.id.to_string(), e.entity);
               });
    Runner<Consumer> run(c);
    const bool done = wait_until([&] { return c.metrics().snapshot().consumed >= records; }, 60s);
    run.join();
    REQUIRE(done);
    REQUIRE_FALSE(run.error());
    return c.metrics().snapshot();
}

// Records of `topic` per key, in offset order (a key lives in one partition).
std::map<std::string, std::vector<ReadRecord>> by_key(const std::vector<ReadRecord>& records)
{
    std::map<std::string, std::vector<ReadRecord>> out;
    for (const auto& r : records)
        out[r.key.value_or("<null>")].push_back(r);
    for (auto& [k, list] : out)
        std::sort(list.begin(), list.end(),
                  [](const ReadRecord& a, const ReadRecord& b) { return a.offset < b.offset; });
    return out;
}

// Reads `topic` until every one of `expected` event ids was seen (a topic may
// hold repeats, at least once).
std::vector<ReadRecord> read_all(const std::string& topic, std::size_t expected)
{
    std::vector<ReadRecord> records;
    std::size_t want = expected;
    for (int attempt = 0; attempt < 5; ++attempt) {
        records = read_topic(topic, want, 30s);
        std::set<std::string> ids;
        for (const auto& r : records)
            ids.insert(r.header(outbox_event_id_header));
        if (ids.size() >= expected)
            break;
        want = records.size() + (expected - ids.size());
    }
    return records;
}

} // namespace

TEST_CASE("outbox: enqueue writes in the caller's transaction only", "[integration][outbox]")
{
    // Odd names on purpose: they are quoted, never spliced in.
    const std::string schema = unique_name("Outbox \"s");
    const Outbox ob = make_outbox(schema);
    pqxx::connection conn(pg());

    SECTION("a transaction that rolls back leaves nothing")
    {
        {
            pqxx::work tx(conn);
            ob.enqueue(tx, "payment.charged", std::string_view("order-1"), "p1");
            // destroyed without commit
        }
        {
            pqxx::work tx(conn);
            ob.enqueue(tx, "payment.charged", std::string_view("order-2"), "p2");
            tx.abort();
        }
        CHECK(rows(ob) == 0);
    }

    SECTION("a committed one stores the event byte for byte, unsent, with the id it returns")
    {
        const std::string key("k\0ey", 4);
        const std::string payload("\x00\xff{\"a\":1}\n", 10);
        const EventId id = Outbox::new_event_id();
        EventId returned, generated;
        {
            pqxx::work tx(conn);
            returned = ob.enqueue(tx, "payment.charged", std::string_view(key), payload,
                                  {Header{"trace", std::string("t-1")}, Header{"empty", std::nullopt}}, id);
            generated = ob.enqueue(tx, "payment.charged", std::nullopt, "no key");
            tx.commit();
        }
        CHECK(returned == id);
        CHECK(generated != id);
        CHECK(generated.version() == 7);
        CHECK(rows(ob) == 2);
        CHECK(pending(ob) == 2);
        const std::string where = fmt::format(" FROM {} WHERE event_id = '{}'", ob.qualified_name(), id.to_string());
        CHECK(text_of("SELECT encode(payload, 'hex')" + where) == hex(payload));
        CHECK(text_of("SELECT encode(key, 'hex')" + where) == hex(key));
        CHECK(text_of("SELECT topic" + where) == "payment.charged");
        CHECK(text_of("SELECT sent_at" + where) == "<null>");
        CHECK(text_of(fmt::format("SELECT key FROM {} WHERE event_id = '{}'", ob.qualified_name(),
                                  generated.to_string())) == "<null>");
    }

    SECTION("bad arguments are refused before anything is written")
    {
        pqxx::work tx(conn);
        CHECK_THROWS_AS(ob.enqueue(tx, "", std::nullopt, "p"), ConfigError);
        CHECK_THROWS_AS(ob.enqueue(tx, "no spaces allowed", std::nullopt, "p"), ConfigError);
        CHECK_THROWS_AS(ob.enqueue(tx, std::string(250, 'a'), std::nullopt, "p"), ConfigError);
        CHECK_THROWS_AS(ob.enqueue(tx, "t", std::nullopt, "p", {}, EventId()), InvalidEventId);
        tx.commit();
        CHECK(rows(ob) == 0);
    }

    SECTION("the same event id twice on one topic is refused; on another topic it is fine")
    {
        const EventId id = Outbox::new_event_id();
        {
            pqxx::work tx(conn);
            ob.enqueue(tx, "a", std::nullopt, "p", {}, id);
            ob.enqueue(tx, "b", std::nullopt, "p", {}, id);
            tx.commit();
        }
        pqxx::work tx(conn);
        CHECK_THROWS_AS(ob.enqueue(tx, "a", std::nullopt, "p", {}, id), pqxx::unique_violation);
    }

    SECTION("ensure_schema is idempotent")
    {
        ob.ensure_schema(pg());
        CHECK(rows(ob) == 0);
    }
}

TEST_CASE("outbox: options and config are validated", "[integration][outbox]")
{
    OutboxRelayOptions o;
    o.validate();
    o.batch_size = 0;
    CHECK_THROWS_AS(o.validate(), ConfigError);
    o = {};
    o.retry_backoff_max = 1ms;
    CHECK_THROWS_AS(o.validate(), ConfigError);

    OutboxConfig c;
    c.validate();
    c.table = "";
    CHECK_THROWS_AS(c.validate(), ConfigError);
    c = {};
    c.kafka["enable.idempotence"] = "false";
    CHECK_THROWS_AS(c.validate(), ConfigError);
    c = {};
    c.relay_options.poll_interval = 0ms;
    std::string message;
    try {
        c.validate();
    } catch (const ConfigError& e) {
        message = e.what();
    }
    CHECK(message.find("outbox.relay_options.poll_interval") != std::string::npos);
    // A consumer's relay takes the consumer's brokers; nothing connects yet.
    auto relay = OutboxRelay::for_consumer(OutboxConfig{}, pg(), brokers(), {{"client.id", "billing"}},
                                           log_sink(LogLevel::error));
    CHECK(relay->outbox().qualified_name() == "\"public\".\"outbox\"");
    CHECK(relay->stats().cycles == 0);
}

TEST_CASE("outbox relay: publishes in per-key order with the event id header and marks rows sent",
          "[integration][outbox]")
{
    const auto topic = unique_name("ob_order");
    create_topic(topic, 4);
    const Outbox ob = make_outbox();
    pqxx::connection conn(pg());

    // 300 keyed events over 10 keys and 20 without a key, in transactions of
    // varying size; the payload embeds the id enqueue is given.
    std::map<std::string, std::vector<EventId>> sent_order;
    std::map<EventId, std::string> payload_of;
    int seq = 0;
    for (int t = 0; t < 40; ++t) {
        pqxx::work tx(conn);
        for (int i = 0; i < (t % 3) * 5 + 3 && seq < 300; ++i, ++seq) {
            const std::string key = fmt::format("order-{}", seq % 10);
            const EventId id = Outbox::new_event_id();
            const std::string payload = encode(TestEvent{id, key, seq});
            CHECK(ob.enqueue(tx, topic, std::string_view(key), payload, {}, id) == id);
            sent_order[key].push_back(id);
            payload_of[id] = payload;
        }
        if (t % 2 == 0) {
            const EventId id = Outbox::new_event_id();
            payload_of[id] = encode(TestEvent{id, "nokey", -1});
            ob.enqueue(tx, topic, std::nullopt, payload_of[id], {}, id);
        }
        tx.commit();
    }
    // One with binary key, payload and headers, a null-valued header, and a
    // header of the reserved name that the relay replaces.
    const std::string bin_key("bin\0\xfe", 5);
    const std::string bin_payload("\x00\x01\xff\x80 raw", 8);
    EventId bin_id;
    {
        pqxx::work tx(conn);
        bin_id = ob.enqueue(tx, topic, std::string_view(bin_key), bin_payload,
                            {Header{"h-bin", std::string("v\0\xff", 3)}, Header{"null-valued", std::nullopt},
                             Header{outbox_event_id_header, std::string("forged")}});
        tx.commit();
    }
    const std::size_t total = 300 + 20 + 1;
    REQUIRE(pending(ob) == static_cast<std::int64_t>(total));

    auto options = relay_options();
    std::size_t reported = 0;
    options.hooks.after_cycle = [&](std::size_t published, std::size_t failed) {
        reported += published;
        CHECK(failed == 0);
    };
    OutboxRelay relay(pg(), ob, publisher_config(), options);
    CHECK(drain(relay, ob) == total);
    CHECK(reported == total);
    const auto st = relay.stats();
    CHECK(st.published == total);
    CHECK(st.failed == 0);
    CHECK(st.errors == 0);
    CHECK(st.cycles >= total / 64);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE sent_at IS NOT NULL AND sent_at >= created_at",
                             ob.qualified_name())) == static_cast<std::int64_t>(total));

    const auto records = read_topic(topic, total, 30s);
    REQUIRE(records.size() == total);
    std::set<std::string> ids;
    for (const auto& r : records) {
        const std::string id = r.header(outbox_event_id_header);
        ids.insert(id);
        if (r.key && *r.key == bin_key)
            continue;
        REQUIRE(r.value);
        const TestEvent e = decode(*r.value);
        CHECK(e.id.to_string() == id);
        CHECK(payload_of[e.id] == *r.value);
        CHECK(r.key.has_value() == (e.entity != "nokey"));
    }
    CHECK(ids.size() == total);

    // Per key: one partition, and the order of enqueueing.
    const auto keyed = by_key(records);
    for (const auto& [key, expected] : sent_order) {
        INFO("key " << key);
        const auto it = keyed.find(key);
        REQUIRE(it != keyed.end());
        std::vector<EventId> got;
        for (const auto& r : it->second) {
            CHECK(r.partition == it->second.front().partition);
            got.push_back(EventId::parse(r.header(outbox_event_id_header)));
        }
        CHECK(got == expected);
    }

    const auto bin = keyed.find(bin_key);
    REQUIRE(bin != keyed.end());
    REQUIRE(bin->second.size() == 1);
    const auto& b = bin->second.front();
    CHECK(b.value == bin_payload);
    REQUIRE(b.headers.size() == 3);
    CHECK(b.headers[0].name == "h-bin");
    CHECK(b.headers[0].value == std::string("v\0\xff", 3));
    CHECK(b.headers[1].name == "null-valued");
    CHECK_FALSE(b.headers[1].value.has_value());
    CHECK(b.headers[2].name == outbox_event_id_header);
    CHECK(b.headers[2].value == bin_id.to_string());

    // Nothing left: another cycle publishes nothing.
    CHECK(relay.run_once() == 0);
}

TEST_CASE("outbox relay: a crash between the broker's ack and the mark re-publishes with the same event ids",
          "[integration][outbox]")
{
    const auto topic = unique_name("ob_crash");
    create_topic(topic, 2);
    const Outbox ob = make_outbox();
    const auto effects = make_effect_table();
    std::map<EventId, std::string> payload_of;
    {
        pqxx::connection conn(pg());
        pqxx::work tx(conn);
        for (int i = 0; i < 50; ++i) {
            const EventId id = Outbox::new_event_id();
            payload_of[id] = encode(TestEvent{id, fmt::format("order-{}", i % 5), i});
            ob.enqueue(tx, topic, std::string_view(fmt::format("order-{}", i % 5)), payload_of[id], {}, id);
        }
        tx.commit();
    }

    std::atomic<int> crashes{0};
    std::atomic<std::size_t> acknowledged_before_crash{0};
    auto options = relay_options();
    options.hooks.after_publish = [&](std::size_t acknowledged) {
        if (crashes == 0) {
            ++crashes;
            acknowledged_before_crash = acknowledged;
            throw SimulatedCrash{};
        }
    };
    OutboxRelay relay(pg(), ob, publisher_config(), options);
    REQUIRE_THROWS_AS(relay.run_once(), SimulatedCrash);
    CHECK(acknowledged_before_crash == 50); // on the topic ...
    CHECK(pending(ob) == 50);               // ... and still unsent
    CHECK(relay.stats().errors == 1);
    CHECK(relay.stats().published == 0);

    CHECK(drain(relay, ob) == 50);
    CHECK(relay.stats().published == 50);

    // Every event twice, both times with its one id and the same bytes.
    const auto records = read_topic(topic, 100, 30s);
    REQUIRE(records.size() == 100);
    std::map<std::string, int> copies;
    for (const auto& r : records) {
        const std::string id = r.header(outbox_event_id_header);
        ++copies[id];
        REQUIRE(r.value);
        CHECK(decode(*r.value).id.to_string() == id);
        CHECK(payload_of[EventId::parse(id)] == *r.value);
    }
    CHECK(copies.size() == 50);
    for (const auto& [id, n] : copies) {
        INFO("event " << id);
        CHECK(n == 2);
    }

    // Downstream dedup absorbs the repeat: one effect per event.
    const auto m = consume_downstream(topic, effects, 100);
    CHECK(m.claimed == 50);
    CHECK(m.duplicates == 50);
    CHECK(scalar("SELECT count(*) FROM " + effects) == 50);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == 50);
}

TEST_CASE("outbox relay: the relay thread retries a failed cycle with backoff and loses nothing",
          "[integration][outbox]")
{
    const auto topic = unique_name("ob_retry");
    create_topic(topic, 2);
    const Outbox ob = make_outbox();
    enqueue_events(ob, topic, 20, 4);
    std::atomic<int> calls{0};
    auto options = quiet_relay_options();
    options.hooks.after_publish = [&](std::size_t) {
        if (++calls <= 3)
            throw std::runtime_error("simulated failure before the mark");
    };
    OutboxRelay relay(pg(), ob, publisher_config(), options);
    relay.start();
    REQUIRE(wait_until([&] { return pending(ob) == 0; }, 30s));
    relay.stop();
    const auto st = relay.stats();
    CHECK(st.errors == 3);
    CHECK(st.published == 20);
    // Three failed attempts and the good one each published all 20: 4 copies,
    // every one with the row's id.
    const auto records = read_topic(topic, 80, 30s);
    REQUIRE(records.size() == 80);
    std::map<std::string, int> copies;
    for (const auto& r : records)
        ++copies[r.header(outbox_event_id_header)];
    CHECK(copies.size() == 20);
    for (const auto& [id, n] : copies)
        CHECK(n == 4);
}

TEST_CASE("outbox relay: a relay that cannot reach the broker marks nothing and another publishes it all",
          "[integration][outbox]")
{
    const auto topic = unique_name("ob_down");
    create_topic(topic, 2);
    const Outbox ob = make_outbox();
    {
        pqxx::connection conn(pg());
        pqxx::work tx(conn);
        for (int i = 0; i < 10; ++i)
            ob.enqueue(tx, topic, std::string_view("k"), fmt::format("p{}", i));
        tx.commit();
    }
    PublisherConfig nowhere;
    nowhere.brokers = "127.0.0.1:1";
    nowhere.kafka["message.timeout.ms"] = "1500";
    nowhere.kafka["log_level"] = "0"; // connection refused, over and over: expected
    nowhere.log = [](LogLevel, std::string_view) {};
    auto options = quiet_relay_options();
    options.publish_timeout = 5s;
    {
        OutboxRelay bad(pg(), ob, nowhere, options);
        CHECK(bad.run_once() == 0);
        CHECK(bad.stats().failed == 10);
        CHECK(bad.stats().published == 0);
        CHECK(bad.stats().held_keys == 0); // a whole batch failing backs off the relay, not keys
    }
    CHECK(pending(ob) == 10);

    OutboxRelay good(pg(), ob, publisher_config(), relay_options());
    CHECK(drain(good, ob) == 10);
    const auto records = read_topic(topic, 10, 30s);
    REQUIRE(records.size() == 10);
    for (std::size_t i = 0; i < records.size(); ++i)
        CHECK(records[i].value == fmt::format("p{}", i));
}

TEST_CASE("outbox relay: a record the producer refuses holds back only its key", "[integration][outbox]")
{
    const auto topic = unique_name("ob_poison");
    create_topic(topic, 1);
    const Outbox ob = make_outbox();
    pqxx::connection conn(pg());
    auto put = [&](std::optional<std::string_view> key, const std::string& payload) {
        pqxx::work tx(conn);
        ob.enqueue(tx, topic, key, payload);
        tx.commit();
    };
    put(std::string_view("A"), "a1");
    put(std::string_view("A"), "a2" + std::string(5000, 'x')); // larger than the producer takes
    put(std::string_view("A"), "a3");
    put(std::string_view("B"), "b1");
    put(std::string_view("B"), "b2");
    put(std::nullopt, "n1");

    PublisherConfig pc = publisher_config();
    pc.kafka["message.max.bytes"] = "2000";
    pc.log = [](LogLevel, std::string_view) {};
    auto options = quiet_relay_options();
    options.retry_backoff = 500ms;
    options.retry_backoff_max = 500ms;
    OutboxRelay relay(pg(), ob, pc, options);

    CHECK(relay.run_once() == 4); // a1, b1, b2, n1; a3 went out but stays unsent behind a2
    CHECK(relay.stats().failed == 1);
    CHECK(relay.stats().held_keys == 1);
    CHECK(pending(ob) == 2);

    // Key A waits for its retry; B goes on.
    put(std::string_view("B"), "b3");
    CHECK(relay.run_once() == 1);
    CHECK(pending(ob) == 2);
    CHECK(relay.stats().failed == 1); // a2 was not tried again yet

    // Fixed by hand; at the retry the failed row goes first, alone, then the rest.
    exec(fmt::format("UPDATE {} SET payload = 'a2' WHERE payload = decode('{}', 'hex')", ob.qualified_name(),
                     hex("a2" + std::string(5000, 'x'))));
    std::this_thread::sleep_for(600ms);
    CHECK(relay.run_once() == 1);
    CHECK(relay.run_once() == 1);
    CHECK(pending(ob) == 0);
    CHECK(relay.stats().held_keys == 0);

    const auto records = read_topic(topic, 8, 30s);
    REQUIRE(records.size() == 8);
    std::vector<std::string> a, b;
    for (const auto& r : records) {
        if (r.key == std::string("A"))
            a.push_back(r.value.value_or(""));
        if (r.key == std::string("B"))
            b.push_back(r.value.value_or(""));
    }
    CHECK(b == std::vector<std::string>{"b1", "b2", "b3"});
    // a3 had gone out before a2 failed, and is sent again after it, so the
    // key's newest record is last on the topic.
    CHECK(a == std::vector<std::string>{"a1", "a3", "a2", "a3"});
}

TEST_CASE("outbox relay: a relay frozen inside its cycle does not keep the outbox from another relay",
          "[integration][outbox]")
{
    // A relay's cycle is one transaction holding the relay lock and its rows
    // while it waits for the broker. Its process stopped there (SIGSTOP, a
    // paused VM, a lost network) must not leave every other relay standing by
    // for as long as it stays stopped. Here its thread stands still in the
    // after_publish hook: on the server, the same session idle in its
    // transaction.
    const auto topic = unique_name("ob_frozen");
    create_topic(topic, 2);
    const Outbox ob = make_outbox();
    enqueue_events(ob, topic, 20, 4);
    std::atomic<bool> stopped{false}, thawed{false}, ended{false};
    auto options = quiet_relay_options();
    options.publish_timeout = 1s; // its transaction is then bounded at 2 x 1 s + 5 s
    options.hooks.after_publish = [&](std::size_t) {
        stopped = true;
        wait_until([&] { return thawed.load(); }, 120s);
    };
    OutboxRelay frozen(pg(), ob, publisher_config(), options);
    std::thread t([&] {
        try {
            frozen.run_once();
        } catch (const DatabaseError&) {
            ended = true; // its session was ended: the mark failed
        } catch (...) {
        }
    });
    auto thaw = [&] {
        thawed = true;
        if (t.joinable())
            t.join();
    };
    struct ThawAtExit {
        std::function<void()> thaw;
        ~ThawAtExit() { thaw(); }
    } thaw_at_exit{thaw}; // a failed REQUIRE too
    REQUIRE(wait_until([&] { return stopped.load(); }, 30s));
    CHECK(pending(ob) == 20);

    OutboxRelay other(pg(), ob, publisher_config(), quiet_relay_options());
    std::size_t published = 0;
    const bool done = wait_until(
        [&] {
            published += other.run_once();
            return pending(ob) == 0;
        },
        30s);
    CHECK(done);
    CHECK(published == 20);
    CHECK(other.stats().standby > 0); // it stood by while the frozen relay held the lock
    thaw();
    CHECK(ended);
    CHECK(frozen.stats().published == 0);
    // Both published every row: each event on the topic, at least once.
    const auto records = read_all(topic, 20);
    std::set<std::string> ids;
    for (const auto& r : records)
        ids.insert(r.header(outbox_event_id_header));
    CHECK(ids.size() == 20);
}

TEST_CASE("outbox relay: two relays at once publish every row, in order per key, once downstream",
          "[integration][outbox]")
{
    const auto topic = unique_name("ob_two");
    create_topic(topic, 4);
    const Outbox ob = make_outbox();
    const auto effects = make_effect_table();

    auto options = relay_options();
    options.batch_size = 16;
    OutboxRelay r1(pg(), ob, publisher_config(), options);
    OutboxRelay r2(pg(), ob, publisher_config(), options);
    r1.start();
    r2.start();

    constexpr int total = 600;
    std::map<std::string, std::vector<EventId>> sent_order;
    {
        pqxx::connection conn(pg());
        for (int t = 0; t < total / 10; ++t) {
            pqxx::work tx(conn);
            for (int i = 0; i < 10; ++i) {
                const int seq = t * 10 + i;
                const std::string key = fmt::format("order-{}", seq % 20);
                const EventId id = Outbox::new_event_id();
                ob.enqueue(tx, topic, std::string_view(key), encode(TestEvent{id, key, seq}), {}, id);
                sent_order[key].push_back(id);
            }
            tx.commit();
            std::this_thread::sleep_for(2ms);
        }
    }
    REQUIRE(wait_until([&] { return pending(ob) == 0; }, 60s));
    r1.stop();
    r2.stop();
    const auto s1 = r1.stats();
    const auto s2 = r2.stats();
    INFO("relay 1: " << s1.published << " published, " << s1.cycles << " cycles, " << s1.standby << " standby");
    INFO("relay 2: " << s2.published << " published, " << s2.cycles << " cycles, " << s2.standby << " standby");
    CHECK(s1.published + s2.published == total); // each row marked by exactly one of them
    CHECK(s1.errors + s2.errors == 0);

    const auto records = read_all(topic, total);
    const auto keyed = by_key(records);
    std::set<std::string> all;
    for (const auto& [key, expected] : sent_order) {
        INFO("key " << key);
        const auto it = keyed.find(key);
        REQUIRE(it != keyed.end());
        // First occurrences in enqueue order (repeats, if any, are harmless).
        std::vector<EventId> first;
        std::set<std::string> seen;
        for (const auto& r : it->second) {
            const std::string id = r.header(outbox_event_id_header);
            all.insert(id);
            if (seen.insert(id).second)
                first.push_back(EventId::parse(id));
        }
        CHECK(first == expected);
    }
    CHECK(all.size() == static_cast<std::size_t>(total));

    const auto m = consume_downstream(topic, effects, records.size());
    CHECK(m.claimed == static_cast<std::uint64_t>(total));
    CHECK(scalar("SELECT count(*) FROM " + effects) == total);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + effects) == total);
}

TEST_CASE("outbox: sent rows older than the retention are purged in batches, unsent ones never",
          "[integration][outbox]")
{
    const Outbox ob = make_outbox();
    auto fill = [&](int sent_old, int sent_new, int unsent_old) {
        pqxx::connection conn(pg());
        pqxx::work tx(conn);
        for (int i = 0; i < sent_old + sent_new + unsent_old; ++i)
            ob.enqueue(tx, "t", std::nullopt, "p");
        tx.commit();
        exec(fmt::format("UPDATE {0} SET created_at = now() - interval '3 hours', sent_at = now() - interval '2 hours' "
                         "WHERE id IN (SELECT id FROM {0} WHERE sent_at IS NULL AND created_at > now() - interval '1 "
                         "hour' ORDER BY id LIMIT {1})",
                         ob.qualified_name(), sent_old));
        exec(fmt::format("UPDATE {0} SET sent_at = now() WHERE id IN (SELECT id FROM {0} WHERE sent_at IS NULL AND "
                         "created_at > now() - interval '1 hour' ORDER BY id LIMIT {1})",
                         ob.qualified_name(), sent_new));
        exec(fmt::format("UPDATE {0} SET created_at = now() - interval '3 hours' WHERE id IN (SELECT id FROM {0} "
                         "WHERE sent_at IS NULL AND created_at > now() - interval '1 hour' ORDER BY id LIMIT {1})",
                         ob.qualified_name(), unsent_old));
    };

    SECTION("purge_sent")
    {
        fill(20, 3, 5);
        pqxx::connection conn(pg());
        const OutboxPurgeLimits limits{7, 2, 0ms};
        CHECK(ob.purge_sent(conn, 1h, limits) == 14); // stopped at max_batches
        CHECK(ob.purge_sent(conn, 1h, limits) == 6);
        CHECK(ob.purge_sent(conn, 1h, limits) == 0);
        CHECK(rows(ob) == 8);
        CHECK(pending(ob) == 5);
    }

    SECTION("by the relay thread")
    {
        fill(10, 2, 4);
        auto options = relay_options();
        options.retention = 1h;
        options.purge_limits.batch = 3;
        options.purge_limits.pause = 0ms;
        // The unsent rows go to a topic on the broker; the purge must not touch
        // the rows it publishes either.
        OutboxRelay relay(pg(), ob, publisher_config(), options);
        relay.start();
        REQUIRE(wait_until([&] { return relay.stats().purged >= 10 && pending(ob) == 0; }, 30s));
        relay.stop();
        CHECK(relay.stats().purged == 10);
        CHECK(rows(ob) == 6);
    }
}
