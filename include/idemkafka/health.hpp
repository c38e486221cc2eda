#pragma once
/// \file
/// Liveness and readiness of a consumer, for a supervisor's probes (Kubernetes
/// livenessProbe / readinessProbe through the service's HTTP endpoint): judged
/// from a MetricsSnapshot, so any thread may ask at any time.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "idemkafka/export.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

/// When a consumer counts as stuck.
struct IDEMKAFKA_API HealthConfig {
    /// Not live when the consumer's loop has not done its periodic work for
    /// this long (it runs every 200 ms while run() runs).
    std::chrono::milliseconds loop_stall_after{std::chrono::seconds(60)};
    /// Not live when a partition's position has not moved for this long while
    /// records wait on it, unless the circuit breaker or the database gate
    /// holds the assignment (that is an outage the consumer waits out: not
    /// ready, but a restart would not help). Longer than the longest retry
    /// backoff and handler call.
    std::chrono::milliseconds partition_stall_after{std::chrono::minutes(5)};
};

/// A consumer's liveness and readiness, with the reasons for each "no".
struct IDEMKAFKA_API ConsumerHealth {
    bool live = true;                 ///< false: restart it (a stuck loop or partition)
    bool ready = true;                ///< false: do not count on it now (starting, outage, circuit open)
    std::vector<std::string> reasons; ///< one line per failed check, empty when both hold
    /// `{"live":true,"ready":false,"reasons":["..."]}`.
    std::string to_json() const;
};

/// The health of the consumer whose metrics `m` are, at `now_unix_ms`:
/// not ready before its first assignment (no rebalance yet) or before run()
/// (no loop heartbeat), while the circuit breaker is open or probing, while
/// PostgreSQL is away (the database gate), or while it is not live; not live
/// when its loop's heartbeat is older than `config.loop_stall_after`, or when
/// a partition stalled longer than `config.partition_stall_after` with records
/// waiting and neither the circuit nor the gate holds it. Never throws but
/// std::bad_alloc.
IDEMKAFKA_API ConsumerHealth health_of(const MetricsSnapshot& m, std::int64_t now_unix_ms,
                                       const HealthConfig& config = {});

} // namespace idemkafka
