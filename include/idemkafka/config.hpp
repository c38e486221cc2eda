#pragma once
/// \file
/// ConsumerConfig: everything an IdempotentConsumer needs, as a plain struct.

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "idemkafka/log.hpp"

namespace idemkafka {

/// What the after-DB-commit hook is told about the batch it follows.
struct BatchInfo {
    std::size_t records = 0;     ///< records in the batch (including duplicates and poison)
    std::size_t claimed = 0;     ///< records whose handler ran and committed
    std::size_t duplicates = 0;  ///< records skipped because their event id was already claimed
};

/// Optional callbacks into the processing loop.
struct Hooks {
    /// Called after a PostgreSQL transaction committed and before its Kafka offsets
    /// are committed. An exception thrown here propagates out of run() and the
    /// offsets are not committed: exactly the state of a crash at that point.
    std::function<void(const BatchInfo&)> after_db_commit;
};

/// Configuration of an IdempotentConsumer. Plain data; IdempotentConsumer's
/// constructor calls validate(), which throws ConfigError naming the bad field.
struct ConsumerConfig {
    /// Kafka bootstrap servers, `host:port[,host:port...]`. Required.
    std::string brokers;
    /// Kafka consumer group id; also the `consumer_group` column of the dedup table,
    /// so two groups each process an event once. Required.
    std::string group_id;
    /// Topics to subscribe to. Required, at least one.
    std::vector<std::string> topics;
    /// libpq connection string or URI of the PostgreSQL database. Required.
    std::string postgres;

    /// Schema and table of the dedup claims; always quoted as identifiers.
    std::string schema = "public";
    std::string table = "processed_event";
    /// Create the schema and table on start-up if they do not exist.
    bool create_schema = true;

    /// Records per PostgreSQL transaction (1 = one transaction per record).
    std::size_t max_batch = 500;
    /// Longest time to wait for a batch to fill before processing what is there.
    std::chrono::milliseconds max_batch_wait{50};
    /// Delay before a record whose handler threw is delivered again; doubles per
    /// attempt up to retry_backoff_max.
    std::chrono::milliseconds retry_backoff{100};
    std::chrono::milliseconds retry_backoff_max{10000};
    /// How long stop() may take to finish the current batch and leave the group.
    std::chrono::milliseconds shutdown_timeout{30000};

    /// Extra librdkafka consumer properties, passed through as they are
    /// (security.protocol, sasl.*, ssl.*, session.timeout.ms, ...). The library
    /// sets enable.auto.commit=false, enable.auto.offset.store=false and, unless
    /// given here, isolation.level=read_committed and auto.offset.reset=earliest.
    /// Setting enable.auto.commit or enable.auto.offset.store to true is a ConfigError.
    std::map<std::string, std::string> kafka;

    /// Where log lines go. Default: stderr, level info and above.
    LogSink log;
    /// Optional callbacks into the processing loop.
    Hooks hooks;

    /// Throws ConfigError naming the first invalid field.
    void validate() const;
};

} // namespace idemkafka
