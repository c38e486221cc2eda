#pragma once
/// \file
/// IdempotentConsumer<Event>: a Kafka consumer whose handler's effects are
/// committed at most once per (event id, consumer group).

#include <string_view>
#include <utility>

#include "idemkafka/batch.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/detail/stage.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

/// Consumes `config.topics` in group `config.group_id` and, for each record:
/// decodes it, takes its event id, and in one PostgreSQL transaction claims the
/// id in the claims table and runs the handler only if the claim is new. Up to
/// `max_batch` records share one transaction and one claim statement. Kafka
/// offsets are committed (explicitly, per partition) only after that
/// transaction has committed. A handler that throws rolls the transaction back;
/// the record is delivered again after a backoff and the partition's offset
/// does not move past it, while other records of the batch commit.
///
/// The handler comes in two forms. A per-record handler
/// `void(pqxx::work&, const Event&, const Context&)` is called once per newly
/// claimed record. A batch handler `void(pqxx::work&, const Batch<Event>&)` is
/// called once per transaction with all of them, so it can write every row of
/// the batch with one statement (`INSERT ... SELECT * FROM unnest(...)`): the
/// fastest way through PostgreSQL. When a batch handler throws, the transaction
/// rolls back and runs again with the handler called for one event at a time
/// (a `Batch` of size 1), which finds the failing record; that record is then
/// retried or dead-lettered like any other, and the rest commits.
template <class Event> class IdempotentConsumer {
public:
    /// Turns a record's payload into an Event; throw (DecodeError or anything)
    /// for a record that cannot be decoded.
    using Decoder = typename detail::TypedStage<Event>::Decoder;
    /// Returns the event id carried in the event's payload.
    using EventIdOf = typename detail::TypedStage<Event>::EventIdOf;
    /// Returns the event id of a record whose id is outside the payload (in
    /// a header, say) or made of both.
    using RecordEventIdOf = typename detail::TypedStage<Event>::RecordEventIdOf;
    /// Applies the event's business effect inside `tx`. Throwing rolls back.
    using Handler = typename detail::TypedStage<Event>::Handler;
    /// Applies the effects of all newly claimed events of a transaction inside
    /// `tx`. Throwing rolls back (see the class comment for what follows).
    using BatchHandler = typename detail::TypedStage<Event>::BatchHandler;

    /// `decode` may take `const Record&` or just the payload (`std::string_view`;
    /// a null payload is then a decode error). `event_id_of` is called after
    /// `decode` with `(const Event&)` (an EventIdOf: the id in the payload),
    /// `(const Record&, const Event&)` (a RecordEventIdOf) or `(const Record&)`
    /// (the id in headers: cloud_event_record_id, DebeziumOutboxId), whichever
    /// it takes, in that order; it throws MissingEventId or InvalidEventId for
    /// a record without a usable id. `handle` is a per-record Handler or a
    /// BatchHandler (chosen by what it can be called with). Throws ConfigError
    /// for invalid configuration. Nothing connects until run().
    template <class Decode, class IdOf, class Handle>
    IdempotentConsumer(ConsumerConfig config, Decode&& decode, IdOf&& event_id_of, Handle&& handle)
        : stage_(std::forward<Decode>(decode), std::forward<IdOf>(event_id_of), std::forward<Handle>(handle)),
          engine_(std::move(config), stage_)
    {
    }

    IdempotentConsumer(const IdempotentConsumer&) = delete;
    IdempotentConsumer& operator=(const IdempotentConsumer&) = delete;

    /// Connects to PostgreSQL and Kafka, creates the claims table when
    /// `create_schema` is set, subscribes, and processes records until stop().
    /// Returns after the last batch committed and the consumer left the group.
    /// Throws DatabaseError/KafkaError when start-up fails, and whatever a
    /// Hooks callback throws.
    void run() { engine_.run(); }

    /// Asks run() to finish the current batch, commit, leave the group and
    /// return. A second call, or the first one once it is older than
    /// shutdown_timeout, abandons the current batch (rolled back, offsets not
    /// committed): its workers' PostgreSQL connections are cut, so a handler
    /// call blocked on PostgreSQL returns. run() still waits for every handler
    /// call (and reconcile hook call) running to return, as no call can be
    /// interrupted: a call that never returns (blocked outside PostgreSQL
    /// with no timeout of its own) keeps run() from returning, and its
    /// partitions with this member. Meanwhile the member stays in the group,
    /// MetricsSnapshot::oldest_call_seconds grows, and past
    /// max.poll.interval.ms an error line names the call's record, again
    /// every max.poll.interval.ms (MetricsSnapshot::stuck_calls). Give the
    /// handler's own blocking calls timeouts. Async-signal-safe: only sets an
    /// atomic flag.
    void stop() noexcept { engine_.stop(); }

    /// Live counters; safe to read from any thread.
    const Metrics& metrics() const noexcept { return engine_.metrics(); }

private:
    detail::TypedStage<Event> stage_;
    detail::Engine engine_;
};

} // namespace idemkafka
