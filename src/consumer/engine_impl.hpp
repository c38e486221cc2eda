#pragma once
// The consumer's engine: the run loop that wires its parts, and the state it
// shares with the rebalance callbacks. Each part owns its state and says its
// invariant where it is declared: the WaitingRoom (records polled, not yet in
// a unit), the Dispatcher (units, lanes, shares, Stage slots), the gates in
// gates.hpp (Gates: DatabaseGate, CircuitGate and KeepAlive with its
// CallWatch; CommitPacer), the signals from outside the loop (RunSignals:
// StopSignal, UnitWake, CallbackFault) and the Sidecars. Its member
// functions live in engine.cpp (the run loop: polling, the merge of each
// unit, commits), engine_dispatch.cpp (handing units of work to free
// workers), engine_rebalance.cpp (Kafka's assign and revoke, rewinds,
// fences, per-key parking) and engine_gates.cpp (what the gates' decisions
// do to the assignment). Private to the library.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "consumer/claim_transaction.hpp"
#include "consumer/dead_letterer.hpp"
#include "consumer/dispatcher.hpp"
#include "consumer/gates.hpp"
#include "consumer/intake.hpp"
#include "consumer/item.hpp"
#include "consumer/lag.hpp"
#include "consumer/parking.hpp"
#include "consumer/run_signals.hpp"
#include "consumer/sidecars.hpp"
#include "consumer/stored_positions.hpp"
#include "consumer/waiting_room.hpp"
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

// A worker's share of max_batch: the records of one of its transactions
// (but with transaction_per_record).
inline std::size_t worker_batch(const ConsumerConfig& cfg)
{
    return std::max<std::size_t>(1, (cfg.max_batch + cfg.workers - 1) / cfg.workers);
}

// Batches of max_batch records in a unit of work: batches_per_unit, but 1
// with transaction_per_record (whose unit is max_batch records).
inline std::size_t unit_batches(const ConsumerConfig& cfg)
{
    return cfg.transaction_per_record ? 1 : cfg.batches_per_unit;
}

// Records of a worker's unit of work: its share of max_batch, times
// unit_batches().
inline std::size_t unit_records(const ConsumerConfig& cfg)
{
    return worker_batch(cfg) * unit_batches(cfg);
}

// ClaimTransaction::Setup::tx_records: 1 with transaction_per_record, the
// worker's share of max_batch with batches_per_unit above 1, 0 (the unit in
// one transaction) otherwise.
inline std::size_t tx_records(const ConsumerConfig& cfg)
{
    if (cfg.transaction_per_record)
        return 1;
    return cfg.batches_per_unit > 1 ? worker_batch(cfg) : 0;
}

// The consumer's tables, as the configuration names them.
struct Tables {
    explicit Tables(const ConsumerConfig& cfg)
        : claims(cfg.schema, cfg.table),
          offsets(cfg.offsets_in_database ? std::make_optional<OffsetStore>(cfg.schema, cfg.offsets_table)
                                          : std::nullopt)
    {
    }
    ProcessedEventStore claims;
    std::optional<OffsetStore> offsets; // offsets_in_database
};

// The workers, each with its PostgreSQL session and the unit it runs, and
// the pool of threads that runs their units (a unit's end wakes the poll
// thread: RunSignals::wake). Sized and started by Engine::Impl::start().
struct Crew {
    std::vector<Worker> workers;
    std::unique_ptr<WorkerPool> pool; // last: its threads end before the rest goes
};

struct Engine::Impl final : kafka::GroupEvents {
    ConsumerConfig cfg;
    Stage& stage;
    Redactor secrets; // of the configuration: masked in every log record and thrown message
    LogSink log;
    Metrics metrics;
    Tables tables{cfg};
    RunSignals signals{cfg.shutdown_timeout}; // stop(), a unit's end, a callback's fault; before the crew

    PartitionLedger ledger{Backoff{cfg.retry_backoff, cfg.retry_backoff_max}, fence_backoff};
    Intake intake{cfg, stage, metrics, log};
    DeadLetterer dead_letters{cfg, ledger, metrics, log, secrets};
    // PostgreSQL away, the circuit breaker, the keep-alive (and its watch on
    // handler calls that do not return): what pauses the whole assignment.
    Gates gates{cfg, db_backoff_shape, metrics, log};
    ClaimTransaction claims{ClaimTransaction::Setup{
        cfg, stage, metrics, tables.claims, tables.offsets, ledger, dead_letters, gates.circuit.circuit(), log,
        [this] { return forced(); }, positions_after_merge(), tx_records(cfg)}};
    std::optional<StoredPositions> positions; // offsets_in_database
    // Ordering::key: records waiting behind a failed record of their key.
    Parking parking{std::max<std::size_t>(1, cfg.max_prefetch_records / 2),
                    std::max<std::size_t>(1, cfg.max_prefetch_bytes / 2)};
    std::unique_ptr<kafka::GroupMember> kafka;

    // The workers' units, the lanes they hold and the Stage slots of the
    // records decoded: max_batch spread over the workers (times
    // batches_per_unit), a unit is a worker's share of a full waiting room.
    Dispatcher dispatcher{cfg.ordering, cfg.workers, unit_records(cfg),
                          Dispatcher::Hands{[this](std::size_t n) { return crew.workers[n].db != nullptr; },
                                            [this](Item& it) { intake.decode(it); },
                                            [this](std::size_t n) { submit(n); }}};
    WaitingRoom room{cfg.max_batch_bytes}; // after the dispatcher: its records hold the dispatcher's slots
    CommitPacer pacer{cfg.commit_interval};
    Sidecars sidecars;
    Crew crew;

    Impl(ConsumerConfig c, Stage& s);

    ~Impl() override;

    // After run() left by an exception: waits for the units in the workers'
    // hands and drops them unmerged (nothing of them is committed; their
    // records come again), so that every worker is idle and the bookkeeping
    // of lanes and retired partitions is empty for the close's last revoke.
    void abandon_units() noexcept;

    // A second stop(), or a first one older than shutdown_timeout, abandons
    // the current transaction.
    bool forced() noexcept { return signals.stop.forced(); }

    // ConsumerConfig::pipeline, when it applies: a hand-over per record
    // costs two thread wake-ups, more than the overlap saves, so max_batch
    // = 1 runs one record after the other.
    bool pipelined() const { return cfg.pipeline && cfg.max_batch > 1; }

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

    // Pauses the whole assignment while PostgreSQL is away or the circuit is
    // open, else resumes all but the partitions waiting out a retry backoff.
    void apply_pauses();

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

    // Polls into the waiting room until it is full, a unit ended, or a unit
    // is due to be handed out.
    void fill_room();
    // Parked keys whose backoff is over go to the waiting room first.
    void take_parked();
    // A polled record into the waiting room (or parking), polled at `now`;
    // its partition, or null when it is not taken (not ours, stale, parked).
    PartitionState* take_polled(kafka::MessagePtr m, Clock::time_point now);

    // The in-flight gauges after records left the waiting room.
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

    // After worker `n`'s unit ended: its lanes are free again (the
    // partitions deferred behind them are fetched again).
    void release_lanes(std::size_t n);
    // After its merge (or when it is dropped): the worker is idle, and the
    // states of partitions revoked while it ran go once no unit needs them.
    void free_worker(std::size_t n);

    // Hands each free worker its next unit (Dispatcher::hand_out): the
    // records are decoded into Stage slots (if they were not decoded while
    // waiting) and, on the worker, screened (the reconcile hook runs on its
    // idle connection, dead letters are published), never on the poll
    // thread. True when a unit was handed out.
    bool dispatch();
    // Records wait for a free worker, and a unit is worth handing out at `now`.
    bool dispatch_due(Clock::time_point now) const;
    // Runs worker n's unit on the pool.
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

    // The busy workers' running calls to the keep-alive's CallWatch (every 200 ms).
    void watch_calls(Clock::time_point now);

    // A forced stop during a call that does not return: the workers'
    // connections are cut, so a call blocked on PostgreSQL (a frozen server,
    // a handler's statement waiting on a lock) fails at once and its
    // transaction rolls back (on the server, when it notices). A handler
    // blocked elsewhere is still waited for.
    void cut_for_stop();

    // Takes the results of worker `n`'s unit: holds and rewinds, positions,
    // counters, the offset commit when it is due. Records of the waiting room on a
    // partition rewound here are dropped: they come again after the records
    // the unit gave back.
    void merge_unit(std::size_t n);

    // The steps of merge_unit(), in order.
    struct Merged {
        Holds holds; // the worker's holds, and its first unfinished record when its transaction did not commit
        std::vector<BatchInfo> commits; // its transactions that committed, in order
        bool failed = false;            // its (last) transaction failed for a reason of PostgreSQL's
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
    void rewind_room();

    // ---- the circuit breaker ------------------------------------------------

    // Carries out what the circuit decided while units ran (after draining
    // them), and what time decides. False while it is open: nothing may be
    // dispatched.
    bool circuit_ready();

    // The whole assignment waits, paused. Parked keys go back to Kafka: their
    // partitions are rewound to the first parked record, and what the
    // waiting room holds from there on goes too (rewound later to a further offset, the
    // partition would skip the records in between).
    void circuit_hold();

    // ---- lifecycle --------------------------------------------------------

    void start();

    void run();

    void shutdown();
};

} // namespace idemkafka::detail
