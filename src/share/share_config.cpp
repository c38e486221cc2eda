// ShareConsumerConfig's checks: what has no meaning for a share group is
// refused, and every bound of a batch must fit in the lock's time budget.

#include "share/share_config.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "idemkafka/error.hpp"

namespace idemkafka {
namespace {

// ConsumerConfig's defaults of the bounds a batch must fit in its budget:
// left as they are, they are derived from the budget instead.
constexpr std::chrono::milliseconds consumer_default_bound{30000};

void require(bool ok, const std::string& what)
{
    if (!ok)
        throw ConfigError(what);
}

void require_within(std::chrono::milliseconds value, const char* name, std::chrono::milliseconds budget)
{
    if (value == consumer_default_bound)
        return; // derived
    require(value.count() > 0 && value < budget,
            fmt::format("consumer.{}: {} ms does not fit in the batch budget ({} ms, from lock_duration): a share "
                        "group's record must be acknowledged within its lock; set it below the budget (0, no bound, "
                        "is refused here)",
                        name, value.count(), budget.count()));
}

} // namespace

std::chrono::milliseconds ShareConsumerConfig::effective_batch_budget() const noexcept
{
    return batch_budget.count() > 0 ? batch_budget : lock_duration / 2;
}

void ShareConsumerConfig::validate() const
{
    consumer.validate();
    require(lock_duration.count() >= 100,
            "lock_duration: must be at least 100 ms (the share group's group.share.record.lock.duration.ms)");
    require(batch_budget.count() >= 0, "batch_budget: must not be negative");
    const auto budget = effective_batch_budget();
    require(budget < lock_duration, fmt::format("batch_budget: {} ms must be less than lock_duration ({} ms): the "
                                                "acknowledgements need the rest of the lock",
                                                budget.count(), lock_duration.count()));
    require(delivery_limit >= 1 && delivery_limit <= 32767,
            "delivery_limit: must be between 1 and 32767 (the share group's group.share.delivery.count.limit)");
    require(members >= 1 && members <= 256, "members: must be between 1 and 256");
    require(!consumer.offsets_in_database,
            "consumer.offsets_in_database: a share group has no positions to store; refused for share consumers");
    require(consumer.ordering == Ordering::partition,
            "consumer.ordering: a share group keeps no order (Ordering::key is refused); serialise per entity with "
            "entity_lock() in the handler");
    require(consumer.workers == 1,
            "consumer.workers: must be 1 for a share consumer; ShareConsumerConfig::members sets its parallelism");
    require(consumer.outbox == std::nullopt || !consumer.outbox->relay,
            "consumer.outbox: the relay does not run inside a share consumer yet; run OutboxRelay on its own");
    for (const char* key : {"group.instance.id", "enable.auto.commit", "enable.auto.offset.store", "isolation.level",
                            "share.acknowledgement.mode", "group.protocol"})
        require(!consumer.kafka.count(key),
                fmt::format("consumer.kafka[\"{}\"]: does not apply to a share consumer (the library sets what it "
                            "needs)",
                            key));
    require_within(consumer.db_timeout, "db_timeout", budget);
    require_within(consumer.lock_timeout, "lock_timeout", budget);
    require_within(consumer.dead_letter_timeout, "dead_letter_timeout", budget);
    require(consumer.max_batch_duration.count() == 0 || consumer.max_batch_duration <= budget,
            fmt::format("consumer.max_batch_duration: {} ms exceeds the batch budget ({} ms); leave it 0",
                        consumer.max_batch_duration.count(), budget.count()));
}

namespace detail {

ConsumerConfig effective_consumer_config(const ShareConsumerConfig& config)
{
    ConsumerConfig c = config.consumer;
    const auto budget = config.effective_batch_budget();
    const auto third = std::max(std::chrono::milliseconds(1), budget / 3);
    if (c.db_timeout == consumer_default_bound)
        c.db_timeout = third;
    if (c.lock_timeout == consumer_default_bound)
        c.lock_timeout = third;
    if (c.dead_letter_timeout == consumer_default_bound)
        c.dead_letter_timeout = third;
    c.max_batch_duration = budget;
    c.max_attempts = std::min(c.max_attempts, config.delivery_limit);
    // The circuit breaker stays as configured: while it is open the members
    // keep their records in hand and acquire no more (src/share/).
    return c;
}

} // namespace detail
} // namespace idemkafka
