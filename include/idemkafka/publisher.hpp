#pragma once
/// \file
/// Publisher: an idempotent Kafka producer (enable.idempotence=true, acks=all)
/// for events that carry an EventId in their payload.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/context.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"

namespace idemkafka {

/// Configuration of a Publisher.
struct IDEMKAFKA_API PublisherConfig {
    /// Kafka bootstrap servers. Required.
    std::string brokers;
    /// Extra librdkafka producer properties (linger.ms, compression.type,
    /// security settings, ...). Turning off enable.idempotence or setting acks
    /// to anything but all/-1 is a ConfigError.
    std::map<std::string, std::string> kafka;
    /// Where log lines go. Default: stderr, level info and above.
    LogSink log;

    /// Throws ConfigError naming the first invalid field.
    void validate() const;
};

/// One record for Publisher::publish_all(). Null key and null value are kept null.
struct OutgoingRecord {
    std::string topic;                ///< the topic to produce to
    std::optional<std::string> key;   ///< nullopt for a null key
    std::optional<std::string> value; ///< nullopt for a null value
    std::vector<Header> headers;      ///< headers, in order
};

namespace detail {
struct DeliveryState;
} // namespace detail

/// The outcome of one record sent by Publisher::send_all(): it may be known
/// only after the call returned (a record the broker has not answered for
/// yet is in flight, and may still be written). Copies share one outcome.
/// Thread-safe.
class IDEMKAFKA_API DeliveryStatus {
public:
    /// Where the record is: not answered yet, written, or refused for good.
    enum class State { in_flight, acknowledged, failed };

    DeliveryStatus() = default;
    /// The record's outcome so far.
    State state() const noexcept;
    /// Why it failed, or why it is still in flight; empty when acknowledged.
    std::string error() const;

private:
    friend class Publisher;
    explicit DeliveryStatus(std::shared_ptr<detail::DeliveryState> s) : s_(std::move(s)) {}
    std::shared_ptr<detail::DeliveryState> s_;
};

/// Counters of a Publisher.
struct PublisherStats {
    std::uint64_t delivered = 0; ///< records the broker acknowledged
    std::uint64_t failed = 0;    ///< records whose delivery failed
};

/// Idempotent producer. Thread-safe. The message key should be the entity id,
/// so one entity's events stay in one partition and in order.
class IDEMKAFKA_API Publisher {
public:
    /// Throws ConfigError for invalid configuration, KafkaError if the client
    /// cannot be created.
    explicit Publisher(const PublisherConfig& config);
    /// Waits up to 10 s for outstanding deliveries (failures are logged).
    ~Publisher();
    Publisher(const Publisher&) = delete;
    Publisher& operator=(const Publisher&) = delete;

    /// Enqueues a record without waiting. Throws KafkaError if it cannot even
    /// be enqueued (queue full beyond `queue_wait`, unknown topic, too large);
    /// delivery failures surface in flush().
    void publish_async(std::string_view topic, std::optional<std::string_view> key, std::string_view payload,
                       const std::vector<Header>& headers = {});

    /// Publishes and waits for the broker's acknowledgement (or `timeout`,
    /// which it never waits past). Throws KafkaError naming the reason if the
    /// record was not acknowledged; after a timeout the record may still be
    /// delivered (it is not withdrawn).
    void publish(std::string_view topic, std::optional<std::string_view> key, std::string_view payload,
                 const std::vector<Header>& headers = {},
                 std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

    /// Publishes every record and waits for each one's acknowledgement (up to
    /// `timeout` in all). Returns one entry per record, in order: empty when the
    /// broker acknowledged it, otherwise the reason it was not. Never throws for
    /// a delivery failure; throws KafkaError only if the client itself fails.
    /// Calls from several threads run one after the other. At `timeout` the
    /// records not sent yet are withdrawn, with every other record this
    /// publisher has not sent yet (publish() and publish_async() ones
    /// included): give publish_all() a Publisher of its own where that
    /// matters. A record already sent is left in flight (its entry says so):
    /// it may still be written. send_all() tells its outcome later.
    std::vector<std::string> publish_all(const std::vector<OutgoingRecord>& records,
                                         std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

    /// Publishes every record and waits up to `timeout` in all for the
    /// broker's answers; returns each record's DeliveryStatus, in order. Never
    /// blocks past `timeout`, never throws for a delivery failure. At the
    /// timeout the records the client has not sent yet are withdrawn (failed:
    /// they are never written; note that this withdraws every record of this
    /// publisher not sent yet, as publish_all() does); records already sent
    /// stay in flight, and their DeliveryStatus changes when the broker answers
    /// (then sending such a record again may write it twice: wait() for it
    /// instead). Calls from several threads run one after the other.
    std::vector<DeliveryStatus> send_all(const std::vector<OutgoingRecord>& records,
                                         std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

    /// Waits up to `timeout` until none of `deliveries` is in flight; true
    /// when none is.
    bool wait(const std::vector<DeliveryStatus>& deliveries, std::chrono::milliseconds timeout);

    /// Waits until every enqueued record is acknowledged or failed. Throws
    /// KafkaError if records are still outstanding after `timeout`, or if any
    /// delivery failed since the previous flush (the message counts them and
    /// gives the first reason).
    void flush(std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

    /// The delivery counters so far.
    PublisherStats stats() const noexcept;

private:
    struct IDEMKAFKA_LOCAL Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace idemkafka
