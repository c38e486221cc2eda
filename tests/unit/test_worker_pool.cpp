#include <atomic>
#include <chrono>
#include <set>
#include <vector>

#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"
#include "core/worker_pool.hpp"

using idemkafka::detail::WorkerPool;
using Clock = std::chrono::steady_clock;

namespace {

// Takes finished work until `n` workers came back; fails instead of hanging.
std::vector<std::size_t> take(WorkerPool& pool, std::size_t n)
{
    std::vector<std::size_t> got;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (got.size() < n && Clock::now() < deadline) {
        pool.wait_any_until(Clock::now() + std::chrono::milliseconds(100));
        for (auto w : pool.take_done())
            got.push_back(w);
    }
    return got;
}

} // namespace

TEST_CASE("worker pool runs each submitted work once on its own worker, and reports each finish once", "[unit]")
{
    std::atomic<int> finished_calls{0};
    WorkerPool pool(4, [&] { finished_calls.fetch_add(1); });
    std::vector<int> per_worker(4, 0); // each worker writes only its own slot
    std::atomic<int> total{0};
    int submitted = 0;
    for (int round = 0; round < 2000; ++round) {
        const std::size_t workers = 1 + static_cast<std::size_t>(round % 4);
        for (std::size_t w = 0; w < workers; ++w) {
            REQUIRE_FALSE(pool.busy(w));
            pool.submit(w, [&, w] {
                ++per_worker[w];
                total.fetch_add(1, std::memory_order_relaxed);
            });
            ++submitted;
        }
        const auto got = take(pool, workers);
        REQUIRE(got.size() == workers);
        REQUIRE(std::set<std::size_t>(got.begin(), got.end()).size() == workers);
        REQUIRE(pool.busy_count() == 0);
    }
    CHECK(finished_calls == submitted);
    CHECK(total == 500 * (1 + 2 + 3 + 4));
    CHECK(per_worker[0] == 2000);
    CHECK(per_worker[1] == 1500);
    CHECK(per_worker[2] == 1000);
    CHECK(per_worker[3] == 500);
}

TEST_CASE("worker pool: a slow worker does not hold back the others, which take new work meanwhile", "[unit]")
{
    WorkerPool pool(3);
    std::atomic<bool> release{false};
    std::atomic<int> fast{0};
    pool.submit(0, [&] {
        while (!release.load())
            std::this_thread::yield();
    });
    for (int i = 0; i < 300; ++i) {
        const std::size_t w = 1 + static_cast<std::size_t>(i % 2);
        pool.submit(w, [&] { fast.fetch_add(1); });
        REQUIRE(take(pool, 1) == std::vector<std::size_t>{w});
    }
    CHECK(fast == 300);
    CHECK(pool.busy(0));
    CHECK_FALSE(pool.wait_until(0, Clock::now() + std::chrono::milliseconds(10)));
    release = true;
    CHECK(pool.wait_until(0, Clock::now() + std::chrono::seconds(20)));
    CHECK(take(pool, 1) == std::vector<std::size_t>{0});
    CHECK_FALSE(pool.busy(0));
}

TEST_CASE("worker pool: waiting without work returns, the destructor waits for submitted work", "[unit]")
{
    std::atomic<int> ran{0};
    {
        WorkerPool pool(2);
        pool.wait_all();
        CHECK_FALSE(pool.wait_any_until(Clock::now() + std::chrono::seconds(5))); // nothing runs: at once
        for (std::size_t w = 0; w < 2; ++w)
            pool.submit(w, [&] {
                for (int i = 0; i < 1000; ++i)
                    ran.fetch_add(1);
            });
    }
    CHECK(ran == 2000);
}

TEST_CASE("metrics are updated from several threads without loss", "[unit]")
{
    idemkafka::Metrics m;
    WorkerPool pool(4);
    for (int round = 0; round < 200; ++round) {
        for (std::size_t w = 0; w < 4; ++w)
            pool.submit(w, [&] {
                for (int i = 0; i < 50; ++i) {
                    m.claimed.add();
                    m.handler_seconds.observe(0.002);
                }
            });
        pool.wait_all();
        pool.take_done();
    }
    const auto s = m.snapshot();
    CHECK(s.claimed == 200 * 4 * 50);
    CHECK(s.handler_seconds.count == 200 * 4 * 50);
}
