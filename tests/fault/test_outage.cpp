// An outage is not poison: a downstream service that fails every handler
// call for a while must not send the backlog to the dead-letter topic, while
// a record that fails on its own is still dead-lettered after max_attempts.
// Both with Ordering::partition and with Ordering::key over two workers.

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

constexpr int partitions = 4;

// The library's retry defaults (100 ms doubling, 5 attempts): a record that
// fails on every call is dead-lettered about 1.5 s after its first failure.
ConsumerConfig outage_config(const Fixture& f, Ordering ordering)
{
    auto cfg = f.config();
    cfg.retry_backoff = 100ms;
    cfg.retry_backoff_max = 10s;
    cfg.max_attempts = 5;
    cfg.ordering = ordering;
    cfg.workers = ordering == Ordering::key ? 2 : 1;
    cfg.max_batch = 200;
    // Probes every 0.5, 1, 2, 2, ... s: the backlog goes on soon after the outage.
    cfg.circuit_breaker.backoff = 500ms;
    cfg.circuit_breaker.backoff_max = 2s;
    return cfg;
}

const char* name_of(Ordering o)
{
    return o == Ordering::key ? "Ordering::key, 2 workers" : "Ordering::partition";
}

// After the first `healthy` handler calls, every call fails for `length`,
// then every call succeeds again.
struct Outage {
    Outage(std::chrono::steady_clock::duration l, int h) : length(l), healthy(h) {}

    std::chrono::steady_clock::duration length;
    int healthy;
    std::mutex mu;
    int calls = 0;
    std::optional<std::chrono::steady_clock::time_point> began;
    std::atomic<int> failed_calls{0};

    bool on()
    {
        std::lock_guard<std::mutex> lock(mu);
        if (++calls <= healthy)
            return false;
        const auto now = std::chrono::steady_clock::now();
        if (!began)
            began = now;
        return now - *began < length;
    }
};

void outage_backlog(Ordering ordering)
{
    INFO(name_of(ordering));
    Fixture f(partitions);
    f.publish(3000); // 50 keys over the partitions
    const auto n = static_cast<std::int64_t>(f.events.size());
    Outage outage(15s, 500);          // in the middle of the backlog, the handler busy until then
    std::atomic<int> last_attempt{0}; // the highest attempt that succeeded
    Consumer c(outage_config(f, ordering), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                   if (outage.on()) {
                       ++outage.failed_calls;
                       throw std::runtime_error("payment provider unavailable (503)");
                   }
                   f.insert(tx, e, ctx);
                   for (int seen = last_attempt;
                        ctx.attempt() > seen && !last_attempt.compare_exchange_weak(seen, ctx.attempt());)
                       ;
               });
    const auto t0 = std::chrono::steady_clock::now();
    Runner<Consumer> run(c);
    // Every record ends somewhere: charged, or (before the breaker) dead-lettered.
    const bool settled = wait_until(
        [&] {
            return f.rows() + static_cast<std::int64_t>(c.metrics().snapshot().dead_lettered_total()) >= n &&
                   f.committed_total(partitions) == n;
        },
        120s);
    run.join();
    fail_if_threw(run.error());
    const auto m = c.metrics().snapshot();
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    WARN(fmt::format("{}: {} records, outage 15 s: {} failed calls, {} dead letters, circuit opened {} times, open "
                     "{:.1f} s; {} effects, {} committed in Kafka, {} in flight after {} ms",
                     name_of(ordering), n, outage.failed_calls.load(), m.dead_lettered_total(), m.circuit_opened,
                     m.circuit_open_seconds, f.rows(), f.committed_total(partitions), m.in_flight_records,
                     took.count()));
    REQUIRE(settled);
    CHECK(outage.failed_calls > 0);
    CHECK(m.dead_lettered_total() == 0);
    // The failures that showed the outage were forgiven, and none while the
    // circuit was open counted: every record succeeded at its first attempt.
    CHECK(last_attempt == 1);
    f.check_exact(static_cast<std::size_t>(n));
    CHECK(m.circuit_opened >= 1);
    CHECK(m.circuit_open == 0);
    CHECK(m.circuit_open_seconds > 5);
    CHECK(read_topic(f.group + ".dlq", 1, 2s).empty());
}

// `n` records of keys poison-0, poison-1, ... (not flushed); their ids.
std::set<EventId> publish_poison(Publisher& pub, const std::string& topic, int n)
{
    std::set<EventId> ids;
    for (int k = 0; k < n; ++k) {
        TestEvent e{new_event_id(), fmt::format("poison-{}", k), k};
        ids.insert(e.id);
        pub.publish_async(topic, e.entity, encode(e));
    }
    return ids;
}

// The handler: records of poison-* keys always fail (counted in `calls`),
// the others insert their effect.
auto poisoned_handler(Fixture& f, std::atomic<int>& calls)
{
    return [&f, &calls](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.entity.rfind("poison-", 0) == 0) {
            ++calls;
            throw std::runtime_error("card declined by a bug");
        }
        f.insert(tx, e, ctx);
    };
}

// Exactly `poison` is on the dead-letter topic, each after `max_attempts` counted attempts.
void check_dead_letters(const Fixture& f, const std::set<EventId>& poison, int max_attempts)
{
    const auto dlq = read_topic(f.group + ".dlq", poison.size(), 30s);
    REQUIRE(dlq.size() == poison.size());
    std::set<EventId> dead;
    for (const auto& r : dlq) {
        CHECK(r.header("idemkafka.attempts") == std::to_string(max_attempts));
        dead.insert(EventId::parse(r.header("idemkafka.event_id")));
    }
    CHECK(dead == poison);
}

// One key's records always fail among the healthy records of 50 other keys.
void poison_key(Ordering ordering)
{
    INFO(name_of(ordering));
    Fixture f(partitions);
    const std::string bad_key = "always-failing";
    std::set<EventId> bad;
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 2000; ++i) {
            const bool is_bad = i % 400 == 100; // 5 records, spread over the backlog
            TestEvent e{new_event_id(), is_bad ? bad_key : fmt::format("entity-{}", i % 50), i};
            if (is_bad)
                bad.insert(e.id);
            f.events.push_back(e);
            pub.publish_async(f.topic, e.entity, encode(e));
        }
        pub.flush();
    }
    const auto n = static_cast<std::int64_t>(f.events.size());
    const auto good = n - static_cast<std::int64_t>(bad.size());
    auto cfg = outage_config(f, ordering);
    cfg.retry_backoff = 50ms; // 5 attempts in 750 ms per bad record
    std::atomic<int> bad_calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (e.entity == bad_key) {
            ++bad_calls;
            throw std::runtime_error("card declined by a bug");
        }
        f.insert(tx, e, ctx);
    });
    run_until(c, [&] {
        return f.rows() == good && c.metrics().snapshot().dead_lettered_total() == bad.size() &&
               f.committed_total(partitions) == n;
    });
    const auto m = c.metrics().snapshot();
    CHECK(bad_calls == static_cast<int>(bad.size()) * cfg.max_attempts);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == bad.size());
    CHECK(m.circuit_opened == 0);
    CHECK(m.circuit_open == 0);
    f.check_exact(static_cast<std::size_t>(good));
    check_dead_letters(f, bad, cfg.max_attempts);
}

// Poison at the heads of the partitions, behind it records the group had
// processed before (duplicates, as after a restart), and live traffic after
// them. At first nothing but the poison runs, so the circuit opens; its
// probes must look past the poison and the duplicates to the live records,
// close, and the poison must then be dead-lettered after max_attempts.
// (Ordering::key: with Ordering::partition the poison holds every partition
// and nothing but it can run, which the circuit cannot tell from an outage.)
void poison_heads_before_duplicates(Ordering ordering)
{
    INFO(name_of(ordering));
    constexpr int poison_keys = 12; // 3 at the head of each partition, about
    constexpr int seen = 2000;      // and 500 duplicates behind them
    Fixture f(partitions);
    // The group processes `seen` records of another topic first: their ids
    // are claimed when they come again on this one.
    const std::string earlier = unique_name("fault-earlier");
    create_topic(earlier, partitions);
    f.publish_to(earlier, seen);
    {
        Consumer first(consumer_config(f.group, earlier), decode, event_id_of,
                       [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
        run_until(first, [&] { return f.rows() == seen; });
    }
    std::set<EventId> poison;
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        poison = publish_poison(pub, f.topic, poison_keys);
        pub.flush();
        for (const auto& e : f.events)
            pub.publish_async(f.topic, e.entity, encode(e));
        pub.flush();
    }
    auto cfg = outage_config(f, ordering);
    cfg.max_attempts = 3;
    std::atomic<int> poison_calls{0};
    Consumer c(cfg, decode, event_id_of, poisoned_handler(f, poison_calls));
    Runner<Consumer> run(c);
    const bool opened = wait_until([&] { return c.metrics().snapshot().circuit_opened >= 1; }, 60s);
    // Live traffic, 20 records every 20 ms, until the poison is dead-lettered.
    std::atomic<bool> stop_live{false};
    std::vector<TestEvent> live; // the producer's until it is joined
    std::thread producer([&] {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; !stop_live; ++i) {
            for (int j = 0; j < 20; ++j) {
                TestEvent e{new_event_id(), fmt::format("live-{}", (i * 20 + j) % 50), i * 20 + j};
                live.push_back(e);
                pub.publish_async(f.topic, e.entity, encode(e));
            }
            pub.flush();
            std::this_thread::sleep_for(20ms);
        }
    });
    const bool dead_lettered =
        opened && wait_until([&] { return c.metrics().snapshot().dead_lettered_total() >= poison_keys; }, 60s);
    stop_live = true;
    producer.join();
    const auto healthy = static_cast<std::int64_t>(seen + live.size());
    const auto total = healthy + poison_keys;
    const bool drained =
        dead_lettered && wait_until([&] { return f.rows() == healthy && f.committed_total(partitions) == total; }, 60s);
    const auto m = c.metrics().snapshot();
    const std::string at_end = nonzero_metrics(c);
    run.join();
    fail_if_threw(run.error());
    WARN(fmt::format("{}: {} poison calls, circuit opened {} times, open {:.1f} s, {} live records, {} effects, "
                     "{} committed of {}",
                     name_of(ordering), poison_calls.load(), m.circuit_opened, m.circuit_open_seconds, live.size(),
                     f.rows(), f.committed_total(partitions), total));
    INFO(at_end);
    REQUIRE(opened);
    REQUIRE(dead_lettered);
    REQUIRE(drained);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == poison_keys);
    CHECK(m.dead_lettered_total() == poison_keys);
    CHECK(m.circuit_open == 0);
    CHECK(poison_calls >= poison_keys * cfg.max_attempts);
    f.check_exact(static_cast<std::size_t>(healthy));
    check_dead_letters(f, poison, cfg.max_attempts);
}

// Poison alone at the tail of a quiet topic, at the head of every partition
// it reaches (Ordering::partition): nothing healthy is left to run, so no
// probe can succeed and the circuit cannot tell the poison from an outage.
// After give_up_after it counts the probes' failures again, and the poison
// is dead-lettered after max_attempts.
void poison_alone_at_the_tail(Ordering ordering)
{
    INFO(name_of(ordering));
    constexpr int healthy = 400;
    constexpr int poison_keys = 8;
    Fixture f(partitions);
    f.publish(healthy);
    auto cfg = outage_config(f, ordering);
    cfg.circuit_breaker.give_up_after = 4s;
    std::atomic<int> poison_calls{0};
    Consumer c(cfg, decode, event_id_of, poisoned_handler(f, poison_calls));
    Runner<Consumer> run(c);
    const bool drained = wait_until([&] { return f.committed_total(partitions) == healthy; }, 60s);
    // The topic is quiet; then the poison comes, and nothing after it.
    std::set<EventId> poison;
    if (drained) {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        poison = publish_poison(pub, f.topic, poison_keys);
        pub.flush();
    }
    const auto total = healthy + poison_keys;
    const auto t0 = std::chrono::steady_clock::now();
    const bool settled = drained && wait_until(
                                        [&] {
                                            return c.metrics().snapshot().dead_lettered_total() >= poison_keys &&
                                                   f.committed_total(partitions) == total;
                                        },
                                        60s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    const auto m = c.metrics().snapshot();
    const std::string at_end = nonzero_metrics(c);
    run.join();
    fail_if_threw(run.error());
    WARN(fmt::format("{}: {} poison records alone at the tail: {} poison calls, circuit opened {} times, gave up {} "
                     "times, open {:.1f} s; dead-lettered and committed {} ms after they were published",
                     name_of(ordering), poison_keys, poison_calls.load(), m.circuit_opened, m.circuit_gave_up,
                     m.circuit_open_seconds, took.count()));
    INFO(at_end);
    REQUIRE(drained);
    REQUIRE(settled);
    CHECK(m.circuit_opened >= 1);  // the poison alone looked like an outage ...
    CHECK(m.circuit_gave_up >= 1); // ... until give_up_after
    CHECK(m.circuit_open_seconds >= 4);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == poison_keys);
    CHECK(m.dead_lettered_total() == poison_keys);
    CHECK(poison_calls > poison_keys * cfg.max_attempts); // the calls before the circuit opened were forgiven
    f.check_exact(static_cast<std::size_t>(healthy));
    check_dead_letters(f, poison, cfg.max_attempts);
}

// Three keys that always fail while healthy records trickle in, one a
// second: the poison's retries outnumber the successes, so its failures look
// like an outage and open the circuit; a probe's success closes it again.
// The poison must still be dead-lettered (the handler works for the others)
// long before give_up_after, and nothing healthy with it.
void poison_among_a_trickle(Ordering ordering)
{
    INFO(name_of(ordering));
    constexpr int poison_keys = 3;
    Fixture f(partitions);
    auto cfg = outage_config(f, ordering);
    cfg.circuit_breaker.give_up_after = 600s; // the default: not what ends it
    std::atomic<int> poison_calls{0};
    Consumer c(cfg, decode, event_id_of, poisoned_handler(f, poison_calls));
    Runner<Consumer> run(c);
    std::atomic<bool> stop_live{false};
    std::vector<TestEvent> live; // the producer's until it is joined
    std::set<EventId> poison;
    std::thread producer([&] {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        poison = publish_poison(pub, f.topic, poison_keys);
        pub.flush();
        for (int i = 0; !stop_live; ++i) { // a healthy record a second
            TestEvent e{new_event_id(), fmt::format("live-{}", i % 50), i};
            live.push_back(e);
            pub.publish_async(f.topic, e.entity, encode(e));
            pub.flush();
            std::this_thread::sleep_for(1s);
        }
    });
    const auto t0 = std::chrono::steady_clock::now();
    const bool dead_lettered =
        wait_until([&] { return c.metrics().snapshot().dead_lettered_total() >= poison_keys; }, 45s);
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    stop_live = true;
    producer.join();
    const auto healthy = static_cast<std::int64_t>(live.size());
    const auto total = healthy + poison_keys;
    const bool drained = wait_until([&] { return f.rows() == healthy && f.committed_total(partitions) == total; }, 30s);
    const auto m = c.metrics().snapshot();
    const std::string at_end = nonzero_metrics(c);
    run.join();
    fail_if_threw(run.error());
    WARN(fmt::format("{}: {} poison keys among {} live records: {} poison calls, circuit opened {} times, open "
                     "{:.1f} s; dead-lettered after {} ms",
                     name_of(ordering), poison_keys, live.size(), poison_calls.load(), m.circuit_opened,
                     m.circuit_open_seconds, took.count()));
    INFO(at_end);
    REQUIRE(dead_lettered);
    REQUIRE(drained);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == poison_keys);
    CHECK(m.dead_lettered_total() == poison_keys);
    CHECK(m.circuit_gave_up == 0);
    CHECK(m.circuit_open == 0);
    f.check_exact(static_cast<std::size_t>(healthy));
    check_dead_letters(f, poison, cfg.max_attempts);
}

} // namespace

TEST_CASE("poison alone at the tail of a quiet topic: the circuit gives up after give_up_after, the poison is "
          "dead-lettered",
          "[fault][outage]")
{
    poison_alone_at_the_tail(Ordering::partition);
}

TEST_CASE("poison at the heads of the partitions before duplicates: the probes look past both, the poison is "
          "dead-lettered",
          "[fault][outage]")
{
    poison_heads_before_duplicates(Ordering::key);
}

TEST_CASE("three poison keys while healthy records trickle in: the poison is dead-lettered", "[fault][outage]")
{
    poison_among_a_trickle(Ordering::key);
}

TEST_CASE("an outage of every handler call for 15 s dead-letters nothing: the circuit opens, probes, closes",
          "[fault][outage]")
{
    outage_backlog(Ordering::partition);
}

TEST_CASE("an outage with Ordering::key and 2 workers dead-letters nothing", "[fault][outage]")
{
    outage_backlog(Ordering::key);
}

TEST_CASE("one key that always fails among healthy keys: only its records are dead-lettered, the circuit stays closed",
          "[fault][outage]")
{
    poison_key(Ordering::partition);
}

TEST_CASE("one key that always fails, with Ordering::key and 2 workers: only its records are dead-lettered",
          "[fault][outage]")
{
    poison_key(Ordering::key);
}
