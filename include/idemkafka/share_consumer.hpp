#pragma once
/// \file
/// IdempotentShareConsumer<Event>: a member of a Kafka share group (KIP-932,
/// "queues for Kafka") whose handler's effects are committed at most once per
/// (event id, group), and whose records are acknowledged only after that.
/// A preview, as librdkafka's share consumer is: built only with a librdkafka
/// that has it (2.15 or later), see IDEMKAFKA_HAS_SHARE_CONSUMER.

#include "idemkafka/features.hpp"

#if IDEMKAFKA_HAS_SHARE_CONSUMER

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "idemkafka/config.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

/// Configuration of an IdempotentShareConsumer: a ConsumerConfig (brokers,
/// the share group in `group_id`, topics, PostgreSQL, claims table,
/// retention, dead letters, handler policies) and what a share group adds.
/// The lock duration and the delivery-count limit are settings of the share
/// group on the broker, which librdkafka 2.15 cannot read: they must be
/// repeated here, and must not exceed the group's.
struct IDEMKAFKA_API ShareConsumerConfig {
    /// brokers, group_id (the share group), topics, postgres and the rest.
    /// Refused here: offsets_in_database, Ordering::key and workers other
    /// than 1 (parallelism comes from `members`). Not used: pipeline,
    /// commit_interval, max_batch_wait, the prefetch caps, the circuit
    /// breaker's probe_records (a probe is one poll's records). The circuit
    /// breaker is one for all members: while it is open they keep their
    /// records in hand and acquire no more (docs/share-groups.md, "Outages").
    /// max_attempts applies up to
    /// `delivery_limit`. db_timeout, lock_timeout and dead_letter_timeout left
    /// at ConsumerConfig's defaults are derived from the batch budget (a
    /// third of it each); set larger than the budget, they are refused.
    ConsumerConfig consumer;
    /// The group's acquisition lock (group.share.record.lock.duration.ms,
    /// 30 s by default): every record must be acknowledged within it.
    std::chrono::milliseconds lock_duration{30000};
    /// Time budget of a batch, from the poll that acquired it to its
    /// acknowledgements: records not handled by then are given back
    /// (RELEASE). Zero: half of lock_duration. Must be less than lock_duration.
    std::chrono::milliseconds batch_budget{0};
    /// The group's delivery-count limit (group.share.delivery.count.limit,
    /// 5 by default). A record on that delivery is never released (the
    /// broker would archive it without a trace): it is dead-lettered and
    /// rejected instead when it fails or cannot run in time.
    int delivery_limit = 5;
    /// Members of the share group in this process, each a thread with its own
    /// share consumer and PostgreSQL connection. With more than one the
    /// handler, decoder and log sink are called from several threads at once.
    std::size_t members = 1;

    /// Throws ConfigError naming the first invalid field.
    void validate() const;
    /// batch_budget, or half of lock_duration when it is zero.
    std::chrono::milliseconds effective_batch_budget() const noexcept;
};

/// Counters of what a share consumer acknowledged; read them with get().
struct IDEMKAFKA_API ShareMetrics {
    Metrics::Counter accepted; ///< records ACCEPTed: committed, a duplicate, or skipped by the reconcile hook
    Metrics::Counter released; ///< records RELEASEd for another delivery (handler failure, budget, database)
    Metrics::Counter rejected; ///< records REJECTed after their dead letter was acknowledged
    /// Records dead-lettered because they failed, or could not run, on their
    /// last delivery (delivery_limit), instead of being released.
    Metrics::Counter delivery_limit_dead_letters;
    /// Records given back (released) because the batch used up its budget.
    Metrics::Counter budget_given_back;
    /// Partitions whose acknowledgements the broker refused or did not answer
    /// (a lock that lapsed: the batch took longer than the lock; the records
    /// come again and are ACCEPTed as duplicates), and records whose
    /// acknowledgement librdkafka refused to record. Each is logged.
    Metrics::Counter acks_refused;
    /// Records released on their last delivery because nothing else was
    /// possible (dead letter refused, database away): archived by the broker
    /// without a dead letter. Each is logged as an error.
    Metrics::Counter archived_without_dead_letter;
    /// Records with an error from librdkafka (corrupt or undecompressable
    /// batches), acknowledged by librdkafka itself; each is logged.
    Metrics::Counter record_errors;
    /// Outages detected: the circuit breaker opened (handler calls failing
    /// across many records), or PostgreSQL failed outside the handlers. Each
    /// is logged.
    Metrics::Counter outages;
    /// Times a member stopped acquiring records for an outage (no poll until
    /// its backoff is over: acquiring would only spend deliveries). Logged.
    Metrics::Counter acquisition_pauses;
    /// Times a member acquired records again after such a pause (a probe of
    /// the circuit breaker, or PostgreSQL back). Logged.
    Metrics::Counter acquisition_resumes;
};

namespace detail {

/// The non-template half of IdempotentShareConsumer (src/share/). Not part of the API.
class IDEMKAFKA_API ShareEngine {
public:
    /// Throws ConfigError for an invalid `config`. Keeps a reference to `stage`.
    ShareEngine(ShareConsumerConfig config, Stage& stage);
    ~ShareEngine();
    ShareEngine(const ShareEngine&) = delete;
    ShareEngine& operator=(const ShareEngine&) = delete;

    /// IdempotentShareConsumer::run().
    void run();
    /// IdempotentShareConsumer::stop().
    void stop() noexcept;
    /// IdempotentShareConsumer::metrics().
    const Metrics& metrics() const noexcept;
    /// IdempotentShareConsumer::share_metrics().
    const ShareMetrics& share_metrics() const noexcept;

private:
    struct IDEMKAFKA_LOCAL Impl;
    std::unique_ptr<Impl> impl_;
    std::atomic<bool> stop_{false};
    static_assert(std::atomic<bool>::is_always_lock_free, "stop() must be async-signal-safe");
};

} // namespace detail

/// Consumes `config.consumer.topics` as a member (or `config.members`
/// members) of the share group `config.consumer.group_id`: the broker hands
/// out records, not partitions, each under a time-limited lock, and each
/// record is acknowledged. Each batch of records is decoded, screened and
/// claimed in one PostgreSQL transaction as IdempotentConsumer does (same
/// decoder, event id function and handler shapes, same claims table), and
/// acknowledged by its outcome only once that outcome is durable: ACCEPT
/// after COMMIT (or a duplicate claim), RELEASE after a handler failure (a
/// redelivery, perhaps to another member), REJECT after the record's dead
/// letter was acknowledged by the broker. A record on its last delivery
/// (ShareConsumerConfig::delivery_limit) is dead-lettered rather than
/// released. No order is kept, across or within partitions: serialise per
/// entity with entity_lock() in the handler where it matters.
template <class Event> class IdempotentShareConsumer {
public:
    /// As IdempotentConsumer<Event>::Decoder.
    using Decoder = typename detail::TypedStage<Event>::Decoder;
    /// As IdempotentConsumer<Event>::EventIdOf.
    using EventIdOf = typename detail::TypedStage<Event>::EventIdOf;
    /// As IdempotentConsumer<Event>::RecordEventIdOf.
    using RecordEventIdOf = typename detail::TypedStage<Event>::RecordEventIdOf;
    /// As IdempotentConsumer<Event>::Handler; Context::attempt() is the
    /// record's delivery count.
    using Handler = typename detail::TypedStage<Event>::Handler;
    /// As IdempotentConsumer<Event>::BatchHandler.
    using BatchHandler = typename detail::TypedStage<Event>::BatchHandler;

    /// Takes what IdempotentConsumer's constructor takes, with a
    /// ShareConsumerConfig. Throws ConfigError for invalid configuration.
    /// Nothing connects until run().
    template <class Decode, class IdOf, class Handle>
    IdempotentShareConsumer(ShareConsumerConfig config, Decode&& decode, IdOf&& event_id_of, Handle&& handle)
        : stage_(std::forward<Decode>(decode), std::forward<IdOf>(event_id_of), std::forward<Handle>(handle)),
          engine_(std::move(config), stage_)
    {
    }

    IdempotentShareConsumer(const IdempotentShareConsumer&) = delete;
    IdempotentShareConsumer& operator=(const IdempotentShareConsumer&) = delete;

    /// Connects to PostgreSQL (creating the claims table when
    /// `create_schema` is set), starts the members and processes records
    /// until stop(). Returns once every member acknowledged its last batch
    /// and left the group. Throws DatabaseError/KafkaError when start-up
    /// fails, and rethrows what ended a member (the others are stopped first).
    void run() { engine_.run(); }

    /// Asks run() to end each member's current batch, acknowledge it and
    /// return: a handler call in progress finishes, the rest of its
    /// transaction is abandoned (rolled back); what committed is ACCEPTed,
    /// the rest RELEASEd for the next member (a record on its last delivery
    /// is dead-lettered instead). A poll in progress ends at its timeout, 500
    /// ms at most. Async-signal-safe: only sets an atomic flag.
    void stop() noexcept { engine_.stop(); }

    /// Live counters, as IdempotentConsumer's; safe to read from any thread.
    const Metrics& metrics() const noexcept { return engine_.metrics(); }
    /// Acknowledgement counters; safe to read from any thread.
    const ShareMetrics& share_metrics() const noexcept { return engine_.share_metrics(); }

private:
    detail::TypedStage<Event> stage_;
    detail::ShareEngine engine_;
};

} // namespace idemkafka

#endif // IDEMKAFKA_HAS_SHARE_CONSUMER
