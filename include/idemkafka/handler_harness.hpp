#pragma once
/// \file
/// HandlerHarness<Event>: runs a handler through the library's own
/// claim-and-handle path (decode, screening, claim, handler call, COMMIT,
/// retries and dead letters) against a real PostgreSQL transaction, without
/// Kafka. One record at a time: every failure counts toward max_attempts
/// (ConsumerConfig::circuit_breaker does not apply). Part of the test kit (target `idemkafka::testing`, see
/// idemkafka/testing.hpp):
///
///     find_package(idemkafka CONFIG REQUIRED COMPONENTS testing)
///     target_link_libraries(my_tests PRIVATE idemkafka::testing)
///
/// No test framework in here: the outcomes are plain values to compare.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idemkafka/config.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/dead_letter.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/testing.hpp"

namespace idemkafka {

/// A record to deliver through a HandlerHarness, as a producer would send it.
/// The harness gives it the next offset of its partition.
struct TestMessage {
    std::optional<std::string> value; ///< the payload; nullopt for a null value
    std::optional<std::string> key;   ///< nullopt for a null key
    std::vector<Header> headers;      ///< the record's headers, in order
    /// Empty: the first of ConsumerConfig::topics (`harness` when none is set).
    std::string topic;
    std::int32_t partition = 0; ///< the partition to deliver on
    /// Unix milliseconds; -1: the time of the delivery.
    std::int64_t timestamp_ms = -1;
};

/// How a delivery ended.
enum class DeliveryOutcome {
    processed,     ///< claimed, handler ran, transaction committed
    duplicate,     ///< the event id was claimed before: the handler did not run
    dead_lettered, ///< a dead letter was written (Delivery::reason says why)
    failed,        ///< the handler threw and the record comes again (Delivery::attempt)
};

/// "processed", "duplicate", "dead_lettered" or "failed".
IDEMKAFKA_API std::string_view to_string(DeliveryOutcome outcome) noexcept;

/// The outcome of one delivery of one record.
struct Delivery {
    DeliveryOutcome outcome = DeliveryOutcome::processed; ///< how it ended
    std::string topic;                                    ///< the record's topic in the harness
    std::int32_t partition = 0;                           ///< its partition
    std::int64_t offset = 0; ///< its offset: a new one per record, the same one on a redelivery
    /// The event id the decoder returned; nil when it returned none (decode
    /// error, missing or invalid id, empty payload).
    EventId event_id;
    /// processed, duplicate, failed: the attempt this delivery was
    /// (Context::attempt(): 1, then 2 after one failure, ...). dead_lettered:
    /// the handler attempts that failed before (the dead letter's
    /// `idemkafka.attempts` header; 0 for a record the handler never saw).
    int attempt = 0;
    /// dead_lettered: why.
    std::optional<DeadLetterReason> reason;
    /// dead_lettered and failed: the error text (the exception's what()).
    std::string error;
    /// dead_lettered: the record as produced to the dead-letter topic (its
    /// offset is its index in HandlerHarness::dead_letters()).
    std::optional<TestRecord> dead_letter;
};

/// The two deliveries of deliver_twice() and deliver_with_crash_after_commit().
struct DeliveryPair {
    Delivery first;  ///< the first delivery
    Delivery second; ///< the second: the re-sent record, or the redelivery after the crash
};

namespace detail {

// The non-template half of HandlerHarness, compiled into the library (it
// drives the library's internal claim transaction). Not part of the API;
// exported because the template calls it.
class IDEMKAFKA_API HarnessCore {
public:
    /// Throws ConfigError for an invalid `config`, DatabaseError when
    /// PostgreSQL cannot be reached or the schema cannot be created. Keeps a
    /// reference to `stage`.
    HarnessCore(ConsumerConfig config, Stage& stage);
    ~HarnessCore();
    HarnessCore(const HarnessCore&) = delete;
    HarnessCore& operator=(const HarnessCore&) = delete;

    /// HandlerHarness::deliver().
    Delivery deliver(const TestMessage& message);
    /// HandlerHarness::redeliver().
    Delivery redeliver();
    /// HandlerHarness::deliver_twice().
    DeliveryPair deliver_twice(const TestMessage& message);
    /// HandlerHarness::deliver_with_crash_after_commit().
    DeliveryPair deliver_with_crash_after_commit(const TestMessage& message);
    /// HandlerHarness::deliver_until_dead_letter().
    std::vector<Delivery> deliver_until_dead_letter(const TestMessage& message);
    /// HandlerHarness::dead_letters().
    const std::vector<TestRecord>& dead_letters() const noexcept;
    /// HandlerHarness::metrics().
    const Metrics& metrics() const noexcept;
    /// HandlerHarness::config().
    const ConsumerConfig& config() const noexcept;

private:
    struct IDEMKAFKA_LOCAL Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace detail

/// Runs a handler the way IdempotentConsumer<Event> does, one record at a
/// time, without Kafka: each delivery goes through the library's own code
/// (the consumer's decode and screening, the claim transaction with its
/// claim statement, handler call and COMMIT, the failure count of the
/// record's partition, the dead-letter record) against the PostgreSQL that
/// ConsumerConfig::postgres names. Its effects are real: the claims in the
/// claims table, the handler's writes committed (or rolled back).
///
/// Where Kafka would be, the harness stands in: records get the next offset
/// of their partition; dead letters are kept (dead_letters()) instead of
/// produced, and count as acknowledged; retries come at once (no
/// retry_backoff wait); nothing is committed to Kafka. Records are delivered
/// one per transaction (like `max_batch = 1`); a batch handler is called with
/// a Batch of one event. Not for concurrent use: one thread at a time.
///
/// ConsumerConfig is used as by the consumer: group_id (the claims' group),
/// postgres, schema, table, create_schema, retention (the dedup-horizon
/// guard and the reconcile hook), max_attempts, is_retryable,
/// transaction_retries, lock_timeout, max_payload_bytes,
/// dead_letter_topic, log. brokers and topics may be left empty; the
/// maintenance thread, the outbox relay, hooks and offsets_in_database
/// are not used (there are no Kafka positions to keep).
template <class Event> class HandlerHarness {
public:
    /// As IdempotentConsumer<Event>::Decoder.
    using Decoder = typename IdempotentConsumer<Event>::Decoder;
    /// As IdempotentConsumer<Event>::EventIdOf.
    using EventIdOf = typename IdempotentConsumer<Event>::EventIdOf;
    /// As IdempotentConsumer<Event>::RecordEventIdOf.
    using RecordEventIdOf = typename IdempotentConsumer<Event>::RecordEventIdOf;

    /// Takes the decoder, id function and handler exactly as
    /// IdempotentConsumer<Event> does (a per-record or a batch handler).
    /// Connects to `config.postgres` and creates the library's tables when
    /// `create_schema` is set (else checks them). Throws ConfigError for an
    /// invalid configuration, DatabaseError when PostgreSQL cannot be reached
    /// or the tables cannot be created.
    template <class Decode, class IdOf, class Handle>
    HandlerHarness(ConsumerConfig config, Decode&& decode, IdOf&& event_id_of, Handle&& handle)
        : stage_(std::forward<Decode>(decode), std::forward<IdOf>(event_id_of), std::forward<Handle>(handle)),
          core_(std::move(config), stage_)
    {
    }

    HandlerHarness(const HandlerHarness&) = delete;
    HandlerHarness& operator=(const HandlerHarness&) = delete;
    /// Closes its PostgreSQL connection; the rows it committed stay.
    ~HandlerHarness() = default;

    /// Delivers `message` once, as a new record (the next offset of its
    /// partition): decode, screening, claim, handler, COMMIT; returns the
    /// outcome. A handler failure is `failed` (the record is held for another
    /// try: see redeliver()), or `dead_lettered` (non_retryable, or
    /// handler_failed at max_attempts). Throws DatabaseError when PostgreSQL
    /// fails outside the handler (the record is not blamed; the next delivery
    /// reconnects), and rethrows what the library would let escape from a
    /// consumer's run() (a bug).
    Delivery deliver(const TestMessage& message) { return core_.deliver(message); }
    /// deliver() of a record with `payload` as its value, no key, no headers.
    Delivery deliver(std::string_view payload) { return core_.deliver(message_of(payload)); }

    /// Delivers the last delivered record again at the same offset, as Kafka
    /// does after the partition was rewound to it (a failed record's retry):
    /// the record's failure count goes on. Throws std::logic_error before the
    /// first delivery; throws as deliver().
    Delivery redeliver() { return core_.redeliver(); }

    /// Delivers `message` twice as two records (a producer that sent it
    /// again: new offset, same event id). With a working handler: `processed`
    /// then `duplicate`, and one effect. Throws as deliver().
    DeliveryPair deliver_twice(const TestMessage& message) { return core_.deliver_twice(message); }
    /// deliver_twice() of a record with `payload` as its value.
    DeliveryPair deliver_twice(std::string_view payload) { return core_.deliver_twice(message_of(payload)); }

    /// Delivers `message`, lets its transaction commit, then crashes before
    /// the offset commit: the partition's state is forgotten (as by a new
    /// process: failure counts and dead letters of earlier deliveries), the
    /// database connection is opened again, and the same record is delivered
    /// again at the same offset. With a working handler: `processed` then
    /// `duplicate`, and one effect. Throws as deliver().
    DeliveryPair deliver_with_crash_after_commit(const TestMessage& message)
    {
        return core_.deliver_with_crash_after_commit(message);
    }
    /// deliver_with_crash_after_commit() of a record with `payload` as its value.
    DeliveryPair deliver_with_crash_after_commit(std::string_view payload)
    {
        return core_.deliver_with_crash_after_commit(message_of(payload));
    }

    /// Delivers `message`, then redelivers it while the outcome is `failed`,
    /// at most ConsumerConfig::max_attempts deliveries in all: with a handler
    /// that keeps throwing, the last one is `dead_lettered` with
    /// handler_failed. Returns every delivery in order (the last one is the
    /// record's fate). Throws as deliver().
    std::vector<Delivery> deliver_until_dead_letter(const TestMessage& message)
    {
        return core_.deliver_until_dead_letter(message);
    }
    /// deliver_until_dead_letter() of a record with `payload` as its value.
    std::vector<Delivery> deliver_until_dead_letter(std::string_view payload)
    {
        return core_.deliver_until_dead_letter(message_of(payload));
    }

    /// Every dead letter written so far, in order, as it would be on the
    /// dead-letter topic (reason, error, original coordinates, event id and
    /// attempts in its `idemkafka.*` headers: see dead_letter_header).
    const std::vector<TestRecord>& dead_letters() const noexcept { return core_.dead_letters(); }

    /// The consumer's counters over every delivery so far (consumed, claimed,
    /// duplicates, handler_failures, retries, dead_lettered, ...).
    const Metrics& metrics() const noexcept { return core_.metrics(); }

    /// The configuration in use (with the stand-ins for brokers and topics).
    const ConsumerConfig& config() const noexcept { return core_.config(); }

private:
    static TestMessage message_of(std::string_view payload)
    {
        TestMessage m;
        m.value.emplace(payload);
        return m;
    }

    detail::TypedStage<Event> stage_;
    detail::HarnessCore core_;
};

} // namespace idemkafka
