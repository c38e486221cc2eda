// The consumer's run loop: it wires the pieces together and hands batches
// from the poll thread to the workers.
//
// A record's path, in order:
//  1. run() -> fill_batch(): kafka::GroupMember::poll() returns it; the
//     PartitionLedger admits it (records fetched before a rewind are stale).
//  2. Intake::decode(): the Stage decodes it into the free bank; a record
//     that cannot run is marked for the dead letter.
//  3. launch() -> ClaimTransaction::screen(): Intake::screen() (settled
//     dead letters, the dedup-horizon guard) and the reconcile hook; poison
//     records go to the DeadLetterer. The rest is spread over the workers
//     (by partition, or by key).
//  4. ClaimTransaction::run() on each worker: claim, handler calls, stored
//     positions, COMMIT; a failing record is held (retried) or dead-lettered.
//  5. finish_running(): the workers' holds are merged; the ledger rewinds
//     held partitions (seek, and a pause for a retry backoff) and moves the
//     position past every finished record. With Ordering::key a failed
//     record parks only its key: its records wait in Parking, the
//     partition's other keys go on, and the position stays at the first
//     parked record; when the backoff is over fill_batch() takes them again.
//  6. flush_commits(): the ledger's moved positions go to Kafka as an offset
//     commit (kafka::GroupMember::commit); a failed commit is sent again.
// Rebalances arrive inside poll() through kafka::GroupEvents: the running
// batch is finished first, then the ledger assigns or forgets partitions.
// The circuit breaker (Circuit) hears of every handler attempt in step 4;
// when failures across keys look like an outage it opens, the worker gives
// its records back uncounted, and after the merge circuit_ready() pauses the
// whole assignment, rewinds it, and later lets one probe batch through.

#include "idemkafka/consumer.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "consumer/batch.hpp"
#include "core/circuit_breaker.hpp"
#include "consumer/claim_age.hpp"
#include "consumer/dead_letterer.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/redact.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"
#include "consumer/intake.hpp"
#include "kafka/group_member.hpp"
#include "consumer/lag.hpp"
#include "core/ledger.hpp"
#include "observe/log_context.hpp"
#include "consumer/parking.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/tx_guard.hpp"
#include "consumer/stored_positions.hpp"
#include "core/worker_pool.hpp"
#include "pg/connect.hpp"

namespace idemkafka::detail {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds idle_poll{100};
constexpr Backoff db_backoff_shape{milliseconds(100), milliseconds(5000)};
constexpr Backoff fence_backoff{milliseconds(1000), milliseconds(30000)};
// A synchronous commit (at a revoke or a stop) waits at most this long.
constexpr milliseconds sync_commit_bound{10000};
// Reading the committed offsets' metadata at an assignment waits at most this long.
constexpr milliseconds inherit_wait{5000};

} // namespace

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

    Impl(ConsumerConfig c, Stage& s)
        : cfg(std::move(c)), stage(s), secrets(secrets_of(cfg.postgres, {&cfg.kafka, &cfg.dead_letter_kafka,
                                                                         cfg.outbox ? &cfg.outbox->kafka : nullptr})),
          log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}}, secrets)),
          store(cfg.schema, cfg.table),
          offset_store(cfg.offsets_in_database ? std::make_optional<OffsetStore>(cfg.schema, cfg.offsets_table)
                                               : std::nullopt)
    {
        if (offset_store)
            positions.emplace(cfg, *offset_store, ledger, claims, metrics, log);
    }

    ~Impl() override
    {
        // run() left by an exception, maybe with a batch in the workers' hands:
        // let it end, and take nothing of it (committing nothing is always safe).
        if (pool)
            pool->wait();
        batch.clear();
        running.clear();
        if (kafka) {
            // Leave the group without committing anything, as a crash would
            // (but without the session timeout).
            no_commit = true;
            kafka->close(cfg.shutdown_timeout);
        }
    }

    // A second stop(), or a first one older than shutdown_timeout, abandons
    // the current transaction.
    bool forced() noexcept
    {
        const int stops = stop_requests.load();
        if (stops >= 2)
            return true;
        if (stops == 0)
            return false;
        const auto now = Clock::now().time_since_epoch().count();
        Clock::rep seen = 0;
        stop_seen.compare_exchange_strong(seen, now);
        seen = stop_seen.load();
        return Clock::duration(now - seen) >= cfg.shutdown_timeout;
    }

    // Per-key mode spreads a partition over several workers and parks failed
    // keys: no worker alone knows the partition's position, so it is written
    // after the merge.
    bool positions_after_merge() const { return cfg.ordering == Ordering::key; }

    // ---- PostgreSQL -------------------------------------------------------

    // One connection per worker; the schema is created (or checked) by the first.
    void connect(Worker& w, bool first)
    {
        w.connect(cfg.postgres); // connect_timeout bounds this
        const pg::Watch::Armed armed(w.watch, cfg.db_timeout);
        if (first) {
            layout = claims.settle_schema(*w.db);
            intake.set_layout(layout);
        }
        claims.prepare(*w.db);
    }

    // True when PostgreSQL can take transactions now; otherwise the
    // assignment stays paused until the backoff has passed (and, after a
    // lost connection, a reconnect succeeded).
    bool ensure_db()
    {
        if (Clock::now() < db_retry_at)
            return false;
        bool reconnected = false;
        for (std::size_t i = 0; i < workers.size(); ++i) {
            auto& w = workers[i];
            if (w.db)
                continue;
            try {
                connect(w, false);
                metrics.db_reconnects.add();
                reconnected = true;
                say(log, LogLevel::info, {}, "reconnected to PostgreSQL (worker {})", i);
            } catch (const std::exception& e) {
                w.disconnect();
                say(log, LogLevel::warning, error_field(e.what()),
                    "PostgreSQL reconnect failed, next attempt in {} ms: {}", db_backoff.upcoming().count(), e.what());
                db_hold();
                return false;
            }
        }
        if (positions) {
            // A new connection may reach another server than the one that
            // committed this member's last transactions (a failover to a
            // standby without them): their positions are gone with their
            // claims and effects, so every partition takes its stored position
            // again instead of going on from its position in memory.
            if (reconnected) {
                positions->reconnect();
                for (auto& [tp, ps] : ledger)
                    ps.position_verified = false;
            }
            // Partitions assigned while PostgreSQL was away, or verified again
            // after a reconnect, take their stored positions now (a seek),
            // before they are resumed; what the next batch holds of them comes
            // again after the seek.
            const auto rewinds = positions->verify(*kafka);
            for (const auto& [ps, offset] : rewinds)
                rewind(*ps, offset);
            if (!rewinds.empty()) {
                batch.erase(std::remove_if(batch.begin(), batch.end(),
                                           [&](const Item& it) { return rewinds.count(it.part) > 0; }),
                            batch.end());
                count_in_flight();
            }
            for (const auto& [tp, ps] : ledger)
                if (!ps.position_verified) {
                    db_hold();
                    return false;
                }
        }
        db_backoff.reset();
        if (db_pause)
            set_db_pause(false);
        return true;
    }

    // Pauses the whole assignment for the next backoff.
    void db_hold()
    {
        db_retry_at = Clock::now() + db_backoff.next();
        if (!db_pause)
            set_db_pause(true);
    }

    void set_db_pause(bool pause)
    {
        db_pause = pause;
        std::set<TopicPartition> keep; // partitions waiting out a retry backoff stay paused
        for (const auto& [tp, ps] : ledger)
            if (ps.retry_paused)
                keep.insert(tp);
        kafka->pause_assignment(pause || circuit_pause, keep);
    }

    // ---- Kafka events (inside poll) -----------------------------------------

    bool assigned(std::vector<std::pair<TopicPartition, std::int64_t>>& start) override
    {
        std::vector<TopicPartition> tps;
        for (const auto& [tp, offset] : start) {
            ledger.assign(tp);
            tps.push_back(tp);
        }
        const auto committed = inherit_failures(tps);
        if (positions) {
            // Each partition starts at its stored position when it has one
            // (see StoredPositions::acquire()), else at Kafka's committed
            // offset. Without PostgreSQL it stays unverified and paused until
            // a reconnect verifies it (see ensure_db).
            if (auto target = positions->acquire(*kafka, tps, committed ? &*committed : nullptr)) {
                for (auto& [tp, offset] : start)
                    if (auto t = target->find(tp); t != target->end())
                        offset = t->second;
            } else {
                for (const auto& tp : tps)
                    if (auto* ps = ledger.find(tp.topic, tp.partition))
                        ps->position_verified = false;
                if (!db_pause)
                    db_hold();
            }
        }
        return db_pause || keepalive_paused || circuit_pause;
    }

    // The handler failures earlier owners counted for records at or after
    // each partition's committed offset, carried in the commit's metadata
    // (PartitionLedger::take_commits): a record's attempts survive a
    // rebalance and a restart, so a poison record reaches max_attempts
    // however often the group changes or its members crash. One round trip
    // to the coordinator per assignment; without an answer the counts start
    // at zero (logged). Returns the committed offsets read (the stored
    // positions compare with them), nothing without an answer.
    std::optional<std::vector<OffsetCommit>> inherit_failures(const std::vector<TopicPartition>& tps)
    {
        std::vector<OffsetCommit> committed;
        for (const auto& tp : tps)
            committed.push_back({tp, kafka::offset_invalid, {}});
        if (!kafka->committed(committed, inherit_wait)) {
            say(log, LogLevel::warning, {},
                "could not read the committed offsets of {} assigned partition(s) within {} ms: handler failures "
                "counted by their earlier owners are not known, so a failing record may get up to max_attempts more",
                tps.size(), inherit_wait.count());
            return std::nullopt;
        }
        for (const auto& c : committed) {
            auto* ps = ledger.find(c.tp.topic, c.tp.partition);
            if (!ps || c.offset < 0)
                continue;
            ps->start_offset = c.offset;
            ps->start_known = true;
            const auto failures = parse_failures_metadata(c.metadata);
            if (failures.empty())
                continue;
            const auto n = ledger.inherit_failures(*ps, failures, c.offset);
            if (n)
                say(log, LogLevel::info, coordinates(c.tp.topic, c.tp.partition, c.offset),
                    "{}/{}: {} record(s) from offset {} on failed before this assignment (up to {} times); their "
                    "attempts go on from there",
                    c.tp.topic, c.tp.partition, n, c.offset,
                    std::max_element(failures.begin(), failures.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; })
                        ->second);
        }
        return committed;
    }

    void revoked(const std::set<TopicPartition>& tps, bool lost) override
    {
        // Records polled for revoked partitions but not processed yet are
        // dropped: their offsets were never committed, so the new owner reads them.
        batch.erase(
            std::remove_if(batch.begin(), batch.end(), [&](const Item& it) { return tps.count(it.part->tp) > 0; }),
            batch.end());
        count_in_flight();
        // The running batch first: its positions belong to what is revoked.
        // It is waited for (at most revoke_wait) only when it has records of
        // the revoked partitions; past that its transactions are abandoned
        // (rolled back when their handler calls return), and the states it
        // points to stay in memory until it ends.
        bool settled = true;
        if (!running.empty()) {
            const bool touched =
                std::any_of(running.begin(), running.end(), [&](const Item& it) { return tps.count(it.part->tp) > 0; });
            // What PostgreSQL holds already is committed before the wait: sent
            // after a wait the group did not sit out, it would carry a
            // generation the coordinator has left (ILLEGAL_GENERATION), which
            // librdkafka answers by dropping the whole assignment, the
            // partitions this member keeps included.
            if (touched && !lost && !no_commit)
                kafka->commit(ledger.take_commits(&tps), false, sync_commit_bound);
            if (pool->wait_until(Clock::now() + (touched ? revoke_wait : milliseconds(0))))
                finish_running_in_callback();
            else if (touched)
                abandon_for_revoke(tps.size());
            settled = running.empty();
        }
        if (!lost && !no_commit)
            kafka->commit(ledger.take_commits(&tps), false, sync_commit_bound);
        // Parked records go too: the position committed above stays before them.
        for (const auto& tp : tps)
            if (auto* ps = ledger.find(tp.topic, tp.partition))
                parking.drop(ps);
        ledger.revoke(tps, !settled);
        count_in_flight();
    }

    void abandon_for_revoke(std::size_t revoked)
    {
        if (abandon_running.exchange(true))
            return;
        metrics.revoke_abandons.add();
        say(log, LogLevel::warning, {},
            "a rebalance revoked {} partition(s) while a handler call of the running batch has run past the revoke "
            "wait ({} ms): the batch's transactions roll back when their calls return, and the new owners process "
            "those records (the claims keep their effects in PostgreSQL once; side effects outside it may happen "
            "twice)",
            revoked, revoke_wait.count());
    }

    // finish_running() in a librdkafka callback: an exception must not cross
    // librdkafka's frames, so it is kept and thrown after the poll returns,
    // and nothing more is committed meanwhile (as after a crash).
    void finish_running_in_callback() noexcept
    {
        try {
            finish_running();
        } catch (...) {
            no_commit = true;
            if (!deferred_error)
                deferred_error = std::current_exception();
        }
    }

    void commit_failed(const TopicPartition& tp, std::int64_t offset) override
    {
        ledger.commit_failed(tp.topic, tp.partition, offset);
    }

    // ---- positions ------------------------------------------------------------

    void rewind(PartitionState& ps, std::int64_t offset)
    {
        PartitionLedger::rewind(ps, offset);
        parking.drop_from(&ps, offset); // they come again from Kafka
        seek(ps);
    }

    void seek(PartitionState& ps)
    {
        if (kafka->seek(ps.tp, ps.resume_from) != kafka::GroupMember::SeekResult::failed)
            PartitionLedger::seek_sent(ps);
    }

    // Rewinds every held partition to its hold; a hold after failures also
    // pauses the partition for the backoff (other partitions go on).
    void apply_holds(const Holds& holds)
    {
        for (const auto& action : ledger.apply(holds, Clock::now())) {
            parking.drop_from(action.ps, action.ps->resume_from); // they come again from Kafka
            seek(*action.ps);
            if (action.pause)
                kafka->pause(action.ps->tp, true);
        }
    }

    // A refused position write means another member took the partition over
    // in the offset table. Usually this member lost it in Kafka too and hears
    // so at its next poll; the partition waits (a backoff growing with each
    // refusal in a row) and, if it is still ours then (after an operator's
    // `idemkafka-admin offsets set`, say), is taken over again from the
    // stored position, instead of being rewound and refused forever.
    void pause_fenced()
    {
        for (const auto& tp : claims.take_fenced()) {
            const auto wait = ledger.fence(tp, Clock::now());
            if (!wait)
                continue;
            kafka->pause(tp, true);
            auto* ps = ledger.find(tp.topic, tp.partition);
            say(log, LogLevel::warning, coordinates(tp.topic, tp.partition, ps->processed_next),
                "{}/{} is owned by another member in the offset table; paused for {} ms, then taken over again "
                "from the stored position unless a rebalance revokes it first",
                tp.topic, tp.partition, wait->count());
        }
    }

    // Sends the positions committed in PostgreSQL since the last commit (see
    // ConsumerConfig::commit_interval).
    void flush_commits()
    {
        const auto now = Clock::now();
        kafka->commit(ledger.take_commits(nullptr), true, sync_commit_bound);
        if (uncommitted_since)
            metrics.commit_delay_seconds.observe(std::chrono::duration<double>(now - *uncommitted_since).count());
        uncommitted_since.reset();
        next_commit_at = now + cfg.commit_interval;
    }

    void housekeeping()
    {
        const auto now = Clock::now();
        const bool tick = now >= next_lag_update;
        if (tick) {
            update_lag(ledger, *kafka, metrics);
            if (maintenance)
                metrics.expired_partitions_kept.set(static_cast<std::int64_t>(maintenance->expired_partitions_kept()));
            next_lag_update = now + milliseconds(200);
        }
        // Each tick also resends failed commits of an idle partition.
        if (now >= next_commit_at && (tick || uncommitted_since))
            flush_commits();
        const auto due = ledger.due(now);
        for (auto* ps : due.seek)
            seek(*ps);
        if (!db_pause && !circuit_pause)
            for (auto* ps : due.resume)
                kafka->pause(ps->tp, false);
    }

    // ---- polling ----------------------------------------------------------

    void fill_batch()
    {
        Clock::time_point deadline{};
        fill_bytes = 0;
        // Parked keys whose backoff is over run first, in their order (not
        // while PostgreSQL is away: they would only be rewound).
        if (!parking.empty() && !db_pause) {
            const auto before = batch.size();
            parking.take_due(Clock::now(), batch);
            for (auto i = before; i < batch.size(); ++i)
                fill_bytes += batch[i].bytes();
            if (batch.size() > before) {
                deadline = Clock::now() + cfg.max_batch_wait;
                count_parked();
            }
        }
        while (batch.size() < batch_limit && fill_bytes < cfg.max_batch_bytes) {
            // The workers are done: hand them what there is rather than leave
            // PostgreSQL idle (and commit their positions when there is nothing).
            // `polling` is set first: a worker finishing from here on sees it
            // and wakes the poll below.
            polling = true;
            if (!running.empty() && running_done.load()) {
                polling = false;
                return;
            }
            milliseconds timeout = idle_poll;
            if (!batch.empty())
                timeout = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
            auto m = kafka->poll(timeout);
            polling = false;
            last_polled = Clock::now();
            if (deferred_error)
                std::rethrow_exception(std::exchange(deferred_error, nullptr));
            if (!m) {
                if (batch.empty() || Clock::now() >= deadline || stop_requests.load())
                    return;
                continue;
            }
            if (m->err) {
                kafka->consumer_error(*m);
                if (batch.empty())
                    return;
                continue;
            }
            auto* ps = ledger.find(kafka::GroupMember::topic_of(*m), m->partition);
            if (PartitionLedger::admit(ps, m->offset) != Admission::take)
                continue; // not ours, or fetched before a rewind: it comes again
            Item it;
            kafka::GroupMember::read(*m, it.record);
            it.part = ps;
            it.msg = std::move(m);
            metrics.in_flight_records.add(1);
            metrics.in_flight_bytes.add(static_cast<std::int64_t>(it.bytes()));
            if (!parking.empty() && parking.parked(ps, it.record.key)) {
                park(std::move(it)); // behind a failed record of its key
                count_parked();
                continue;
            }
            fill_bytes += it.bytes();
            if (batch.empty())
                deadline = Clock::now() + cfg.max_batch_wait;
            batch.push_back(std::move(it));
            if (stop_requests.load())
                return;
        }
    }

    // The in-flight gauges after records left the batch.
    void count_in_flight()
    {
        std::int64_t bytes = static_cast<std::int64_t>(parking.bytes());
        for (const auto* items : {&batch, &running})
            for (const auto& it : *items)
                bytes += static_cast<std::int64_t>(it.bytes());
        metrics.in_flight_records.set(static_cast<std::int64_t>(batch.size() + running.size() + parking.records()));
        metrics.in_flight_bytes.set(bytes);
        count_parked();
    }

    void count_parked()
    {
        metrics.parked_records.set(static_cast<std::int64_t>(parking.records()));
        metrics.parked_keys.set(static_cast<std::int64_t>(parking.keys()));
    }

    // ---- per-key parking (Ordering::key) ------------------------------------

    void park(Item&& it)
    {
        metrics.parked.add();
        parking.add(std::move(it));
    }

    // After a merge: each key a worker held waits out its retry backoff, and
    // its records in the next batch wait with it (the running batch's are
    // parked as the merge goes over them).
    void park_keys(const Holds& holds)
    {
        if (holds.keys().empty())
            return;
        const auto now = Clock::now();
        for (const auto& [key, h] : holds.keys())
            if (ledger.owns(key.first))
                parking.hold(key.first, key.second, now + ledger.retry_backoff(h.failures));
        auto waits = [&](const Item& it) { return parking.parked(it.part, it.record.key); };
        auto first = std::stable_partition(batch.begin(), batch.end(), [&](const Item& it) { return !waits(it); });
        for (auto i = first; i != batch.end(); ++i)
            park(std::move(*i));
        batch.erase(first, batch.end());
    }

    // Past the parking bound, a partition is held as a whole, as without
    // parking: rewound to its first parked record and paused for the retry
    // backoff; its parked records come again from Kafka. Runs with no batch
    // in the workers' hands (a rewind must not meet records still running).
    void bound_parking()
    {
        if (!parking.over())
            return;
        while (parking.over()) {
            PartitionState* fullest = parking.fullest();
            if (!fullest)
                break;
            const auto first = *fullest->parked.begin();
            const int failures = std::max(1, ledger.attempt_of(*fullest, first) - 1);
            metrics.parking_overflows.add();
            say(log, LogLevel::warning, coordinates(fullest->tp.topic, fullest->tp.partition, first),
                "{} records are parked behind failed keys, more than fit (max_prefetch_records / 2 = {}, "
                "max_prefetch_bytes / 2 = {}); {}/{} is held as a whole: rewound to {} and paused for the retry "
                "backoff",
                parking.records(), std::max<std::size_t>(1, cfg.max_prefetch_records / 2),
                std::max<std::size_t>(1, cfg.max_prefetch_bytes / 2), fullest->tp.topic, fullest->tp.partition, first);
            parking.drop(fullest);
            Holds hold;
            hold.add(fullest, first, failures);
            apply_holds(hold);
            batch.erase(std::remove_if(batch.begin(), batch.end(), [&](const Item& it) { return held(hold, it); }),
                        batch.end());
        }
        count_in_flight();
    }

    std::size_t worker_of(const Item& it) const
    {
        if (workers.size() == 1)
            return 0;
        if (cfg.ordering == Ordering::key && it.record.key)
            return std::hash<std::string_view>{}(*it.record.key) % workers.size();
        return it.part->worker % workers.size();
    }

    // ---- the workers ------------------------------------------------------------

    // Hands `batch` (decoded) to the workers. Runs when none is in their
    // hands, so their connections are free for the reconcile hook.
    void launch()
    {
        std::swap(batch, running);
        run_bank = fill_bank;
        fill_bank = (fill_bank + 1) % Stage::banks;
        metrics.consumed.add(running.size());
        batch_deadline = Clock::now() + batch_budget;
        const Holds holds = claims.screen(intake, workers.front(), running);
        for (auto& w : workers)
            w.reset(holds);
        for (std::size_t i = 0; i < running.size(); ++i)
            if (running[i].state == ItemState::pending)
                workers[worker_of(running[i])].items.push_back(i);

        auto work = [this](std::size_t n) {
            auto& w = workers[n];
            if (w.items.empty())
                return;
            try {
                claims.run(w, running, run_bank, batch_deadline);
            } catch (...) {
                w.failed = true;
                w.error = std::current_exception();
            }
        };
        // Always on the pool, also with one worker and no pipeline: the poll
        // thread stays free to keep the membership during a long handler call.
        running_done = false;
        pool->start(workers.size(), work, [this] {
            running_done = true;
            if (polling)
                kafka->wake_poll(); // a poll waiting for records returns now
        });
    }

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
    void await_workers()
    {
        if (pool->wait_until(last_polled + keepalive_after))
            return;
        const auto since = Clock::now();
        metrics.long_call_waits.add();
        say(log, LogLevel::info, {},
            "a handler call has run past the keep-alive point ({} ms after the last poll); the assignment is paused "
            "and polled until it returns, so this member stays in the group",
            keepalive_after.count());
        keepalive_paused = true;
        kafka->pause_assignment(true);
        bool cut = false;
        while (!pool->wait_until(Clock::now())) {
            // Not gated by abandon_running: a revoke may have abandoned the
            // batch before, while its calls still block on PostgreSQL.
            if (!cut && forced()) {
                abandon_running = true;
                cut = true;
                cut_for_stop();
            }
            auto m = kafka->poll(milliseconds(100)); // rebalances are served in here
            last_polled = Clock::now();
            if (m && m->err) {
                kafka->consumer_error(*m);
            } else if (m) {
                // Fetched before the pause: it comes again after the resume.
                auto* ps = ledger.find(kafka::GroupMember::topic_of(*m), m->partition);
                if (PartitionLedger::admit(ps, m->offset) == Admission::take)
                    rewind(*ps, m->offset);
            }
        }
        keepalive_paused = false;
        if (!db_pause)
            set_db_pause(false); // resumes all but partitions waiting out a retry backoff
        say(log, LogLevel::info, {}, "the long handler call returned after {} ms of polling; the assignment is resumed",
            std::chrono::duration_cast<milliseconds>(Clock::now() - since).count());
    }

    // A forced stop during a call that does not return: the workers'
    // connections are cut, so a call blocked on PostgreSQL (a frozen server,
    // a handler's statement waiting on a lock) fails at once and its
    // transaction rolls back (on the server, when it notices). A handler
    // blocked elsewhere is still waited for.
    void cut_for_stop()
    {
        std::size_t cut = 0;
        for (auto& w : workers)
            if (w.watch.cut())
                ++cut;
        say(log, LogLevel::warning, {},
            "stop forced during a call that has not returned: its transaction rolls back; {} PostgreSQL "
            "connection(s) cut so that a call blocked on PostgreSQL returns now",
            cut);
    }

    // Waits for the batch in the workers' hands and takes its results: holds
    // and rewinds, positions, counters, the offset commit when it is due.
    // Records of `batch` on a partition rewound here are dropped: they come
    // again after the records the running batch gave back.
    void finish_running()
    {
        if (running.empty())
            return;
        if (!pool->wait_until(Clock::now()))
            await_workers();
        // The states of partitions revoked while the batch ran go with it.
        struct Release {
            Impl& self;
            ~Release()
            {
                self.ledger.release_retired();
                self.abandon_running = false;
            }
        } release{*this};

        // Merge: a partition stops at the earliest hold of any worker, and at
        // the first unfinished record of a worker whose transaction did not commit.
        Holds holds;
        BatchInfo info;
        bool any_failed = false;
        std::exception_ptr error;
        for (auto& w : workers) {
            holds.merge(w.holds);
            if (w.failed) {
                any_failed = any_failed || !(w.fenced || (w.abandoned && abandon_running));
                if (w.error && !error)
                    error = w.error;
                for (std::size_t i : w.items)
                    if (running[i].state != ItemState::done)
                        holds.add(running[i].part, running[i].record.offset, 0);
                if (w.lost_connection)
                    w.disconnect();
                continue;
            }
            info.records += w.info.records;
            info.claimed += w.info.claimed;
            info.duplicates += w.info.duplicates;
            for (const auto& [ps, next] : w.stored)
                ps->stored_next = std::max(ps->stored_next, next);
        }
        apply_holds(holds);
        pause_fenced();
        if (!holds.empty())
            batch.erase(std::remove_if(batch.begin(), batch.end(),
                                       [&](const Item& it) { return holds.covers(it.part, it.record.offset); }),
                        batch.end());
        park_keys(holds);
        if (any_failed && !forced())
            db_hold();
        if (error) {
            running.clear();
            count_in_flight();
            std::rethrow_exception(error);
        }

        const auto committed_at = Clock::now();
        if (info.records) {
            metrics.db_commits.add();
            metrics.batch_records.observe(static_cast<double>(info.records));
            metrics.claimed.add(info.claimed);
            metrics.duplicates.add(info.duplicates);
            if (cfg.hooks.after_db_commit) {
                try {
                    cfg.hooks.after_db_commit(info); // may throw: then nothing below happens
                } catch (...) {
                    running.clear();
                    count_in_flight();
                    throw;
                }
            }
            if (outbox_relay && info.claimed)
                outbox_relay->wake(); // handlers may have enqueued: publish now, not at the next poll
        }
        std::set<PartitionState*> moved;
        for (auto& it : running) {
            if (holds.covers(it.part, it.record.offset) || !ledger.owns(it.part))
                continue;
            if (held(holds, it)) {
                park(std::move(it)); // its key waits out the backoff
                continue;
            }
            it.state = ItemState::done;
            ledger.complete(*it.part, it.record.offset);
            moved.insert(it.part);
        }
        for (auto* ps : moved)
            PartitionLedger::trim(*ps);
        running.clear();
        count_in_flight();
        if (positions && !positions_after_merge()) {
            // Progress no claim transaction stored (records settled before
            // the handlers: dead letters, reconcile skips, the dedup-horizon
            // guard) is stored on its own before Kafka hears of it, so that a
            // stored position behind Kafka's committed offset only means
            // commits PostgreSQL lost (see StoredPositions::acquire()).
            for (auto it = moved.begin(); it != moved.end();)
                it = (*it)->position() > (*it)->stored_next ? std::next(it) : moved.erase(it);
        }
        if (positions && !moved.empty()) {
            const auto stored = positions->store(workers.front(), moved);
            if (stored == StoredPositions::Stored::fenced)
                pause_fenced();
            if (stored != StoredPositions::Stored::yes)
                return; // not stored: Kafka must not get ahead of the database either
        }
        if (info.records && !uncommitted_since)
            uncommitted_since = committed_at;
        if (committed_at >= next_commit_at)
            flush_commits();
    }

    // Nothing of the batch is processed (PostgreSQL unavailable): every
    // partition goes back to its first record.
    void rewind_batch()
    {
        Holds holds;
        for (const auto& it : batch)
            holds.add(it.part, it.record.offset, 0);
        apply_holds(holds);
        batch.clear();
        count_in_flight();
    }

    // ---- the circuit breaker ------------------------------------------------

    // Between batches (none in the workers' hands): carries out what the
    // circuit decided while the last one ran, and what time decides. False
    // while it is open: nothing may be launched.
    bool circuit_ready()
    {
        if (!circuit.enabled())
            return true;
        const auto now = Clock::now();
        if (metrics.circuit_open.get() != 0) {
            metrics.circuit_open_ms.add(
                static_cast<std::uint64_t>(std::chrono::duration_cast<milliseconds>(now - circuit_counted).count()));
            circuit_counted = now;
        }
        if (probe_running && running.empty()) {
            probe_running = false;
            settle_probe(now);
        }
        if (const auto e = circuit.take_opened())
            circuit_opened(*e, now);
        if (circuit.probe_due(now)) {
            set_circuit_pause(false); // all but partitions waiting out a retry backoff (or PostgreSQL)
            batch_limit = std::max<std::size_t>(1, std::min(cfg.max_batch, cfg.circuit_breaker.probe_records));
            say(log, LogLevel::info, {},
                "circuit breaker probing, {} ms after it opened (its backoff is over): the assignment is resumed "
                "for one batch of at most {} records",
                std::chrono::duration_cast<milliseconds>(now - circuit_since).count(), batch_limit);
            return false; // what was polled while paused goes back: the probe is polled afresh
        }
        return !circuit_pause;
    }

    void circuit_opened(const Circuit::Evidence& e, Clock::time_point now)
    {
        metrics.circuit_opened.add();
        metrics.circuit_open.set(1);
        circuit_counted = circuit_since = now;
        ledger.forgive_failures(); // the failures that showed the outage were not the records' either
        circuit_hold();
        say(log, LogLevel::warning, error_field(e.last_error),
            "circuit breaker open: {} of {} handler attempts failed within {} ms, on {} or more keys in {} or more "
            "partitions: taken for an outage, not the records' fault. The assignment is paused and rewound for {} "
            "ms, then a probe batch runs; failures meanwhile do not count toward max_attempts (nor do those so "
            "far). Last error: {}",
            e.failures, e.attempts, e.span.count(), e.keys, e.partitions, e.wait.count(), e.last_error);
    }

    void settle_probe(Clock::time_point now)
    {
        const auto p = circuit.settle_probe(now);
        using Outcome = Circuit::Probe::Outcome;
        if (p.outcome == Outcome::closed) {
            metrics.circuit_open.set(0);
            batch_limit = cfg.max_batch;
            say(log, LogLevel::info, {},
                "circuit breaker closed after {} ms: {} handler call(s) of the probe succeeded ({} failed); the "
                "assignment runs as before, and failures count toward max_attempts again",
                p.open_for.count(), p.successes, p.failures);
        } else if (p.outcome == Outcome::reopened) {
            circuit_hold();
            say(log, LogLevel::warning, error_field(p.last_error),
                "circuit breaker probe failed ({} handler call(s) failed, none succeeded): open again, the next "
                "probe in {} ms. Last error: {}",
                p.failures, p.wait.count(), p.last_error);
        }
        // unsettled (duplicates only, or nothing polled): the next batch probes again
    }

    // The whole assignment waits, paused. Parked keys go back to Kafka: their
    // partitions are rewound to the first parked record, and what `batch`
    // holds from there on goes too (rewound later to a further offset, the
    // partition would skip the records in between).
    void circuit_hold()
    {
        Holds holds;
        for (auto& [tp, ps] : ledger)
            if (!ps.parked.empty()) {
                holds.add(&ps, *ps.parked.begin(), 0);
                parking.drop(&ps);
            }
        apply_holds(holds);
        if (!holds.empty())
            batch.erase(std::remove_if(batch.begin(), batch.end(),
                                       [&](const Item& it) { return holds.covers(it.part, it.record.offset); }),
                        batch.end());
        count_in_flight();
        set_circuit_pause(true);
    }

    void set_circuit_pause(bool pause)
    {
        circuit_pause = pause;
        set_db_pause(db_pause); // pauses or resumes the assignment for both
    }

    // ---- lifecycle --------------------------------------------------------

    void start()
    {
        workers = std::vector<Worker>(cfg.workers);
        // A hand-over per record costs two thread wake-ups, more than the
        // overlap saves: max_batch = 1 runs one record after the other.
        pipelined = cfg.pipeline && cfg.max_batch > 1;
        pool = std::make_unique<WorkerPool>(cfg.workers);
        try {
            for (std::size_t i = 0; i < workers.size(); ++i)
                connect(workers[i], i == 0);
        } catch (const ConfigError& e) {
            throw ConfigError(secrets(e.what()));
        } catch (const DatabaseError& e) {
            throw DatabaseError(secrets(e.what()));
        } catch (const std::exception& e) {
            throw DatabaseError(secrets(fmt::format("cannot start: PostgreSQL: {}", e.what())));
        }
        if (cfg.retention.maintenance)
            maintenance = std::make_unique<MaintenanceRunner>(cfg.postgres, store, cfg.retention, log);
        if (cfg.oldest_claim_refresh.count() > 0)
            claim_age = std::make_unique<ClaimAgeMonitor>(cfg.postgres, store, cfg.group_id, cfg.oldest_claim_refresh,
                                                          metrics.oldest_claim_unix_ms, log);
        if (cfg.outbox && cfg.outbox->relay) {
            auto oc = *cfg.outbox;
            auto user_hook = oc.relay_options.hooks.after_cycle;
            oc.relay_options.hooks.after_cycle = [this, user_hook](std::size_t published, std::size_t failed) {
                metrics.outbox_published.add(published);
                metrics.outbox_failures.add(failed);
                if (user_hook)
                    user_hook(published, failed);
            };
            outbox_relay = OutboxRelay::for_consumer(oc, cfg.postgres, cfg.brokers, cfg.kafka, log);
            outbox_relay->start();
        }
        kafka = std::make_unique<kafka::GroupMember>(cfg, *this, metrics, log, secrets);
        keepalive_after = std::min(milliseconds(10000), kafka->max_poll_interval() / 5);
        revoke_wait = std::min(cfg.shutdown_timeout, kafka->max_poll_interval() / 2);
        if (cfg.max_batch_duration.count() > 0)
            batch_budget = cfg.max_batch_duration;
        else // 40% of max.poll.interval.ms: a batch ends well before the group would drop this member
            batch_budget = std::max(milliseconds(100), kafka->max_poll_interval() * 2 / 5);
    }

    void run()
    {
        start();
        while (stop_requests.load() == 0) {
            housekeeping();
            kafka->check_prefetch(true, 0, 0);
            fill_batch(); // pipeline: meanwhile the workers process the running batch
            kafka->check_prefetch(false, batch.size(), fill_bytes);
            if (!batch.empty())
                intake.decode(batch, fill_bank);
            finish_running();
            bound_parking();
            const bool db_ready = ensure_db();
            const bool circuit_closed = circuit_ready();
            if (batch.empty())
                continue;
            if (!db_ready || !circuit_closed) {
                rewind_batch();
                continue;
            }
            probe_running = circuit.state() == Circuit::State::probing;
            launch();
            if (!pipelined)
                finish_running();
        }
        shutdown();
    }

    void shutdown()
    {
        // Positions of batches already committed in PostgreSQL are always safe
        // to commit, also on a forced stop; unfinished work is not committed.
        finish_running();
        batch.clear();
        count_in_flight();
        kafka->commit(ledger.take_commits(nullptr), false, std::min(sync_commit_bound, cfg.shutdown_timeout));
        say(log, LogLevel::info, {}, "closing consumer{}", forced() ? " (forced)" : "");
        kafka->close(cfg.shutdown_timeout);
        kafka.reset();
        maintenance.reset();
        claim_age.reset();
        outbox_relay.reset();
        workers.clear();
    }
};

Engine::Engine(ConsumerConfig config, Stage& stage)
{
    config.validate();
    impl_ = std::make_unique<Impl>(std::move(config), stage);
}

Engine::~Engine() = default;

void Engine::run()
{
    impl_->run();
}

void Engine::stop() noexcept
{
    impl_->stop_requests.fetch_add(1);
}

const Metrics& Engine::metrics() const noexcept
{
    return impl_->metrics;
}

} // namespace idemkafka::detail
