#pragma once
/// \file
/// The configuration structs, plain data: ConsumerConfig and the settings it
/// embeds (RetentionConfig, OutboxConfig with OutboxRelayOptions). The
/// machinery they configure lives elsewhere (retention.hpp, outbox.hpp), so
/// this header, and consumer.hpp with it, stays free of threads, relays and
/// producers.

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/transaction>

#include "idemkafka/context.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"

namespace idemkafka {

class Outbox; // outbox.hpp

/// How records may be processed in parallel, and what waits when a handler fails.
enum class Ordering {
    /// Each partition belongs to one worker: records are processed in
    /// partition order, and a failed record holds back its whole partition
    /// for the retry backoff.
    partition,
    /// Records of one partition with different keys may run on different workers;
    /// records with the same key stay in order. A failed record holds back only
    /// its key: it and the key's later records are parked in memory for the
    /// retry backoff while the partition's other keys go on. Committed offsets
    /// never pass an unfinished (or parked) record. Lets a hot partition use
    /// more than one connection.
    key,
};

/// What the after-DB-commit hook is told about the transaction it follows (one
/// worker's unit of work).
struct BatchInfo {
    std::size_t records = 0;    ///< records in the transaction (including duplicates and poison)
    std::size_t claimed = 0;    ///< records whose handler ran and committed
    std::size_t duplicates = 0; ///< records skipped because their event id was already claimed
};

/// Optional callbacks into the processing loop.
struct Hooks {
    /// Called after a PostgreSQL transaction committed and before its Kafka offsets
    /// are committed, once per transaction, on the thread that called run() (other
    /// workers' transactions may run meanwhile). An exception thrown here propagates
    /// out of run() and the offsets are not committed: exactly the state of a crash
    /// at that point.
    std::function<void(const BatchInfo&)> after_db_commit;
};

/// How old claims are removed.
enum class RetentionMode {
    partitioned, ///< range partitions by event id (UUIDv7 time), expired ones dropped whole
    purge,       ///< plain table, batched DELETE of rows whose processed_at is older than retention
};

/// What happens to an event whose UUIDv7 timestamp is older than the dedup horizon.
enum class HorizonPolicy {
    dead_letter, ///< dead letter with reason `beyond_dedup_horizon` (default)
    reconcile,   ///< RetentionConfig::reconcile decides
    process,     ///< hand it to the handler anyway (explicit opt-in: it may apply twice)
};

/// What happens to an event id that is not a UUIDv7 in partitioned mode.
enum class NonV7Policy {
    dead_letter, ///< dead letter with reason `non_v7_event_id` (default)
    process,     ///< claim and process it; its dedup lasts an unknown time (see docs/retention.md)
};

/// What a reconcile hook decided for an event beyond the dedup horizon.
enum class ReconcileOutcome {
    process,     ///< the effect is not there: claim the event and run the handler
    skip,        ///< the effect is already there: claim it, count a duplicate, no handler
    dead_letter, ///< cannot tell: no claim, dead letter with reason `beyond_dedup_horizon`
};

/// "partitioned", "purge".
IDEMKAFKA_API std::string_view to_string(RetentionMode mode) noexcept;
/// "dead_letter", "reconcile", "process".
IDEMKAFKA_API std::string_view to_string(HorizonPolicy policy) noexcept;
/// "dead_letter", "process".
IDEMKAFKA_API std::string_view to_string(NonV7Policy policy) noexcept;
/// Inverse of to_string(RetentionMode). Throws ConfigError for any other text.
IDEMKAFKA_API RetentionMode parse_retention_mode(std::string_view text);
/// Inverse of to_string(HorizonPolicy). Throws ConfigError for any other text.
IDEMKAFKA_API HorizonPolicy parse_horizon_policy(std::string_view text);
/// Inverse of to_string(NonV7Policy). Throws ConfigError for any other text.
IDEMKAFKA_API NonV7Policy parse_non_v7_policy(std::string_view text);

/// Retention of the claims table and the dedup-horizon guard. Plain data;
/// validate() throws ConfigError naming the bad field.
struct IDEMKAFKA_API RetentionConfig {
    /// Durations of this struct, in milliseconds.
    using Duration = std::chrono::milliseconds;

    /// Layout of a table created (or converted) by migrate(). Maintenance acts on
    /// the layout the table actually has.
    RetentionMode mode = RetentionMode::partitioned;
    /// How long a claim is kept. Partitioned: a partition is dropped once every
    /// id it can hold is older than this. Purge: rows whose processed_at is older
    /// are deleted.
    Duration retention = std::chrono::hours(24 * 7);
    /// Width of one range partition. A whole number of minutes.
    Duration partition_width = std::chrono::hours(24);
    /// Partitions kept ready beyond the current one.
    std::size_t partitions_ahead = 3;
    /// Rows deleted per purge statement (one short transaction each).
    std::size_t purge_batch = 5000;
    /// Pause between purge batches, so the purge never competes with claims for long.
    Duration purge_pause = std::chrono::milliseconds(50);
    /// Most purge batches in one maintenance run; the rest waits for the next run.
    std::size_t purge_max_batches = 2000;
    /// Creating a partition whose range already has rows in the default partition
    /// moves them, holding the default partition locked. Above this many rows the
    /// partition is not created (the rows age out of the default partition instead).
    std::size_t max_move_rows = 100000;
    /// lock_timeout of every maintenance statement, so maintenance waiting for a
    /// lock never holds up the claims queued behind it for longer.
    Duration lock_timeout = std::chrono::seconds(5);

    /// The dedup horizon is retention - horizon_margin: an event whose UUIDv7
    /// timestamp is at least that old goes to `beyond_horizon`. The margin covers
    /// clock skew between producers and this consumer, and time in queues.
    Duration horizon_margin = std::chrono::hours(24);
    /// Policy for events beyond the dedup horizon.
    HorizonPolicy beyond_horizon = HorizonPolicy::dead_letter;
    /// Called for an event beyond the horizon when beyond_horizon == reconcile,
    /// before the batch's transaction, in a transaction of its own: it looks
    /// for the effect (the charge of that order, say) and returns what to do.
    /// For `skip` that transaction also claims the event, so the claim commits
    /// with whatever the hook wrote. Required for that policy. An exception
    /// from it (or a transaction it leaves aborted) counts as a failure of the
    /// record: retried with the backoff, and after max_attempts the record is
    /// dead-lettered (reason beyond_dedup_horizon, error "reconcile hook failed ...").
    std::function<ReconcileOutcome(pqxx::work& tx, const Context& ctx)> reconcile;
    /// How long the downstream service remembers an Idempotency-Key (payment
    /// providers often keep keys for 24 hours); zero when not configured.
    /// HorizonDecision::key_window_open tells the handler whether a repeated call
    /// is still recognised downstream.
    Duration downstream_key_window{0};
    /// Policy for ids that are not UUIDv7 in partitioned mode.
    NonV7Policy non_v7 = NonV7Policy::dead_letter;

    /// Run maintenance on a schedule inside the consumer (MaintenanceRunner);
    /// several instances may, only one acts at a time.
    bool maintenance = true;
    /// Time between two maintenance runs.
    Duration maintenance_interval = std::chrono::minutes(5);

    /// retention - horizon_margin.
    Duration dedup_horizon() const noexcept { return retention - horizon_margin; }

    /// Throws ConfigError naming the first invalid field.
    void validate() const;
};

/// Bounds of one Outbox::purge_sent() call.
struct OutboxPurgeLimits {
    /// Rows deleted per statement (one short transaction each).
    std::size_t batch = 5000;
    /// Most statements per call; the rest waits for the next call.
    std::size_t max_batches = 2000;
    /// Pause between two statements, so a long purge never competes with the
    /// relay and the writers for long.
    std::chrono::milliseconds pause{50};
};

/// Callbacks into the relay, for tests and tools.
struct OutboxRelayHooks {
    /// Called after the broker acknowledged the records of a batch and before
    /// their rows are marked sent, with the number acknowledged. An exception
    /// thrown here rolls the marking back, exactly the state of a crash at that
    /// point: the rows are published again, with the same event ids.
    std::function<void(std::size_t acknowledged)> after_publish;
    /// Called after every cycle that committed as the active relay, with the
    /// rows it marked sent and the records that were not acknowledged: feeds a
    /// metrics registry. An exception thrown here is ignored.
    std::function<void(std::size_t published, std::size_t failed)> after_cycle;
};

/// Settings of an OutboxRelay. Plain data; validate() throws ConfigError
/// naming the bad field.
struct IDEMKAFKA_API OutboxRelayOptions {
    /// Rows read, published and marked per cycle (one transaction).
    std::size_t batch_size = 500;
    /// Wait between two cycles when the outbox had nothing more to publish, and
    /// between two attempts of a relay standing by for the active one.
    std::chrono::milliseconds poll_interval{100};
    /// How long a cycle waits for the broker's acknowledgements. Twice this and
    /// 5 s more bound the cycle's transaction on the server (idle in it, and
    /// each wait for a lock): past that, a relay stopped inside its cycle loses
    /// its session, and with it the relay lock, to the other relays.
    std::chrono::milliseconds publish_timeout{30000};
    /// Delay before retrying after a failed cycle or a failed record, doubling
    /// per consecutive failure up to retry_backoff_max.
    std::chrono::milliseconds retry_backoff{100};
    std::chrono::milliseconds retry_backoff_max{10000}; ///< cap of the doubling retry_backoff
    /// Keys held back at once after record failures; beyond this, failures
    /// back off the whole relay instead of single keys.
    std::size_t max_held_keys = 10000;
    /// The relay thread purges sent rows older than this every purge_interval;
    /// zero turns the purge off (call Outbox::purge_sent() yourself).
    std::chrono::milliseconds retention = std::chrono::hours(24 * 7);
    std::chrono::milliseconds purge_interval = std::chrono::minutes(5); ///< how often the relay thread purges sent rows
    /// Bounds of each purge.
    OutboxPurgeLimits purge_limits;
    /// Where log lines go. Default: stderr, level info and above.
    LogSink log;
    /// Test and tool callbacks.
    OutboxRelayHooks hooks;

    /// Throws ConfigError naming the first invalid field.
    void validate() const;
};

/// The outbox settings of a consumer (for ConsumerConfig). Plain data.
struct IDEMKAFKA_API OutboxConfig {
    /// Where the outbox lives; always quoted as identifiers.
    std::string schema = "public";
    std::string table = "outbox"; ///< the outbox table (unquoted name)
    /// Run an OutboxRelay thread alongside the consumer. Turn it off when a
    /// separate relay process publishes this outbox.
    bool relay = true;
    /// Settings of that relay. An empty `log` uses the consumer's sink.
    OutboxRelayOptions relay_options;
    /// Extra librdkafka properties of the relay's producer. Security settings
    /// (security.protocol, sasl.*, ssl.*) and client.id/client.rack are copied
    /// from the consumer's `kafka` unless set here.
    std::map<std::string, std::string> kafka;

    /// The Outbox these settings name (include idemkafka/outbox.hpp to use it).
    /// Throws ConfigError for a bad name.
    Outbox outbox() const;
    /// Throws ConfigError naming the first invalid field (`outbox.table`, ...).
    void validate() const;
};

/// The circuit breaker of a consumer (ConsumerConfig::circuit_breaker): it
/// tells an outage (a downstream service down, an effect table renamed, a
/// permission revoked: the handler fails whatever the record) from a poison
/// record (one record fails while the others go on). When records of several
/// keys fail and most handler attempts since they began failing failed too,
/// the circuit opens: the whole assignment is paused and rewound, nothing is
/// dead-lettered for the outage, and the failures do not count toward
/// max_attempts (neither do those that showed the outage). After `backoff`
/// one probe batch of at most `probe_records` records runs: a handler call
/// that succeeds closes the circuit and everything resumes; a probe that only
/// fails opens it again for twice as long (up to `backoff_max`). A probe in
/// which only keys that had failed before fail again proves nothing (poison
/// at the heads of several partitions): those records wait the last backoff
/// and the next batches probe past them, until a key that had not failed
/// fails, a probe brings nothing but keys that failed again since the circuit
/// last opened, or 10 x `probe_records` failures. When nothing but failing
/// records is left to run (several poison keys and no healthy record, or
/// poison holding every partition with Ordering::partition), the circuit
/// cannot tell them from an outage and stays open, probing, until one
/// succeeds. Plain data; ConsumerConfig::validate() checks it.
struct CircuitBreaker {
    /// Off: every retryable handler failure counts toward max_attempts, as
    /// if the record alone were at fault.
    bool enabled = true;
    /// Failures older than this are forgotten (a key whose failures have all
    /// left the window begins failing anew).
    std::chrono::milliseconds window{10000};
    /// The circuit opens only after at least this many handler attempts
    /// since the first key of the evidence began failing (a batch handler
    /// call counts once per record)...
    std::size_t min_attempts = 10;
    /// ... on keys that each failed while most attempts failed: since the
    /// key began failing, at least this share (above 0, at most 1) of all
    /// handler attempts failed. A key that keeps failing while the handler
    /// works for other records is its own problem, not evidence ...
    /// Also, at a record's last attempt: when, since the oldest failure in the
    /// window, at least min_keys records that had failed succeeded at a later
    /// attempt, as many as failure_ratio / 2 of all successes, calls fail at
    /// random well above normal (a flapping downstream): an outage, and the
    /// record is not dead-lettered.
    double failure_ratio = 0.5;
    /// ... and at least this many such keys (a record without a key is a key
    /// of its own; the same key in two partitions is two keys). With
    /// Ordering::partition a partition shows one failing record at a time:
    /// with fewer partitions than this, records are dead-lettered before the
    /// circuit can open ...
    std::size_t min_keys = 3;
    /// ... in at least this many partitions.
    std::size_t min_partitions = 1;
    /// Pause before the first probe; doubles after each failed probe, up to backoff_max.
    std::chrono::milliseconds backoff{1000};
    std::chrono::milliseconds backoff_max{30000}; ///< cap of the doubling backoff
    /// Records of a probe batch (at most max_batch): several, so that a probe
    /// that meets a poison record still tries other records.
    std::size_t probe_records = 10;
    /// When nothing but failing records is left to run (poison alone at the
    /// tail of a quiet topic, or at the head of every partition with
    /// Ordering::partition), no probe can succeed: poison looks like an
    /// outage. After the circuit has been open this long since it opened
    /// from closed, with no handler call succeeding, it gives up telling
    /// them apart: the probes' failures count toward max_attempts again
    /// (logged once, counted in circuit_gave_up), so such records are
    /// dead-lettered; the probes go on as before (a key that had not failed
    /// yet opens the circuit again for the backoff), and a success closes it.
    /// An outage longer than this dead-letters what its probes meet: about
    /// probe_records records per backoff_max. Zero: never give up (such
    /// records wait until a record succeeds). Keys whose records kept failing
    /// while the handler worked for others (they opened the circuit again at
    /// a last attempt, and a probe's success closed it once more) do not wait
    /// for this: from then on their failures count, and they are dead-lettered.
    std::chrono::milliseconds give_up_after{600000};
};

/// Configuration of an IdempotentConsumer. Plain data; IdempotentConsumer's
/// constructor calls validate(), which throws ConfigError naming the bad field.
struct IDEMKAFKA_API ConsumerConfig {
    /// Kafka bootstrap servers, `host:port[,host:port...]`. Required.
    std::string brokers;
    /// Kafka consumer group id; also the `consumer_group` column of the claims table,
    /// so two groups each process an event once. Required.
    std::string group_id;
    /// Topics to subscribe to. Required, at least one.
    std::vector<std::string> topics;
    /// libpq connection string or URI of the PostgreSQL database. Required.
    std::string postgres;

    /// Schema and table of the dedup claims; always quoted as identifiers.
    std::string schema = "public";
    std::string table = "processed_event"; ///< the claims table (unquoted name)
    /// Create the schema and tables on start-up if they do not exist.
    bool create_schema = true;

    /// Retention of the claims table (partitioned by event id by default, or a
    /// background purge), the dedup-horizon guard and the maintenance thread;
    /// see docs/retention.md.
    RetentionConfig retention;

    /// Transactional outbox (docs/outbox.md). When set, start-up creates its
    /// table (with create_schema) and, unless `outbox->relay` is false, run()
    /// publishes it with an OutboxRelay thread that stops with the consumer.
    std::optional<OutboxConfig> outbox;

    /// Keep each partition's position in PostgreSQL (`offsets_table`), written
    /// in the same transaction as the claims and effects; on assignment a
    /// partition starts at its stored position (at Kafka's committed offset
    /// when it has none), also when that is behind Kafka's: PostgreSQL lost
    /// commits, and the records in between are processed again (counted in
    /// positions_behind_kafka and records_behind_kafka, logged). After a
    /// reconnect each partition takes its stored position again: one left
    /// with none at all, though this member processed it, starts again from
    /// the lowest offset the member took of it (positions_lost, logged).
    /// Kafka offsets are still committed afterwards, for lag tools. A member
    /// that lost its partitions cannot write positions any more (epoch
    /// fencing).
    bool offsets_in_database = false;
    std::string offsets_table = "consumer_offset"; ///< the positions table with offsets_in_database (unquoted name)

    /// Store a 64-bit fingerprint (XXH3) of each record's value with its claim,
    /// and dead-letter a record whose event id was claimed before with a
    /// different value (reason `event_id_reused`) instead of skipping it as a
    /// duplicate: a producer that reused an id for another event. Only for
    /// producers that resend an event byte for byte (Kafka retries, outbox
    /// relays and dead-letter replays do; a producer that serialises the event
    /// again, with a new timestamp inside, does not). A claim stored without a
    /// fingerprint (before schema version 2, or by a consumer without this
    /// option) makes any redelivery a plain duplicate. Costs nothing but the
    /// column on records that are not duplicates; duplicates cost one indexed
    /// read in their transaction. Needs schema version 2.
    bool payload_fingerprint = false;

    /// Records per PostgreSQL transaction (1 = one transaction per record),
    /// and per unit of work: the records a worker takes at once and whose
    /// Kafka offsets are committed together.
    std::size_t max_batch = 500;
    /// One PostgreSQL transaction per record, while records are still taken,
    /// handed to the workers and merged max_batch at a time. Each record's
    /// claim and handler writes commit on their own, as with max_batch = 1
    /// (a failing record holds back only itself and what follows it in its
    /// partition, or its key; what committed before it stays committed), and
    /// each transaction's COMMIT carries the next record's claim: two round
    /// trips per record, where max_batch = 1 takes three. after_db_commit is
    /// called once per transaction, when the unit is merged. For a consumer
    /// (IdempotentConsumer); the share consumer ignores it.
    bool transaction_per_record = false;
    /// Transactions a worker runs back to back in one unit of work, each of
    /// up to its share of max_batch records (max_batch / workers). Each
    /// COMMIT carries the next transaction's claim (a round trip fewer per
    /// transaction), and the unit's records are handed to the worker, merged
    /// and their Kafka offsets committed together: one hand-over per unit,
    /// not per transaction. A failing record holds back its partition's tail
    /// (or its key's) from its transaction on; the transactions before it
    /// stay committed. after_db_commit is called once per transaction, when
    /// the unit is merged. 1: a unit is one transaction. Ignored with
    /// transaction_per_record, whose unit is max_batch records. For a
    /// consumer (IdempotentConsumer); the share consumer ignores it.
    std::size_t batches_per_unit = 1;
    /// Claim the ids of a transaction as new first: a plain INSERT, which
    /// costs PostgreSQL about a third less than INSERT ... ON CONFLICT DO
    /// NOTHING (that one looks every key up before inserting it, under a
    /// lock of its own). Where one id is claimed already, the INSERT fails
    /// with a unique violation, the transaction rolls back before any
    /// handler ran, and it runs again with ON CONFLICT DO NOTHING; claims
    /// then keep to ON CONFLICT until 16 in a row met no claimed id.
    /// Nothing about which records run changes, only the cost: each such
    /// failure is a round trip and a rolled-back INSERT, counted in
    /// optimistic_claim_fallbacks, and the server logs it as an ERROR
    /// (duplicate key value violates unique constraint) with its statement.
    /// False: every claim with ON CONFLICT, where those ERRORs would page
    /// someone. A claim that carries on from a COMMIT (transaction_per_record,
    /// batches_per_unit) always uses ON CONFLICT.
    bool optimistic_claims = true;
    /// PostgreSQL connections working in parallel, each in its own transaction
    /// over up to max_batch / workers records whose partitions (or keys, see
    /// `ordering`) no other worker is running. A worker that finishes takes its
    /// next records at once: none waits for another. With more than one, the
    /// handler and the log sink are called from several threads at once and must
    /// be thread-safe.
    std::size_t workers = 1;
    /// How records are spread over the workers.
    Ordering ordering = Ordering::partition;
    /// Overlap polling with processing: while a batch's transactions run on
    /// the worker threads, the thread in run() polls and decodes the next
    /// batch (it is handed over once the running one has committed, so order
    /// per partition and every guarantee stay as they are); the decoder may
    /// then run at the same time as the handler. False, or max_batch = 1
    /// (where a hand-over per record costs more than it saves): poll, decode
    /// and handle one batch after the other. Either way the handler runs on a
    /// worker thread, never on the thread that called run(), which keeps the
    /// group membership while a handler call runs long.
    bool pipeline = true;
    /// A batch also closes once its payloads reach this many bytes.
    std::size_t max_batch_bytes = std::size_t{8} << 20;
    /// Bytes and records the Kafka client may prefetch ahead of processing, for
    /// all assigned partitions together (librdkafka queued.max.messages.kbytes
    /// and queued.min.messages; fetch responses are 1 MiB at most
    /// (fetch.max.bytes); values set in `kafka` win). With
    /// max_batch_bytes they bound the consumer's memory whatever the number of
    /// events: about max_prefetch_records x (payload + ~300 bytes). Half of each
    /// cap is librdkafka's queue, the other half what the consumer holds per
    /// partition to fill batches round-robin across partitions. Fetching
    /// resumes once the queue is down to half a cap (librdkafka 2.0 would
    /// otherwise wait up to a second), so small caps keep the throughput.
    std::size_t max_prefetch_bytes = std::size_t{32} << 20;
    std::size_t max_prefetch_records = 10000; ///< the same cap in records
    /// Longest time to wait for a batch to fill before processing what is there.
    std::chrono::milliseconds max_batch_wait{50};
    /// Kafka offset commits are sent at most this often: positions of batches
    /// committed in PostgreSQL within the interval go in one commit request.
    /// An offset still never moves before its PostgreSQL transaction
    /// committed; what a crash leaves uncommitted in Kafka (at most this long
    /// of work) is delivered again and skipped as duplicates. Revocation and
    /// stop() commit at once. Zero: one commit per batch.
    std::chrono::milliseconds commit_interval{100};
    /// Handler attempts per record; after the last one fails the record goes to
    /// the dead-letter topic (reason handler_failed) and its partition moves on.
    int max_attempts = 5;
    /// Time budget of one batch's handler calls. Past it, the transaction
    /// commits the records already handled and gives the rest back (their claims
    /// are released in the same transaction; they are delivered again), so a
    /// slow handler never keeps the consumer from polling past
    /// max.poll.interval.ms. Zero: 40% of max.poll.interval.ms.
    std::chrono::milliseconds max_batch_duration{0};
    /// Delay before a record whose handler threw is delivered again; doubles per
    /// attempt up to retry_backoff_max. Other partitions go on meanwhile.
    std::chrono::milliseconds retry_backoff{100};
    std::chrono::milliseconds retry_backoff_max{10000}; ///< cap of the doubling retry_backoff
    /// Classifies a handler exception: return false for one that retrying cannot
    /// fix, and the record is dead-lettered (reason non_retryable) at once.
    /// NonRetryableError is never retried, whatever this says. Default: retry all.
    std::function<bool(const std::exception&)> is_retryable;
    /// Tells an outage from poison records: when failures are not specific to
    /// records, the assignment is paused and probed instead of each record
    /// using up its attempts (see CircuitBreaker). On by default.
    CircuitBreaker circuit_breaker;
    /// Times a transaction is re-run at once after a serialization failure or
    /// deadlock (SQLSTATE 40001 / 40P01) before that counts as a handler failure.
    int transaction_retries = 10;
    /// Longest wait of any statement of the consumer's transactions for a
    /// lock (PostgreSQL lock_timeout on its connections): a claim waiting on
    /// the uncommitted claims of another member's batch, or a handler waiting
    /// on a row lock. Past it the transaction rolls back and the batch runs
    /// again after a backoff; no record is blamed for it (lock_timeouts
    /// counts it, a warning says so). Zero: wait without limit.
    std::chrono::milliseconds lock_timeout{30000};
    /// A claim that waited past lock_timeout ends the PostgreSQL sessions of
    /// this group's other members that have sat idle inside a transaction
    /// for longer than this: a member frozen with claims (SIGSTOP, a paused
    /// VM) holds their row locks for as long as it lives, so its successor
    /// could never claim those records. Its transaction rolls back, claims
    /// and effects together (frozen_members_ended counts it, a warning names
    /// the session). Needs the same role for every member (or
    /// pg_signal_backend). A live member's handler call that runs this long
    /// without SQL, holding claims another member waits for, is ended the
    /// same way and retried. Zero: max.poll.interval.ms (what `kafka` sets,
    /// else librdkafka's 300 s), after which a member that stopped polling
    /// has lost its partitions anyway. Otherwise at least
    /// frozen_member_floor (1 s): validate() refuses less.
    std::chrono::milliseconds frozen_member_timeout{0};
    /// The least frozen_member_timeout (also applied to a
    /// max.poll.interval.ms below it).
    static constexpr std::chrono::milliseconds frozen_member_floor{1000};
    /// An assigned partition that the consumer has not paused and from which
    /// no record has arrived for this long while its leader has records past
    /// the consumer's position is reported: an error line naming it, and the
    /// stalled_partitions gauge (a fetch that never started or stopped). At
    /// least 1 s.
    std::chrono::milliseconds fetch_stall_after{60000};
    /// Longest the consumer waits for PostgreSQL in one of its own steps
    /// (a statement, COMMIT, a stored-position read or write), on the
    /// client's side: a server that froze (a paused VM, a storage stall, a
    /// COMMIT waiting on a dead synchronous standby) enforces no
    /// statement_timeout, and its kernel still acknowledges every packet, so
    /// no keepalive notices. Past it the connection is cut, the batch's
    /// outcome is unknown (rolled back, or a COMMIT in doubt that redelivery
    /// and the claims settle), the assignment pauses and the consumer
    /// reconnects with a backoff (db_timeouts counts it, an error says so).
    /// A claim may wait lock_timeout longer for another batch's row locks;
    /// settling the tables at start-up (DDL, a migration) may take
    /// db_timeout + lock_timeout, and at least 30 s. A handler call is not bounded by it (its SQL on the library's
    /// connection is the handler's own); a forced stop cuts it. Connecting
    /// is bounded by connect_timeout (see docs/failures.md). Zero: no bound.
    std::chrono::milliseconds db_timeout{30000};

    /// Dead-letter topic. Empty means "<group_id>.dlq".
    std::string dead_letter_topic;
    /// Records with a larger value are dead-lettered (reason payload_too_large).
    std::size_t max_payload_bytes = std::size_t{1} << 20;
    /// Extra properties for the dead-letter producer. Security settings
    /// (security.protocol, sasl.*, ssl.*) are copied from `kafka` unless set here.
    std::map<std::string, std::string> dead_letter_kafka;
    /// How long to wait for the broker to acknowledge dead-letter records; a
    /// record not acknowledged in time is not committed and is tried again.
    std::chrono::milliseconds dead_letter_timeout{30000};
    /// How long stop() may take to finish the current batch and leave the
    /// group; past it the batch's transaction is abandoned (a handler call
    /// still running is waited for, with the membership kept, and its
    /// transaction rolls back when it returns). Also how long a revoke waits
    /// for a running batch with records of the revoked partitions (at most
    /// half of max.poll.interval.ms) before it abandons it the same way.
    std::chrono::milliseconds shutdown_timeout{30000};
    /// How often the oldest_claim_age_seconds gauge is measured, on a PostgreSQL
    /// connection and thread of its own (the first time at start-up). Zero: never
    /// (no extra connection; the gauge stays -1).
    std::chrono::milliseconds oldest_claim_refresh{30000};

    /// Extra librdkafka consumer properties, passed through as they are
    /// (security.protocol, sasl.*, ssl.*, session.timeout.ms, ...). The library
    /// sets enable.auto.commit=false, enable.auto.offset.store=false and, unless
    /// given here, isolation.level=read_committed and auto.offset.reset=earliest.
    /// Setting enable.auto.commit or enable.auto.offset.store to true is a ConfigError.
    /// group.protocol=consumer (KIP-848, librdkafka 2.12 or later) is supported; with
    /// it session.timeout.ms, heartbeat.interval.ms, partition.assignment.strategy and
    /// group.protocol.type are a ConfigError (the broker owns them; see docs/configuration.md).
    /// With statistics.interval.ms > 0 the per-partition lag gauges take their
    /// figures from librdkafka's statistics (see LagSource).
    std::map<std::string, std::string> kafka;

    /// Where log lines go. Default: stderr, level info and above.
    LogSink log;
    /// Optional callbacks into the processing loop.
    Hooks hooks;

    /// Throws ConfigError naming the first invalid field.
    void validate() const;

    /// dead_letter_topic, or "<group_id>.dlq" when it is empty.
    std::string effective_dead_letter_topic() const;
};

} // namespace idemkafka
