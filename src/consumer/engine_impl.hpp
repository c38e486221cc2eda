#pragma once
// The consumer's engine: the state its run loop shares with the rebalance
// callbacks and the gates that hold it back. Its member functions live in
// engine.cpp (the run loop: polling, handing batches to the workers, the
// merge, commits), engine_rebalance.cpp (Kafka's assign and revoke, rewinds,
// fences, per-key parking) and engine_gates.cpp (PostgreSQL availability, the
// circuit breaker, the keep-alive during long handler calls). Private to the
// library.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "consumer/batch.hpp"
#include "consumer/claim_age.hpp"
#include "consumer/claim_transaction.hpp"
#include "consumer/dead_letterer.hpp"
#include "consumer/intake.hpp"
#include "consumer/lag.hpp"
#include "consumer/parking.hpp"
#include "consumer/stored_positions.hpp"
#include "core/circuit_breaker.hpp"
#include "core/ledger.hpp"
#include "core/worker_pool.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/redact.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"
#include "kafka/group_member.hpp"
#include "observe/log_context.hpp"
#include "pg/connect.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {

using std::chrono::milliseconds;

constexpr milliseconds idle_poll{100};
constexpr Backoff db_backoff_shape{milliseconds(100), milliseconds(5000)};
constexpr Backoff fence_backoff{milliseconds(1000), milliseconds(30000)};
// A synchronous commit (at a revoke or a stop) waits at most this long.
constexpr milliseconds sync_commit_bound{10000};
// Reading the committed offsets' metadata at an assignment waits at most this long.
constexpr milliseconds inherit_wait{5000};

struct Engine::Impl final : kafka::GroupEvents {
    ConsumerConfig cfg;
    Stage& stage;
    Redactor secrets; // of the configuration: masked in every log record and thrown message
    LogSink log;
    Metrics metrics;
    ProcessedEventStore store;
    std::atomic<int> stop_requests{0};
    static_assert(std::atomic<int>::is_always_lock_free, "stop() must be async-signal-safe");
    std::atomic<Clock::rep> stop_seen{0};

    PartitionLedger ledger{Backoff{cfg.retry_backoff, cfg.retry_backoff_max}, fence_backoff};
    std::optional<OffsetStore> offset_store; // offsets_in_database
    Intake intake{cfg, stage, metrics, log};
    DeadLetterer dead_letters{cfg, ledger, metrics, log, secrets};
    Circuit circuit{cfg.circuit_breaker};
    // A rebalance took partitions of the running batch while a handler call
    // ran past revoke_wait: its transactions roll back at the next chance.
    std::atomic<bool> abandon_running{false};
    ClaimTransaction claims{ClaimTransaction::Setup{
        cfg, stage, metrics, store, offset_store, ledger, dead_letters, circuit, log, [this] { return forced(); },
        [this] { return abandon_running.load(); }, positions_after_merge()}};
    std::optional<StoredPositions> positions; // offsets_in_database
    // Ordering::key: records waiting behind a failed record of their key.
    Parking parking{std::max<std::size_t>(1, cfg.max_prefetch_records / 2),
                    std::max<std::size_t>(1, cfg.max_prefetch_bytes / 2)};
    std::unique_ptr<kafka::GroupMember> kafka;

    // The batch being polled and decoded, and the one the workers process
    // (pipeline: both at once). The poll thread touches `running` and the
    // workers only after finish_running(). `running` is empty when no batch
    // is in the workers' hands.
    std::vector<Item> batch;
    std::vector<Item> running;
    std::size_t fill_bytes = 0; // payload and key bytes taken by the last fill_batch()
    bool pipelined = false;     // ConsumerConfig::pipeline, when it applies
    std::atomic<bool> running_done{false};
    std::atomic<bool> polling{false};  // the poll thread is in (or about to enter) a poll
    std::size_t fill_bank = 0;         // Stage bank `batch` decodes into
    std::size_t run_bank = 0;          // Stage bank of `running`
    std::exception_ptr deferred_error; // thrown in a rebalance callback, rethrown after the poll
    bool no_commit = false;            // run() left by an exception: commit nothing more

    RetentionMode layout = cfg.retention.mode; // of the claims table as found at start-up
    std::unique_ptr<MaintenanceRunner> maintenance;
    std::unique_ptr<OutboxRelay> outbox_relay;
    std::unique_ptr<ClaimAgeMonitor> claim_age;
    std::vector<Worker> workers;
    std::unique_ptr<WorkerPool> pool;

    Clock::time_point batch_deadline{}; // time budget of the current batch
    milliseconds batch_budget{120000};
    Clock::time_point db_retry_at{};
    GrowingBackoff db_backoff{db_backoff_shape};
    bool db_pause = false;
    // The circuit breaker is open: the whole assignment is paused, nothing runs.
    bool circuit_pause = false;
    bool probe_running = false;                         // the batch in the workers' hands is the circuit's probe
    std::size_t batch_limit = cfg.max_batch;            // records per batch (fewer for a probe)
    Clock::time_point circuit_counted{};                // open time counted up to here (circuit_open_seconds)
    Clock::time_point circuit_since{};                  // when it opened from closed
    Clock::time_point next_commit_at{};                 // commit_interval: earliest next offset commit
    std::optional<Clock::time_point> uncommitted_since; // first PostgreSQL commit not yet sent to Kafka
    Clock::time_point next_lag_update{};
    // A handler call that keeps the poll thread waiting past keepalive_after
    // (counted from the last poll) has the assignment paused and polled, so
    // the member stays in the group; a revoke waits at most revoke_wait for
    // a running batch that has records of the revoked partitions.
    Clock::time_point last_polled = Clock::now();
    milliseconds keepalive_after{10000};
    milliseconds revoke_wait{10000};
    bool keepalive_paused = false;

    Impl(ConsumerConfig c, Stage& s);

    ~Impl() override;

    // A second stop(), or a first one older than shutdown_timeout, abandons
    // the current transaction.
    bool forced() noexcept;

    // Per-key mode spreads a partition over several workers and parks failed
    // keys: no worker alone knows the partition's position, so it is written
    // after the merge.
    bool positions_after_merge() const { return cfg.ordering == Ordering::key; }

    // ---- PostgreSQL -------------------------------------------------------

    // One connection per worker; the schema is created (or checked) by the first.
    void connect(Worker& w, bool first);

    // True when PostgreSQL can take transactions now; otherwise the
    // assignment stays paused until the backoff has passed (and, after a
    // lost connection, a reconnect succeeded).
    bool ensure_db();

    // Pauses the whole assignment for the next backoff.
    void db_hold();

    void set_db_pause(bool pause);

    // ---- Kafka events (inside poll) -----------------------------------------

    bool assigned(std::vector<std::pair<TopicPartition, std::int64_t>>& start) override;

    // The handler failures earlier owners counted for records at or after
    // each partition's committed offset, carried in the commit's metadata
    // (PartitionLedger::take_commits): a record's attempts survive a
    // rebalance and a restart, so a poison record reaches max_attempts
    // however often the group changes or its members crash. One round trip
    // to the coordinator per assignment; without an answer the counts start
    // at zero (logged). Returns the committed offsets read (the stored
    // positions compare with them), nothing without an answer.
    std::optional<std::vector<OffsetCommit>> inherit_failures(const std::vector<TopicPartition>& tps);

    void revoked(const std::set<TopicPartition>& tps, bool lost) override;

    void abandon_for_revoke(std::size_t revoked);

    // finish_running() in a librdkafka callback: an exception must not cross
    // librdkafka's frames, so it is kept and thrown after the poll returns,
    // and nothing more is committed meanwhile (as after a crash).
    void finish_running_in_callback() noexcept;

    void commit_failed(const TopicPartition& tp, std::int64_t offset) override;

    // ---- positions ------------------------------------------------------------

    void rewind(PartitionState& ps, std::int64_t offset);

    void seek(PartitionState& ps);

    // Rewinds every held partition to its hold; a hold after failures also
    // pauses the partition for the backoff (other partitions go on).
    void apply_holds(const Holds& holds);

    // A refused position write means another member took the partition over
    // in the offset table. Usually this member lost it in Kafka too and hears
    // so at its next poll; the partition waits (a backoff growing with each
    // refusal in a row) and, if it is still ours then (after an operator's
    // `idemkafka-admin offsets set`, say), is taken over again from the
    // stored position, instead of being rewound and refused forever.
    void pause_fenced();

    // Sends the positions committed in PostgreSQL since the last commit (see
    // ConsumerConfig::commit_interval).
    void flush_commits();

    void housekeeping();

    // ---- polling ----------------------------------------------------------

    void fill_batch();

    // The in-flight gauges after records left the batch.
    void count_in_flight();

    void count_parked();

    // ---- per-key parking (Ordering::key) ------------------------------------

    void park(Item&& it);

    // After a merge: each key a worker held waits out its retry backoff, and
    // its records in the next batch wait with it (the running batch's are
    // parked as the merge goes over them).
    void park_keys(const Holds& holds);

    // Past the parking bound, a partition is held as a whole, as without
    // parking: rewound to its first parked record and paused for the retry
    // backoff; its parked records come again from Kafka. Runs with no batch
    // in the workers' hands (a rewind must not meet records still running).
    void bound_parking();

    std::size_t worker_of(const Item& it) const;

    // ---- the workers ------------------------------------------------------------

    // Hands `batch` (decoded) to the workers. Runs when none is in their
    // hands, so their connections are free for the reconcile hook.
    void launch();

    // Waits for the batch in the workers' hands. Past keepalive_after since
    // the last poll (a handler call that runs long) the member must poll to
    // stay in the group: the assignment is paused (librdkafka drops what it
    // prefetched and fetches it again from the position after the resume)
    // and polled every 100 ms, which serves rebalances (a revoke commits
    // what was finished of the revoked partitions). Nothing else is committed
    // meanwhile: a member joining starts a rebalance whose JoinGroup this
    // loop cannot see, and a commit still carrying the old generation is
    // refused with ILLEGAL_GENERATION, which costs the whole assignment
    // (librdkafka treats it as lost). A stop that becomes forced abandons the
    // batch (rolled back when its calls return).
    void await_workers();

    // A forced stop during a call that does not return: the workers'
    // connections are cut, so a call blocked on PostgreSQL (a frozen server,
    // a handler's statement waiting on a lock) fails at once and its
    // transaction rolls back (on the server, when it notices). A handler
    // blocked elsewhere is still waited for.
    void cut_for_stop();

    // Waits for the batch in the workers' hands and takes its results: holds
    // and rewinds, positions, counters, the offset commit when it is due.
    // Records of `batch` on a partition rewound here are dropped: they come
    // again after the records the running batch gave back.
    void finish_running();

    // The steps of finish_running(), in order.
    struct Merged {
        Holds holds; // a partition stops at the earliest hold of any worker, and at the first
                     // unfinished record of a worker whose transaction did not commit
        BatchInfo info;
        bool any_failed = false; // a worker's transaction failed for a reason of PostgreSQL's
        std::exception_ptr error;
    };
    Merged merge_workers();
    // Counts a batch PostgreSQL committed and runs the after_db_commit hook.
    void committed(const BatchInfo& info);
    // Moves the positions past every finished record of `running` (parking
    // held keys' records) and empties it; returns the partitions moved.
    std::set<PartitionState*> complete_running(const Holds& holds);
    // offsets_in_database: stores the moved positions; false if they were not
    // stored (then Kafka must not hear of them either).
    bool store_positions(std::set<PartitionState*> moved);

    // Nothing of the batch is processed (PostgreSQL unavailable): every
    // partition goes back to its first record.
    void rewind_batch();

    // ---- the circuit breaker ------------------------------------------------

    // Between batches (none in the workers' hands): carries out what the
    // circuit decided while the last one ran, and what time decides. False
    // while it is open: nothing may be launched.
    bool circuit_ready();

    void circuit_opened(const Circuit::Evidence& e, Clock::time_point now);

    void settle_probe(Clock::time_point now);

    // The whole assignment waits, paused. Parked keys go back to Kafka: their
    // partitions are rewound to the first parked record, and what `batch`
    // holds from there on goes too (rewound later to a further offset, the
    // partition would skip the records in between).
    void circuit_hold();

    void set_circuit_pause(bool pause);

    // ---- lifecycle --------------------------------------------------------

    void start();

    void run();

    void shutdown();
};

} // namespace idemkafka::detail
