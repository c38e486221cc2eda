#pragma once
/// \file
/// Transactional outbox: Outbox writes an outgoing event into a PostgreSQL table
/// inside the caller's transaction (a consumer handler's, or any service code's),
/// so the event exists if and only if that transaction commits. OutboxRelay
/// publishes the rows with the idempotent Publisher, in order per key, and marks
/// them sent only after the broker acknowledged them. See docs/outbox.md. The
/// settings (OutboxConfig, OutboxRelayOptions) are in config.hpp.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/connection>
#include <pqxx/transaction>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/publisher.hpp"

namespace idemkafka {

/// Header the relay puts on every published record: the row's event id in
/// canonical text form. A user header of the same name is replaced.
inline constexpr const char* outbox_event_id_header = "idemkafka.event_id";

/// The outbox table:
///
///     id bigserial PRIMARY KEY, event_id uuid, topic text, key bytea (NULL: no key),
///     payload bytea, headers bytea (NULL: none), created_at timestamptz,
///     sent_at timestamptz (NULL until the broker acknowledged the record),
///     UNIQUE (event_id, topic)
///
/// plus a partial index over the unsent rows (what the relay reads) and one
/// over sent_at (what the purge reads). Rows are published in `id` order.
/// Cheap to copy; thread-safe (immutable).
class IDEMKAFKA_API Outbox {
public:
    /// Names are quoted, never spliced into SQL as they are. Throws ConfigError
    /// for a name quote_identifier() refuses.
    explicit Outbox(std::string schema = "public", std::string table = "outbox");

    /// `"schema"."table"`, quoted. Never throws.
    const std::string& qualified_name() const noexcept { return qualified_; }
    /// The schema name as configured (unquoted). Never throws.
    const std::string& schema() const noexcept { return schema_; }
    /// The table name as configured (unquoted). Never throws.
    const std::string& table() const noexcept { return table_; }

    /// Creates the schema, table and indexes if they do not exist, from the one
    /// schema definition (idemkafka/schema.hpp); an existing table is left as
    /// it is (migrate_schema() upgrades one of an earlier schema version). Safe
    /// to run from several processes at once (serialised with a
    /// transaction-level advisory lock). Throws DatabaseError on failure.
    void ensure_schema(pqxx::work& tx) const;
    /// Same, in a connection and transaction of its own. Throws DatabaseError.
    void ensure_schema(const std::string& conninfo) const;

    /// A new UUIDv7 for an outgoing event. Take the id first, put it in the
    /// payload, then pass it to enqueue(): the id a downstream consumer
    /// deduplicates on is then the one in the payload. Never throws.
    static EventId new_event_id() noexcept { return idemkafka::new_event_id(); }

    /// Writes one outgoing event into the outbox in `tx`; it is published only
    /// if `tx` commits, and nothing is left if `tx` rolls back. Use the handler's
    /// `pqxx::work&` inside a consumer handler, so the event commits atomically
    /// with the claim and the business effect. `key` should be the entity id:
    /// rows with the same topic and key are published in the order of their
    /// insertion. `event_id` defaults to a new UUIDv7; the payload is stored and
    /// published byte for byte (embed the id in it yourself). Returns the event
    /// id. Throws ConfigError for an empty topic or one Kafka would refuse,
    /// InvalidEventId for a nil `event_id`, and the pqxx exception of a failed
    /// INSERT (pqxx::unique_violation when `event_id` is already in the outbox
    /// for `topic`), which leaves `tx` aborted.
    EventId enqueue(pqxx::transaction_base& tx, std::string_view topic, std::optional<std::string_view> key,
                    std::string_view payload, const std::vector<Header>& headers = {},
                    std::optional<EventId> event_id = {}) const;

    /// Number of rows not yet marked sent, as seen by `tx`. Throws the pqxx
    /// exception of the failed query.
    std::int64_t pending(pqxx::transaction_base& tx) const;

    /// Deletes rows whose sent_at is older than `older_than` (by the database
    /// clock), `limits.batch` rows per short transaction, at most
    /// `limits.max_batches` transactions. Unsent rows are never deleted.
    /// Returns the number of rows deleted. Throws DatabaseError on failure
    /// (batches committed before it stay deleted).
    std::uint64_t purge_sent(pqxx::connection& conn, std::chrono::milliseconds older_than,
                             const OutboxPurgeLimits& limits = {}) const;

private:
    std::string schema_;
    std::string table_;
    std::string schema_q_;
    std::string qualified_;
    std::string insert_sql_;
};

/// Counters of an OutboxRelay.
struct OutboxRelayStats {
    std::uint64_t published = 0; ///< rows acknowledged by the broker and marked sent
    std::uint64_t failed = 0;    ///< records the broker did not acknowledge (rows stay unsent, retried)
    std::uint64_t errors = 0;    ///< cycles that failed as a whole (PostgreSQL, client, hook): retried
    std::uint64_t cycles = 0;    ///< cycles run as the active relay
    std::uint64_t standby = 0;   ///< cycles skipped because another relay was active
    std::uint64_t purged = 0;    ///< sent rows purged by this relay's thread
    std::uint64_t held_keys = 0; ///< keys currently held back after a failed record (gauge)
};

/// Publishes outbox rows. Each cycle is one PostgreSQL transaction: take a
/// transaction-level advisory lock on the outbox (only one relay is active at a
/// time; others stand by and take over at their next cycle), read the oldest
/// unsent rows in id order, publish them with the idempotent Publisher and wait
/// for the acknowledgements, mark the acknowledged rows sent, commit. A row is
/// marked sent only after its acknowledgement, and only if no earlier row of the
/// same topic and key in the batch failed, so a row is never lost and a key's
/// rows reach the broker in order (except that rows acknowledged after a failed
/// row of their key in the same batch went out before it, and go out again
/// after it; see docs/outbox.md). A crash between acknowledgement and commit
/// publishes the rows again with the same event ids (at least once): downstream
/// dedup absorbs the repeat. A record that fails holds back its key (the rest of
/// the outbox goes on) and is retried with backoff.
///
/// Use it from a thread of its own (start()/stop()) or drive it with
/// run_once(). The log sink and hooks are called from the relay's thread.
class IDEMKAFKA_API OutboxRelay {
public:
    /// Owns a Publisher made from `publisher` (an empty `log` there uses the
    /// relay's). Throws ConfigError for invalid options or publisher
    /// configuration, KafkaError if the producer cannot be created. Nothing
    /// connects to PostgreSQL until the first cycle.
    OutboxRelay(std::string conninfo, Outbox outbox, PublisherConfig publisher, OutboxRelayOptions options = {});
    /// Uses `publisher`, which must outlive the relay. Throws ConfigError for
    /// invalid options.
    OutboxRelay(std::string conninfo, Outbox outbox, Publisher& publisher, OutboxRelayOptions options = {});
    /// stop().
    ~OutboxRelay();
    OutboxRelay(const OutboxRelay&) = delete;
    OutboxRelay& operator=(const OutboxRelay&) = delete;

    /// The relay a consumer runs for `config`: a Publisher on `brokers` with the
    /// security settings of `consumer_kafka` (see OutboxConfig::kafka), logging
    /// to `log` unless relay_options.log is set. Not started. Throws ConfigError
    /// and KafkaError as the constructor does.
    static std::unique_ptr<OutboxRelay> for_consumer(const OutboxConfig& config, const std::string& conninfo,
                                                     const std::string& brokers,
                                                     const std::map<std::string, std::string>& consumer_kafka,
                                                     const LogSink& log);

    /// Starts the relay thread (no-op when it runs). Failures inside are logged,
    /// counted and retried with backoff, never thrown. Thread-safe. Throws
    /// std::system_error if the thread cannot be started.
    void start();
    /// Stops and joins the thread: the current cycle finishes (at most
    /// publish_timeout). Idempotent and thread-safe; start() may be called
    /// again. Must not be called from the log sink or a hook. Never throws.
    void stop() noexcept;
    /// Makes the thread run its next cycle now instead of after poll_interval
    /// (e.g. right after a transaction that enqueued). Never throws.
    void wake() noexcept;

    /// Runs one cycle on the calling thread (serialised with the relay thread)
    /// and returns the number of rows published and marked sent: 0 also when
    /// another relay is active. Records the broker did not acknowledge are
    /// counted in stats().failed and retried by later cycles, not thrown.
    /// Throws DatabaseError when PostgreSQL fails, KafkaError when the producer
    /// fails, and whatever the after_publish hook throws; nothing is marked then.
    std::size_t run_once();

    /// A copy of the counters. Thread-safe; never throws.
    OutboxRelayStats stats() const noexcept;
    /// The outbox this relay publishes. Never throws.
    const Outbox& outbox() const noexcept;

private:
    struct IDEMKAFKA_LOCAL Impl; // the thread, the connection and the counters (src/outbox.cpp)
    std::unique_ptr<Impl> impl_;
};

} // namespace idemkafka
