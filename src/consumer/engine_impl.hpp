#pragma once
// The consumer's engine: the state its run loop shares with the rebalance
// callbacks and the gates that hold it back. Its member functions live in
// engine.cpp (the run loop: polling, the merge of each unit, commits),
// engine_dispatch.cpp (handing units of work to free workers),
// engine_rebalance.cpp (Kafka's assign and revoke, rewinds, fences, per-key
// parking) and engine_gates.cpp (PostgreSQL availability, the circuit
// breaker, the keep-alive while every worker is busy). Private to the library.

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
    ClaimTransaction claims{ClaimTransaction::Setup{cfg, stage, metrics, store, offset_store, ledger, dead_letters,
                                                    circuit, log, [this] { return forced(); },
                                                    positions_after_merge()}};
    std::optional<StoredPositions> positions; // offsets_in_database
    // The Stage slots of the records decoded (waiting or in units): max_batch
    // for the waiting room and unit_cap per worker. Before every Item holder.
    std::optional<SlotPool> slots;
    // Ordering::key: records waiting behind a failed record of their key.
    Parking parking{std::max<std::size_t>(1, cfg.max_prefetch_records / 2),
                    std::max<std::size_t>(1, cfg.max_prefetch_bytes / 2)};
    std::unique_ptr<kafka::GroupMember> kafka;

    // The waiting room: records polled (and taken in the ledger) but not yet
    // handed to a worker, in poll order, at most batch_limit records and
    // max_batch_bytes. A record waits here while its lane (its partition, or
    // its key with Ordering::key) is in a unit a worker runs.
    std::vector<Item> batch;
    std::size_t fill_bytes = 0; // payload and key bytes in `batch`
    // Per worker: the unit of work it runs (one claim transaction's records,
    // decoded into the worker's own Stage slots), empty when it is idle. The
    // poll thread touches a busy worker's unit only to mark records dropped
    // (Item::dropped) and reads it for a revoke; the rest waits for the merge.
    std::vector<std::vector<Item>> units;
    std::vector<Clock::time_point> unit_deadlines; // time budget of each unit
    std::vector<bool> busy;                        // handed a unit not merged yet
    std::size_t busy_units = 0;
    std::size_t unit_cap = 1; // records per unit: max_batch spread over the workers
    // The lanes in busy units. Ordering::partition: each partition's
    // PartitionState::unit, and how many are marked. Ordering::key: the set,
    // kept only with several workers (one worker's next unit starts when no
    // other runs, so it finds every lane free).
    std::size_t busy_partitions = 0;
    std::set<std::pair<PartitionState*, KeyId>> key_lanes;
    std::vector<Item> still_waiting;        // dispatch()'s scratch: the waiting room's next contents
    bool dispatch_dirty = false;            // the waiting room or the free workers changed since dispatch()
    bool worker_freed = false;              // a unit was merged since the last dispatch
    Clock::time_point waiting_since{};      // the waiting room's oldest record came, or was last passed over
    std::set<std::size_t> retire_waits;     // units abandoned by a revoke: retired states live until they merge
    bool pipelined = false;                 // ConsumerConfig::pipeline, when it applies
    std::atomic<bool> unit_finished{false}; // set by a worker when its unit ends
    std::atomic<bool> polling{false};       // the poll thread is in (or about to enter) a poll
    std::exception_ptr deferred_error;      // thrown in a rebalance callback, rethrown after the poll
    bool no_commit = false;                 // run() left by an exception: commit nothing more

    RetentionMode layout = cfg.retention.mode; // of the claims table as found at start-up
    std::unique_ptr<MaintenanceRunner> maintenance;
    std::unique_ptr<OutboxRelay> outbox_relay;
    std::unique_ptr<ClaimAgeMonitor> claim_age;
    std::vector<Worker> workers;
    std::unique_ptr<WorkerPool> pool;

    milliseconds batch_budget{120000}; // of a unit, from its dispatch
    Clock::time_point db_retry_at{};
    GrowingBackoff db_backoff{db_backoff_shape};
    bool db_pause = false;
    // The circuit breaker is open: the whole assignment is paused, nothing runs.
    bool circuit_pause = false;
    bool probe_running = false;                         // the unit in a worker's hands is the circuit's probe
    std::size_t batch_limit = cfg.max_batch;            // records in the waiting room (fewer for a probe)
    std::size_t room_limit = cfg.max_batch;             // batch_limit without a probe
    Clock::time_point circuit_counted{};                // open time counted up to here (circuit_open_seconds)
    Clock::time_point circuit_since{};                  // when it opened from closed
    Clock::time_point next_commit_at{};                 // commit_interval: earliest next offset commit
    std::optional<Clock::time_point> uncommitted_since; // first PostgreSQL commit not yet sent to Kafka
    Clock::time_point next_lag_update{};
    // While the poll thread cannot poll for records (the waiting room is full
    // and no unit ends, or it drains every unit) past keepalive_after
    // (counted from the last poll), the assignment is paused and polled, so
    // the member stays in the group; a revoke waits at most revoke_wait for
    // the units that have records of the revoked partitions.
    Clock::time_point last_polled = Clock::now();
    milliseconds keepalive_after{10000};
    milliseconds revoke_wait{10000};
    bool keepalive_paused = false;
    // The handler calls watched by watch_calls(): per worker, the start of
    // the call it last said was stuck and when it said so.
    struct StuckCall {
        Clock::time_point since{};
        Clock::time_point told{};
    };
    std::vector<StuckCall> stuck;
    Clock::time_point next_call_watch{};

    Impl(ConsumerConfig c, Stage& s);

    ~Impl() override;

    // After run() left by an exception: waits for the units in the workers'
    // hands and drops them unmerged (nothing of them is committed; their
    // records come again), so that every worker is idle and the bookkeeping
    // of lanes and retired partitions is empty for the close's last revoke.
    void abandon_units() noexcept;

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

    // The units in `touching` still run past revoke_wait: their transactions
    // roll back at the next chance (Worker::revoked).
    void abandon_for_revoke(const std::vector<std::size_t>& touching, std::size_t revoked);

    // merge_finished() in a librdkafka callback: an exception must not cross
    // librdkafka's frames, so it is kept and thrown after the poll returns,
    // and nothing more is committed meanwhile (as after a crash).
    void merge_in_callback() noexcept;

    void commit_failed(const TopicPartition& tp, std::int64_t offset) override;

    // ---- positions ------------------------------------------------------------

    void rewind(PartitionState& ps, std::int64_t offset);

    // After a rewind of `ps` to `offset`: records of busy units from there on
    // come again from Kafka, so their outcome must not count when merged.
    void drop_running(const PartitionState* ps, std::int64_t offset);

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
    // Parked keys whose backoff is over go to the waiting room first.
    void take_parked();
    // A polled record into the waiting room (or parking); its partition, or
    // null when it is not taken (not ours, stale, parked).
    PartitionState* take_polled(kafka::MessagePtr m);

    // The in-flight gauges after records left the batch.
    void count_in_flight();

    void count_parked();

    // ---- per-key parking (Ordering::key) ------------------------------------

    void park(Item&& it);

    // After a merge: each key a worker held waits out its retry backoff, and
    // its records in the waiting room wait with it (the unit's own are
    // parked as the merge goes over them).
    void park_keys(const Holds& holds);

    // Past the parking bound, a partition is held as a whole, as without
    // parking: rewound to its first parked record and paused for the retry
    // backoff; its parked records come again from Kafka. Drains first.
    void bound_parking();

    // ---- the workers ------------------------------------------------------------

    // The lane of a record: records of one lane run in poll order, one unit
    // at a time (its partition; with Ordering::key, its key in its partition).
    std::pair<PartitionState*, KeyId> lane_of(const Item& it) const;
    // The lanes in busy units and those of the waiting records, each once.
    std::size_t lanes_known() const;
    // Moves to worker `n`'s unit the waiting records it may take, in poll
    // order: up to `cap` records of at most `lanes_per_unit` lanes, none of
    // a lane in another busy unit; marks their lanes busy.
    void fill_unit(std::size_t n, std::size_t cap, std::size_t lanes_per_unit);
    // After worker `n`'s unit ended: its lanes are free again (and the
    // partitions deferred behind them are fetched again).
    void release_lanes(std::size_t n);

    // Gives the record a Stage slot and decodes it there; false when no slot
    // is free.
    bool decode(Item& it);
    // A polled record is decoded at once (while the workers run) when that
    // leaves the slots the free workers' next units need.
    bool decode_ahead() const;

    // Hands each free worker its next unit: the waiting records whose lane is
    // in no busy unit, in poll order, up to unit_cap; they are decoded into
    // Stage slots (if they were not decoded while waiting) and, on the
    // worker, screened (the reconcile hook runs on its idle connection, dead
    // letters are published), never on the poll thread. True when a unit
    // was handed out.
    bool dispatch();
    // Records wait for a free worker, and a unit is worth handing out now:
    // a full one, the waiting room full, max_batch_wait over, or a worker
    // just freed.
    bool dispatch_due() const;
    void submit(std::size_t n);

    // Merges every unit that has ended, in the order they ended.
    void merge_finished();

    // Until every unit has ended and been merged (nothing is dispatched
    // meanwhile): before what must not meet a running unit (the circuit
    // breaker's decisions, a takeover after a reconnect, the parking bound,
    // a stop).
    void drain();

    // Waits until some unit ends. Past keepalive_after since the last poll
    // (every worker busy with a long handler call, or a drain) the member
    // must poll to stay in the group: the assignment is paused (librdkafka
    // drops what it prefetched and fetches it again from the position after
    // the resume) and polled every 100 ms, which serves rebalances (a revoke
    // commits what was finished of the revoked partitions). Nothing else is
    // committed meanwhile: a member joining starts a rebalance whose
    // JoinGroup this loop cannot see, and a commit still carrying the old
    // generation is refused with ILLEGAL_GENERATION, which costs the whole
    // assignment (librdkafka treats it as lost). A stop that becomes forced
    // abandons the running units (rolled back when their calls return).
    void await_unit();

    // A handler call cannot be interrupted, but one that does not return
    // must be seen: the gauge of the oldest call running (every 200 ms at
    // most), and a call running past max.poll.interval.ms is an error line
    // naming its record, again every max.poll.interval.ms while it runs.
    void watch_calls(Clock::time_point now);

    // A forced stop during a call that does not return: the workers'
    // connections are cut, so a call blocked on PostgreSQL (a frozen server,
    // a handler's statement waiting on a lock) fails at once and its
    // transaction rolls back (on the server, when it notices). A handler
    // blocked elsewhere is still waited for.
    void cut_for_stop();

    // Takes the results of worker `n`'s unit: holds and rewinds, positions,
    // counters, the offset commit when it is due. Records of `batch` on a
    // partition rewound here are dropped: they come again after the records
    // the unit gave back.
    void merge_unit(std::size_t n);

    // The steps of merge_unit(), in order.
    struct Merged {
        Holds holds; // the worker's holds, and its first unfinished record when its transaction did not commit
        BatchInfo info;
        bool failed = false; // its transaction failed for a reason of PostgreSQL's
        std::exception_ptr error;
    };
    Merged merge_worker(std::size_t n);
    // Counts a transaction PostgreSQL committed and runs the after_db_commit hook.
    void committed(const BatchInfo& info);
    // Moves the positions past every finished record of the unit (parking
    // held keys' records) and empties it; returns the partitions moved.
    std::set<PartitionState*> complete_unit(std::vector<Item>& unit, const Holds& holds);
    // offsets_in_database: stores the moved positions on worker `n`'s (idle)
    // connection; false if they were not stored (then Kafka must not hear of
    // them either).
    bool store_positions(std::set<PartitionState*> moved, std::size_t n);

    // Nothing of the waiting room is processed (PostgreSQL unavailable, the
    // circuit open): each of its partitions goes back to its first record.
    void rewind_batch();

    // ---- the circuit breaker ------------------------------------------------

    // Carries out what the circuit decided while units ran (after draining
    // them), and what time decides. False while it is open: nothing may be
    // dispatched.
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
