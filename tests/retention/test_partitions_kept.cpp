// An expired partition that cannot be dropped (its DROP waits longer than the
// retention lock_timeout for a transaction on it) is counted: the
// MaintenanceRunner's expired_partitions_kept() and the consumer's gauge show
// it, with a warning line, until a later run drops it (e2dde55).

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "retention_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

struct WarningLines {
    std::mutex mu;
    std::vector<std::string> lines;
    LogSink sink()
    {
        return [this](const LogRecord& r) {
            if (r.level < LogLevel::warning)
                return;
            std::lock_guard<std::mutex> lock(mu);
            lines.push_back(r.message);
        };
    }
    std::size_t count(std::string_view text)
    {
        std::lock_guard<std::mutex> lock(mu);
        std::size_t n = 0;
        for (const auto& l : lines)
            n += l.find(text) != std::string::npos ? 1 : 0;
        return n;
    }
};

bool has(const std::vector<std::string>& v, const std::string& s)
{
    return std::find(v.begin(), v.end(), s) != v.end();
}

} // namespace

TEST_CASE("an expired partition whose DROP times out is counted as kept until a run drops it", "[retention]")
{
    const ProcessedEventStore store("public", unique_name("pe_kept"));
    DropTable drop{store.qualified_name()};
    // Partitions laid out 30 days ago: every one of them has expired by now.
    TestClock past;
    past.set(now_ms() - 30 * day_ms);
    auto conn = connect();
    Maintenance(store, RetentionConfig{}, {}, past.fn()).migrate(*conn);
    const std::int64_t day0 = past.get() - past.get() % day_ms;
    const std::string held = partition_name(store.table(), day0 - 7 * day_ms); // the oldest
    const auto before = partitions(*conn, store);
    REQUIRE(before.size() == 12); // 11 ranges and the default
    REQUIRE(has(before, held));

    // A transaction reading the oldest partition: its DROP cannot get the lock.
    auto locker = connect();
    std::optional<pqxx::work> hold;
    hold.emplace(*locker);
    hold->exec(fmt::format("LOCK TABLE public.\"{}\" IN ACCESS SHARE MODE", held));
    struct Release {
        std::optional<pqxx::work>& tx;
        void now()
        {
            if (tx)
                tx->abort();
            tx.reset();
        }
        ~Release() { now(); }
    } release{hold};

    RetentionConfig rc;
    rc.lock_timeout = 300ms;
    rc.maintenance_interval = 300ms;

    SECTION("MaintenanceRunner::expired_partitions_kept")
    {
        WarningLines logs;
        std::optional<MaintenanceRunner> runner;
        runner.emplace(pg(), store, rc, logs.sink());
        REQUIRE(wait_until([&] { return runner->runs() >= 1; }, 45s));
        CHECK(runner->expired_partitions_kept() == 1);
        const auto report = runner->last_report();
        REQUIRE(report);
        CHECK(report->partitions_kept == std::vector<std::string>{held});
        CHECK(report->partitions_dropped.size() == 10);
        CHECK(logs.count("could not drop partition " + held) >= 1);
        CHECK(logs.count("lock not available within lock_timeout") >= 1);
        CHECK(has(partitions(*conn, store), held));
        release.now();
        const auto runs = runner->runs();
        REQUIRE(wait_until([&] { return runner->runs() > runs + 1 && runner->expired_partitions_kept() == 0; }, 45s));
        runner.reset();
        CHECK_FALSE(has(partitions(*conn, store), held));
    }

    SECTION("the consumer's gauge")
    {
        const auto topic = unique_name("kept");
        create_topic(topic, 1);
        auto cfg = consumer_config(unique_name("g"), topic);
        cfg.table = store.table();
        cfg.retention = rc;
        WarningLines logs;
        cfg.log = logs.sink();
        using Consumer = IdempotentConsumer<TestEvent>;
        Consumer c(cfg, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
        Runner<Consumer> run(c);
        const bool kept = wait_until([&] { return c.metrics().snapshot().expired_partitions_kept == 1; }, 45s);
        CHECK(logs.count("could not drop partition " + held) >= 1);
        CHECK(has(partitions(*conn, store), held));
        release.now();
        const bool dropped = kept && wait_until(
                                         [&] {
                                             return c.metrics().snapshot().expired_partitions_kept == 0 &&
                                                    !has(partitions(*conn, store), held);
                                         },
                                         45s);
        run.join();
        REQUIRE_FALSE(run.error());
        REQUIRE(kept);
        REQUIRE(dropped);
        CHECK(c.metrics().snapshot().expired_partitions_kept == 0);
    }
}
