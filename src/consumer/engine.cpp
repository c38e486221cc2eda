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
#include <utility>

#include <fmt/format.h>

#include "consumer/engine_impl.hpp"

namespace idemkafka::detail {

Engine::Impl::Impl(ConsumerConfig c, Stage& s)
    : cfg(std::move(c)), stage(s),
      secrets(
          secrets_of(cfg.postgres, {&cfg.kafka, &cfg.dead_letter_kafka, cfg.outbox ? &cfg.outbox->kafka : nullptr})),
      log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}}, secrets)),
      store(cfg.schema, cfg.table),
      offset_store(cfg.offsets_in_database ? std::make_optional<OffsetStore>(cfg.schema, cfg.offsets_table)
                                           : std::nullopt)
{
    if (offset_store)
        positions.emplace(cfg, *offset_store, ledger, claims, metrics, log);
}

Engine::Impl::~Impl()
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

bool Engine::Impl::forced() noexcept
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

void Engine::Impl::flush_commits()
{
    const auto now = Clock::now();
    kafka->commit(ledger.take_commits(nullptr), true, sync_commit_bound);
    if (uncommitted_since)
        metrics.commit_delay_seconds.observe(std::chrono::duration<double>(now - *uncommitted_since).count());
    uncommitted_since.reset();
    next_commit_at = now + cfg.commit_interval;
}

void Engine::Impl::housekeeping()
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

void Engine::Impl::fill_batch()
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

void Engine::Impl::count_in_flight()
{
    std::int64_t bytes = static_cast<std::int64_t>(parking.bytes());
    for (const auto* items : {&batch, &running})
        for (const auto& it : *items)
            bytes += static_cast<std::int64_t>(it.bytes());
    metrics.in_flight_records.set(static_cast<std::int64_t>(batch.size() + running.size() + parking.records()));
    metrics.in_flight_bytes.set(bytes);
    count_parked();
}

void Engine::Impl::count_parked()
{
    metrics.parked_records.set(static_cast<std::int64_t>(parking.records()));
    metrics.parked_keys.set(static_cast<std::int64_t>(parking.keys()));
}

void Engine::Impl::launch()
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

void Engine::Impl::finish_running()
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

    const Merged merged = merge_workers();
    const Holds& holds = merged.holds;
    apply_holds(holds);
    pause_fenced();
    if (!holds.empty())
        batch.erase(std::remove_if(batch.begin(), batch.end(),
                                   [&](const Item& it) { return holds.covers(it.part, it.record.offset); }),
                    batch.end());
    park_keys(holds);
    if (merged.any_failed && !forced())
        db_hold();
    if (merged.error) {
        running.clear();
        count_in_flight();
        std::rethrow_exception(merged.error);
    }

    const auto committed_at = Clock::now();
    if (merged.info.records)
        committed(merged.info);
    if (!store_positions(complete_running(holds)))
        return; // not stored: Kafka must not get ahead of the database either
    if (merged.info.records && !uncommitted_since)
        uncommitted_since = committed_at;
    if (committed_at >= next_commit_at)
        flush_commits();
}

Engine::Impl::Merged Engine::Impl::merge_workers()
{
    Merged m;
    for (auto& w : workers) {
        m.holds.merge(w.holds);
        if (w.failed) {
            m.any_failed = m.any_failed || !(w.fenced || (w.abandoned && abandon_running));
            if (w.error && !m.error)
                m.error = w.error;
            for (std::size_t i : w.items)
                if (running[i].state != ItemState::done)
                    m.holds.add(running[i].part, running[i].record.offset, 0);
            if (w.lost_connection)
                w.disconnect();
            continue;
        }
        m.info.records += w.info.records;
        m.info.claimed += w.info.claimed;
        m.info.duplicates += w.info.duplicates;
        for (const auto& [ps, next] : w.stored)
            ps->stored_next = std::max(ps->stored_next, next);
    }
    return m;
}

void Engine::Impl::committed(const BatchInfo& info)
{
    metrics.db_commits.add();
    metrics.batch_records.observe(static_cast<double>(info.records));
    metrics.claimed.add(info.claimed);
    metrics.duplicates.add(info.duplicates);
    if (cfg.hooks.after_db_commit) {
        try {
            cfg.hooks.after_db_commit(info); // may throw: then nothing after it happens
        } catch (...) {
            running.clear();
            count_in_flight();
            throw;
        }
    }
    if (outbox_relay && info.claimed)
        outbox_relay->wake(); // handlers may have enqueued: publish now, not at the next poll
}

std::set<PartitionState*> Engine::Impl::complete_running(const Holds& holds)
{
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
    return moved;
}

bool Engine::Impl::store_positions(std::set<PartitionState*> moved)
{
    if (!positions)
        return true;
    if (!positions_after_merge()) {
        // Progress no claim transaction stored (records settled before
        // the handlers: dead letters, reconcile skips, the dedup-horizon
        // guard) is stored on its own before Kafka hears of it, so that a
        // stored position behind Kafka's committed offset only means
        // commits PostgreSQL lost (see StoredPositions::acquire()).
        for (auto it = moved.begin(); it != moved.end();)
            it = (*it)->position() > (*it)->stored_next ? std::next(it) : moved.erase(it);
    }
    if (moved.empty())
        return true;
    const auto stored = positions->store(workers.front(), moved);
    if (stored == StoredPositions::Stored::fenced)
        pause_fenced();
    return stored == StoredPositions::Stored::yes;
}

void Engine::Impl::rewind_batch()
{
    Holds holds;
    for (const auto& it : batch)
        holds.add(it.part, it.record.offset, 0);
    apply_holds(holds);
    batch.clear();
    count_in_flight();
}

void Engine::Impl::start()
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

void Engine::Impl::run()
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

void Engine::Impl::shutdown()
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
