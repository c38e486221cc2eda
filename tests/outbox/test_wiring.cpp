// A consumer configured with an outbox creates it and runs its relay.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "catch_compat.hpp"
#include "test_env.hpp"
#include <fmt/format.h>
#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>
using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

TEST_CASE("wiring: a consumer with an outbox runs its relay", "[integration][outbox]")
{
    const auto in = unique_name("w_in");
    const auto out = unique_name("w_out");
    create_topic(in, 2);
    create_topic(out, 2);
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    for (int i = 0; i < 100; ++i) {
        TestEvent e{new_event_id(), fmt::format("o{}", i % 7), i};
        pub.publish_async(in, e.entity, encode(e));
    }
    pub.flush();
    auto cfg = consumer_config(unique_name("g"), in);
    OutboxConfig oc;
    oc.table = unique_name("wob");
    oc.relay_options.poll_interval = std::chrono::milliseconds(5000); // only wake() makes it quick
    cfg.outbox = oc;
    const Outbox ob = oc.outbox();
    IdempotentConsumer<TestEvent> c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        const EventId id = Outbox::new_event_id();
        ob.enqueue(tx, out, std::string_view(e.entity), encode(TestEvent{id, e.entity, e.amount}), {}, id);
    });
    {
        Runner<IdempotentConsumer<TestEvent>> run(c);
        REQUIRE(wait_until(
            [&] {
                return scalar("SELECT count(*) FROM pg_class WHERE oid = to_regclass('" + ob.qualified_name() + "')") ==
                           1 &&
                       scalar("SELECT count(*) FROM " + ob.qualified_name() + " WHERE sent_at IS NOT NULL") == 100;
            },
            60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    CHECK(read_topic(out, 100, 30s).size() == 100);
    CHECK(c.metrics().snapshot().outbox_published == 100);
    OutboxConfig bad;
    bad.table = "";
    cfg.outbox = bad;
    CHECK_THROWS_AS(
        IdempotentConsumer<TestEvent>(cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {}),
        ConfigError);
}

TEST_CASE("trace context: a record's traceparent reaches its handler, its log lines and what the relay publishes",
          "[integration][outbox][trace]")
{
    const auto in = unique_name("tr_in");
    const auto out = unique_name("tr_out");
    create_topic(in, 1);
    create_topic(out, 1);
    // Record i has trace id <i as 32 hex digits>; every fifth has none.
    auto trace_id = [](int i) { return fmt::format("{:032x}", i + 1); };
    auto traceparent = [&](int i) { return fmt::format("00-{}-00f067aa0ba902b7-01", trace_id(i)); };
    constexpr int n = 50;
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    std::vector<TestEvent> events;
    for (int i = 0; i < n; ++i) {
        TestEvent e{new_event_id(), fmt::format("o{}", i % 7), i};
        events.push_back(e);
        std::vector<Header> h;
        if (i % 5 != 0)
            h = {{"traceparent", traceparent(i)}, {"tracestate", std::string("vendor=") + std::to_string(i)}};
        pub.publish(in, e.entity, encode(e), h);
    }
    pub.flush();

    auto cfg = consumer_config(unique_name("g"), in);
    cfg.retry_backoff = std::chrono::milliseconds(20);
    std::mutex mu;
    std::vector<LogRecord> lines;
    cfg.log = [&, fallback = log_sink()](const LogRecord& r) {
        {
            std::lock_guard<std::mutex> lock(mu);
            lines.push_back(r);
        }
        fallback(r);
    };
    OutboxConfig oc;
    oc.table = unique_name("trob");
    cfg.outbox = oc;
    const Outbox ob = oc.outbox();
    std::atomic<int> seen_mismatch{0};
    std::atomic<bool> failed_once{false};
    IdempotentConsumer<TestEvent> c(
        cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            const int i = static_cast<int>(e.amount);
            if (ctx.trace_id() != (i % 5 != 0 ? trace_id(i) : std::string()))
                ++seen_mismatch;
            // No headers given: the outbox adds the record's trace context by itself.
            const EventId id = Outbox::new_event_id();
            ob.enqueue(tx, out, std::string_view(e.entity), encode(TestEvent{id, e.entity, e.amount}), {}, id);
            if (i == 7 && !failed_once.exchange(true))
                throw std::runtime_error("first attempt of record 7 fails");
        });
    {
        Runner<IdempotentConsumer<TestEvent>> run(c);
        REQUIRE(wait_until(
            [&] {
                return scalar("SELECT count(*) FROM pg_class WHERE oid = to_regclass('" + ob.qualified_name() + "')") ==
                           1 &&
                       scalar("SELECT count(*) FROM " + ob.qualified_name() + " WHERE sent_at IS NOT NULL") == n;
            },
            60s));
        run.join();
        REQUIRE_FALSE(run.error());
    }
    CHECK(seen_mismatch == 0);
    const auto published = read_topic(out, n, 30s);
    REQUIRE(published.size() == static_cast<std::size_t>(n));
    int traced = 0;
    for (const auto& r : published) {
        const auto e = decode(*r.value);
        const int i = static_cast<int>(e.amount);
        INFO("record " << i);
        if (i % 5 == 0) {
            CHECK(r.header("traceparent").empty());
            continue;
        }
        CHECK(r.header("traceparent") == traceparent(i));
        CHECK(r.header("tracestate") == "vendor=" + std::to_string(i));
        ++traced;
    }
    CHECK(traced == n - n / 5);
    // The failure line about record 7 carries its trace id.
    std::lock_guard<std::mutex> lock(mu);
    const auto failure = std::find_if(lines.begin(), lines.end(), [](const LogRecord& r) {
        return r.message.find("first attempt of record 7 fails") != std::string::npos;
    });
    REQUIRE(failure != lines.end());
    CHECK(failure->field(log_field::trace_id) == std::optional<std::string_view>(trace_id(7)));
}
