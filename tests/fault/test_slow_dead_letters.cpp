// Dead letters of records that cannot be decoded are published before
// their unit's transactions, and each waits for the broker's
// acknowledgement (up to dead_letter_timeout). A broker slow to acknowledge
// must not keep the consumer from polling: with several workers, longer
// than max.poll.interval.ms would drop the member from the group.

#include <atomic>
#include <chrono>
#include <string>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// Log lines that show the member dropped from the group.
struct Drops {
    std::atomic<int> max_poll_exceeded{0};
    std::atomic<int> lost{0};

    LogSink sink()
    {
        return [this, fallback = log_sink()](const LogRecord& r) {
            if (r.message.find("maximum poll interval") != std::string::npos)
                ++max_poll_exceeded;
            if (r.message.find("lost; committing nothing") != std::string::npos)
                ++lost;
            fallback(r);
        };
    }
};

} // namespace

TEST_CASE("dead-letter publishes slower than max.poll.interval.ms keep the member in the group",
          "[fault][dead-letter][mock]")
{
    constexpr int partitions = 4;
    constexpr int garbage = 8; // two per partition, about
    Fixture f(partitions);
    f.publish(200);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < garbage; ++i)
            pub.publish_async(f.topic, fmt::format("garbage-{}", i), "not an event");
        pub.flush();
    }
    // The dead-letter producer's requests fail, retriably, 30 times: about
    // 15 s or more before its records are acknowledged.
    std::string errors;
    for (int i = 0; i < 30; ++i)
        errors += " NOT_ENOUGH_REPLICAS";
    mock_control("push-errors Produce" + errors);
    Drops drops;
    auto cfg = f.config();
    cfg.workers = 4;
    cfg.max_batch = 40;
    cfg.kafka["max.poll.interval.ms"] = "6000";
    cfg.dead_letter_kafka["retry.backoff.ms"] = "500";
    cfg.log = drops.sink();
    Consumer c(cfg, decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
    const auto t0 = std::chrono::steady_clock::now();
    run_until(
        c,
        [&] {
            const auto m = c.metrics().snapshot();
            return f.rows() == 200 && m.dead_lettered_for(DeadLetterReason::decode_error) >= garbage &&
                   f.committed_total(partitions) == 200 + garbage;
        },
        120s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    const auto m = c.metrics().snapshot();
    WARN(fmt::format("{} dead letters acknowledged after {} ms ({} not acknowledged in time)", m.dead_lettered_total(),
                     took.count(), m.dead_letter_failures));
    CHECK(took > 6s); // the publishes did take longer than max.poll.interval.ms
    CHECK(drops.max_poll_exceeded == 0);
    CHECK(drops.lost == 0);
    CHECK(m.dead_lettered_for(DeadLetterReason::decode_error) == garbage);
    f.check_exact(200);
    CHECK(read_topic(f.group + ".dlq", garbage, 30s).size() == garbage);
}
