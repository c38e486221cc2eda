#include <atomic>
#include <vector>

#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"
#include "core/worker_pool.hpp"

TEST_CASE("worker pool runs every worker of every round exactly once, calls done once, and waits", "[unit]")
{
    idemkafka::detail::WorkerPool pool(4);
    std::vector<int> per_worker(4, 0); // each worker writes only its own slot
    std::atomic<int> total{0};
    int done_calls = 0; // written by the last worker of a round, read after wait()
    bool all_workers_before_done = true;
    for (int round = 0; round < 2000; ++round) {
        const std::size_t workers = 1 + static_cast<std::size_t>(round % 4);
        const int before = total.load();
        pool.start(
            workers,
            [&](std::size_t worker) {
                ++per_worker[worker];
                total.fetch_add(1, std::memory_order_relaxed);
            },
            [&] {
                // Every worker of the round has finished before done runs.
                all_workers_before_done = all_workers_before_done && total.load() == before + static_cast<int>(workers);
                ++done_calls;
            });
        pool.wait();
        REQUIRE(done_calls == round + 1);
    }
    CHECK(all_workers_before_done);
    CHECK(total == 500 * (1 + 2 + 3 + 4));
    CHECK(per_worker[0] == 2000);
    CHECK(per_worker[1] == 1500);
    CHECK(per_worker[2] == 1000);
    CHECK(per_worker[3] == 500);
}

TEST_CASE("worker pool: wait() without a start returns, the destructor waits for started work", "[unit]")
{
    std::atomic<int> ran{0};
    {
        idemkafka::detail::WorkerPool pool(2);
        pool.wait();
        pool.start(2, [&](std::size_t) {
            for (int i = 0; i < 1000; ++i)
                ran.fetch_add(1);
        });
    }
    CHECK(ran == 2000);
}

TEST_CASE("metrics are updated from several threads without loss", "[unit]")
{
    idemkafka::Metrics m;
    idemkafka::detail::WorkerPool pool(4);
    for (int round = 0; round < 200; ++round) {
        pool.start(4, [&](std::size_t) {
            for (int i = 0; i < 50; ++i) {
                m.claimed.add();
                m.handler_seconds.observe(0.002);
            }
        });
        pool.wait();
    }
    const auto s = m.snapshot();
    CHECK(s.claimed == 200 * 4 * 50);
    CHECK(s.handler_seconds.count == 200 * 4 * 50);
}
