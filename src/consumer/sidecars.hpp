#pragma once
// What runs beside a consumer on threads of its own. Private to the library.

#include <cstdint>
#include <memory>
#include <optional>

#include "consumer/claim_age.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka::detail {

/// Retention maintenance, the claim-age monitor and the outbox relay, each
/// when the configuration asks for it: started once the workers connected
/// (the claims table exists), stopped after the member left its group.
class Sidecars {
public:
    void start(const ConsumerConfig& cfg, const ProcessedEventStore& store, Metrics& metrics, const LogSink& log);
    /// Stops each (joins its thread).
    void stop() noexcept;

    /// Handlers may have enqueued: the relay publishes now, not at its next poll.
    void wake_relay()
    {
        if (relay_)
            relay_->wake();
    }
    /// Expired partitions maintenance keeps for a group's longer retention, when it runs.
    std::optional<std::uint64_t> expired_partitions_kept() const
    {
        if (!maintenance_)
            return std::nullopt;
        return maintenance_->expired_partitions_kept();
    }

private:
    std::unique_ptr<MaintenanceRunner> maintenance_;
    std::unique_ptr<ClaimAgeMonitor> claim_age_;
    std::unique_ptr<OutboxRelay> relay_;
};

} // namespace idemkafka::detail
