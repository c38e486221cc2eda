#include <atomic>
#include <vector>

#include <idemkafka/metrics.hpp>

#include "catch_compat.hpp"
#include "lane_pool.hpp"

TEST_CASE("lane pool runs every lane of every round exactly once and joins", "[unit]")
{
    idemkafka::detail::LanePool pool(3);
    std::vector<int> per_lane(4, 0); // each lane writes only its own slot
    std::atomic<int> total{0};
    for (int round = 0; round < 2000; ++round) {
        const std::size_t lanes = 1 + static_cast<std::size_t>(round % 4);
        pool.run(lanes, [&](std::size_t lane) {
            ++per_lane[lane];
            total.fetch_add(1, std::memory_order_relaxed);
        });
    }
    CHECK(total == 500 * (1 + 2 + 3 + 4));
    CHECK(per_lane[0] == 2000);
    CHECK(per_lane[1] == 1500);
    CHECK(per_lane[2] == 1000);
    CHECK(per_lane[3] == 500);
}

TEST_CASE("metrics are updated from several threads without loss", "[unit]")
{
    idemkafka::Metrics m;
    idemkafka::detail::LanePool pool(3);
    for (int round = 0; round < 200; ++round)
        pool.run(4, [&](std::size_t) {
            for (int i = 0; i < 50; ++i) {
                m.claimed.add();
                m.handler_seconds.observe(0.002);
            }
        });
    const auto s = m.snapshot();
    CHECK(s.claimed == 200 * 4 * 50);
    CHECK(s.handler_seconds.count == 200 * 4 * 50);
}
