#include "idemkafka/health.hpp"

#include <fmt/format.h>

#include "observe/log_context.hpp"

namespace idemkafka {

std::string ConsumerHealth::to_json() const
{
    std::string out =
        fmt::format("{{\"live\":{},\"ready\":{},\"reasons\":[", live ? "true" : "false", ready ? "true" : "false");
    for (std::size_t i = 0; i < reasons.size(); ++i) {
        if (i)
            out += ",";
        detail::append_json_string(out, reasons[i]);
    }
    return out + "]}";
}

ConsumerHealth health_of(const MetricsSnapshot& m, std::int64_t now_ms, const HealthConfig& config)
{
    ConsumerHealth h;
    auto not_ready = [&h](std::string why) {
        h.ready = false;
        h.reasons.push_back(std::move(why));
    };
    auto not_live = [&h](std::string why) {
        h.live = false;
        h.ready = false;
        h.reasons.push_back(std::move(why));
    };
    if (m.loop_heartbeat_unix_ms < 0)
        not_ready("not running: its loop has not started");
    else if (now_ms - m.loop_heartbeat_unix_ms > config.loop_stall_after.count())
        not_live(fmt::format("its loop has done no work for {} ms", now_ms - m.loop_heartbeat_unix_ms));
    if (m.rebalances == 0)
        not_ready("no partitions assigned yet (no rebalance seen)");
    if (m.circuit_open)
        not_ready("the circuit breaker is open: handler failures across keys look like an outage");
    if (m.db_paused)
        not_ready("PostgreSQL is away: the assignment is paused");
    const bool held = m.circuit_open || m.db_paused;
    const double stall_s = std::chrono::duration<double>(config.partition_stall_after).count();
    for (const auto& p : m.partitions)
        if (!held && p.lag > 0 && p.stalled_seconds > stall_s)
            not_live(fmt::format("partition {}/{} has not moved for {:.0f} s with {} records waiting", p.topic,
                                 p.partition, p.stalled_seconds, p.lag));
    return h;
}

} // namespace idemkafka
