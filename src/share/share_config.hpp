#pragma once
// ShareConsumerConfig as the share engine runs it. Private to the library.

#include "idemkafka/config.hpp"
#include "idemkafka/share_consumer.hpp"

namespace idemkafka::detail {

/// The ConsumerConfig each member's pieces (Intake, ClaimTransaction,
/// DeadLetterer) run with: the timeouts left at their defaults derived from
/// the batch budget, max_attempts at most the delivery limit (the broker's
/// delivery count is the attempt), max_batch_duration the budget. `config`
/// must be valid.
ConsumerConfig effective_consumer_config(const ShareConsumerConfig& config);

} // namespace idemkafka::detail
