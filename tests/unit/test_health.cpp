// Liveness and readiness judged from a metrics snapshot (health_of), without services.

#include <idemkafka/health.hpp>

#include "catch_compat.hpp"

using namespace idemkafka;

namespace {

constexpr std::int64_t now = 1'800'000'000'000;

MetricsSnapshot running()
{
    MetricsSnapshot m;
    m.loop_heartbeat_unix_ms = now - 150;
    m.rebalances = 1;
    PartitionLag p;
    p.topic = "orders";
    p.partition = 3;
    p.lag = 12;
    p.stalled_seconds = 2;
    m.partitions.push_back(p);
    return m;
}

bool mentions(const ConsumerHealth& h, const std::string& part)
{
    for (const auto& r : h.reasons)
        if (r.find(part) != std::string::npos)
            return true;
    return false;
}

} // namespace

TEST_CASE("health: a running, assigned consumer is live and ready", "[unit][health]")
{
    const auto h = health_of(running(), now);
    CHECK(h.live);
    CHECK(h.ready);
    CHECK(h.reasons.empty());
    CHECK(h.to_json() == R"({"live":true,"ready":true,"reasons":[]})");
}

TEST_CASE("health: not ready before run(), before the first assignment, in an outage", "[unit][health]")
{
    auto m = running();
    m.loop_heartbeat_unix_ms = -1;
    m.rebalances = 0;
    auto h = health_of(m, now);
    CHECK(h.live);
    CHECK_FALSE(h.ready);
    CHECK(mentions(h, "not running"));
    CHECK(mentions(h, "no partitions assigned"));

    m = running();
    m.circuit_open = 1;
    m.partitions[0].stalled_seconds = 3600; // held by the circuit: waiting, not stuck
    h = health_of(m, now);
    CHECK(h.live);
    CHECK_FALSE(h.ready);
    CHECK(mentions(h, "circuit breaker is open"));

    m = running();
    m.db_paused = 1;
    m.partitions[0].stalled_seconds = 3600;
    h = health_of(m, now);
    CHECK(h.live);
    CHECK_FALSE(h.ready);
    CHECK(mentions(h, "PostgreSQL is away"));
}

TEST_CASE("health: not live with a stalled loop or a stuck partition", "[unit][health]")
{
    auto m = running();
    m.loop_heartbeat_unix_ms = now - 61'000;
    auto h = health_of(m, now);
    CHECK_FALSE(h.live);
    CHECK_FALSE(h.ready);
    CHECK(mentions(h, "loop has done no work for 61000 ms"));

    m = running();
    m.partitions[0].stalled_seconds = 301;
    h = health_of(m, now);
    CHECK_FALSE(h.live);
    CHECK(mentions(h, "orders/3 has not moved for 301 s with 12 records waiting"));
    // Caught up: nothing waits, however long the position stood still.
    m.partitions[0].lag = 0;
    CHECK(health_of(m, now).live);
    // A shorter bound, configured.
    m = running();
    HealthConfig cfg;
    cfg.partition_stall_after = std::chrono::seconds(1);
    CHECK_FALSE(health_of(m, now, cfg).live);
}
