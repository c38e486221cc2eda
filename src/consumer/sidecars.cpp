#include "consumer/sidecars.hpp"

namespace idemkafka::detail {

void Sidecars::start(const ConsumerConfig& cfg, const ProcessedEventStore& store, Metrics& metrics, const LogSink& log)
{
    if (cfg.retention.maintenance)
        maintenance_ = std::make_unique<MaintenanceRunner>(cfg.postgres, store, cfg.retention, log);
    if (cfg.oldest_claim_refresh.count() > 0)
        claim_age_ = std::make_unique<ClaimAgeMonitor>(cfg.postgres, store, cfg.group_id, cfg.oldest_claim_refresh,
                                                       metrics.oldest_claim_unix_ms, log);
    if (cfg.outbox && cfg.outbox->relay) {
        auto oc = *cfg.outbox;
        auto user_hook = oc.relay_options.hooks.after_cycle;
        oc.relay_options.hooks.after_cycle = [&metrics, user_hook](std::size_t published, std::size_t failed) {
            metrics.outbox_published.add(published);
            metrics.outbox_failures.add(failed);
            if (user_hook)
                user_hook(published, failed);
        };
        relay_ = OutboxRelay::for_consumer(oc, cfg.postgres, cfg.brokers, cfg.kafka, log);
        relay_->start();
    }
}

void Sidecars::stop() noexcept
{
    maintenance_.reset();
    claim_age_.reset();
    relay_.reset();
}

} // namespace idemkafka::detail
