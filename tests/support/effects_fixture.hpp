#pragma once
// A topic, a consumer group and an effects table for tests that count effects:
// every event once, nothing else. Shared by the fault-label programs.

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

namespace idemkafka::test {

using Consumer = IdempotentConsumer<TestEvent>;

struct Fixture {
    std::string topic = unique_name("fault");
    std::string group = unique_name("g");
    std::string effects = unique_name("effect");
    std::vector<TestEvent> events;

    explicit Fixture(int partitions)
    {
        create_topic(topic, partitions);
        exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, member text,"
                         " kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)",
                         effects));
    }

    void publish(int n, const std::string& key_prefix = "entity") { publish_to(topic, n, key_prefix); }

    // As publish(), into another topic (the events are still kept here).
    void publish_to(const std::string& into, int n, const std::string& key_prefix = "entity")
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < n; ++i) {
            TestEvent e{new_event_id(), fmt::format("{}-{}", key_prefix, i % 50), i};
            events.push_back(e);
            pub.publish_async(into, e.entity, encode(e));
        }
        pub.flush();
    }

    void insert(pqxx::work& tx, const TestEvent& e, const Context& ctx, const std::string& member = "") const
    {
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, member, kafka_partition, kafka_offset)"
                                            " VALUES ($1::uuid, $2, $3, $4)",
                                            effects),
                                e.id.to_string(), member, ctx.partition(), ctx.offset());
    }

    std::int64_t rows() const { return scalar("SELECT count(*) FROM " + effects); }
    std::int64_t distinct_rows() const { return scalar("SELECT count(DISTINCT event_id) FROM " + effects); }
    std::int64_t claims() const
    {
        return scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group));
    }

    // The group's committed offsets in Kafka over partitions 0..partitions-1.
    std::int64_t committed_total(int partitions) const
    {
        std::int64_t total = 0;
        for (int p = 0; p < partitions; ++p)
            total += std::max<std::int64_t>(0, committed_offset(group, topic, p));
        return total;
    }

    // Exact effect counts: every event once, nothing else.
    void check_exact(std::size_t expected) const
    {
        CHECK(rows() == static_cast<std::int64_t>(expected));
        CHECK(distinct_rows() == static_cast<std::int64_t>(expected));
        CHECK(claims() == static_cast<std::int64_t>(expected));
    }

    ConsumerConfig config() const
    {
        auto cfg = consumer_config(group, topic);
        cfg.retry_backoff = std::chrono::milliseconds(20);
        return cfg;
    }
};

// Fails the test with the message of what a consumer's run() threw, if it threw
// a std::exception (`context` says which run it was); anything else propagates.
inline void fail_if_threw(std::exception_ptr e, const char* context = "run() threw")
{
    if (!e)
        return;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        FAIL(context << ": " << ex.what());
    }
}

// The counters and gauges of `c` that are not zero, a line each (histograms
// and comments left out): where a consumer stood when a wait timed out.
inline std::string nonzero_metrics(const Consumer& c)
{
    std::string out;
    const std::string text = c.metrics().snapshot().to_prometheus("");
    std::size_t at = 0;
    while (at < text.size()) {
        auto end = text.find('\n', at);
        if (end == std::string::npos)
            end = text.size();
        const std::string line = text.substr(at, end - at);
        at = end + 1;
        const bool zero = line.size() >= 2 && line.compare(line.size() - 2, 2, " 0") == 0;
        if (line.empty() || line[0] == '#' || zero || line.find("_bucket{") != std::string::npos)
            continue;
        out += line;
        out += '\n';
    }
    return out;
}

// Runs `c` until `done()` or `timeout`. On a timeout the failure shows the
// consumer's metrics at that moment (claims, lag, failures, reconnects), so
// that the part of the condition that was not met can be told.
template <class F> void run_until(Consumer& c, F&& done, std::chrono::seconds timeout = std::chrono::seconds(90))
{
    Runner<Consumer> run(c);
    const bool ok = wait_until(std::forward<F>(done), timeout);
    const std::string at_timeout = ok ? std::string() : nonzero_metrics(c);
    run.join();
    fail_if_threw(run.error());
    if (!ok)
        FAIL("the condition was not met within " << timeout.count() << " s; the consumer's metrics then:\n"
                                                 << at_timeout);
}

} // namespace idemkafka::test
