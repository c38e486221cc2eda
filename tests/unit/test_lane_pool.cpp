#include <atomic>
#include <vector>

#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"
#include "lane_pool.hpp"

TEST_CASE("lane pool runs every lane of every round exactly once, calls done once, and waits", "[unit]")
{
    idemkafka::detail::LanePool pool(4);
    std::vector<int> per_lane(4, 0); // each lane writes only its own slot
    std::atomic<int> total{0};
    int done_calls = 0; // written by the last lane of a round, read after wait()
    bool all_lanes_before_done = true;
    for (int round = 0; round < 2000; ++round) {
        const std::size_t lanes = 1 + static_cast<std::size_t>(round % 4);
        const int before = total.load();
        pool.start(
            lanes,
            [&](std::size_t lane) {
                ++per_lane[lane];
                total.fetch_add(1, std::memory_order_relaxed);
            },
            [&] {
                // Every lane of the round has finished before done runs.
                all_lanes_before_done = all_lanes_before_done && total.load() == before + static_cast<int>(lanes);
                ++done_calls;
            });
        pool.wait();
        REQUIRE(done_calls == round + 1);
    }
    CHECK(all_lanes_before_done);
    CHECK(total == 500 * (1 + 2 + 3 + 4));
    CHECK(per_lane[0] == 2000);
    CHECK(per_lane[1] == 1500);
    CHECK(per_lane[2] == 1000);
    CHECK(per_lane[3] == 500);
}

TEST_CASE("lane pool: wait() without a start returns, the destructor waits for started work", "[unit]")
{
    std::atomic<int> ran{0};
    {
        idemkafka::detail::LanePool pool(2);
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
    idemkafka::detail::LanePool pool(4);
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
