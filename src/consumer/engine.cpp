// The consumer's run loop: it wires the pieces together and hands units of
// work from the poll thread to free workers, with no barrier between them.
//
// A record's path, in order:
//  1. run() -> fill_room(): kafka::GroupMember::poll() returns it; the
//     PartitionLedger admits it (records fetched before a rewind are stale)
//     and takes it: until its outcome is merged the committed position stays
//     at or before it. It waits in the WaitingRoom.
//  2. dispatch(): a free worker takes the next unit: waiting records whose
//     lane (their partition; with Ordering::key, their key in it) is in no
//     busy unit, in poll order, up to unit_cap. Records behind a busy lane
//     wait, so a lane's records run in order, one unit at a time.
//  3. submit(): Intake::decode() into the worker's Stage slots; then, on
//     the worker, ClaimTransaction::screen(): Intake::screen() (settled
//     dead letters, the dedup-horizon guard) and the reconcile hook on the
//     worker's idle connection; poison records go to the DeadLetterer.
//  4. ClaimTransaction::run() on the worker: claim, handler calls, stored
//     positions, COMMIT; a failing record is held (retried) or dead-lettered.
//  5. merge_unit(), as soon as the unit ends (others still run): its holds
//     rewind held partitions (seek, and a pause for a retry backoff; records
//     of other units from the rewind point on are dropped: they come again)
//     and the ledger moves the position past every finished record. With
//     Ordering::key a failed record parks only its key: its records wait in
//     Parking, the partition's other keys go on, and the position stays at
//     the first parked record; when the backoff is over fill_room() takes
//     them again.
//  6. flush_commits(): the ledger's moved positions go to Kafka as an offset
//     commit (kafka::GroupMember::commit); a failed commit is sent again.
//     The ledger hands out only positions before every unfinished record.
// Rebalances arrive inside poll() through kafka::GroupEvents: the units with
// records of revoked partitions are finished first, then the ledger assigns
// or forgets partitions. The circuit breaker (Circuit) hears of every handler
// attempt in step 4; when failures across keys look like an outage it opens,
// the workers give their records back uncounted, and circuit_ready() drains
// the units, pauses the whole assignment, rewinds it, and later lets one
// probe unit through.

#include "idemkafka/consumer.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "consumer/engine_impl.hpp"

namespace idemkafka::detail {

Engine::Impl::Impl(ConsumerConfig c, Stage& s)
    : cfg(std::move(c)), stage(s),
      secrets(
          secrets_of(cfg.postgres, {&cfg.kafka, &cfg.dead_letter_kafka, cfg.outbox ? &cfg.outbox->kafka : nullptr})),
      log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}}, secrets))
{
    if (tables.offsets)
        positions.emplace(cfg, *tables.offsets, ledger, claims, metrics, log);
}

Engine::Impl::~Impl()
{
    // run() left by an exception, maybe with units in the workers' hands:
    // let them end, and take nothing of them (committing nothing is always
    // safe). The close below serves the last revoke, which must find every
    // worker idle and no unit left to merge.
    abandon_units();
    room.clear();
    if (kafka) {
        // Leave the group without committing anything, as a crash would
        // (but without the session timeout).
        signals.fault.stop_commits();
        kafka->close(cfg.shutdown_timeout);
    }
}

void Engine::Impl::abandon_units() noexcept
{
    if (!crew.pool)
        return;
    crew.pool->wait_all();
    (void)crew.pool->take_done(); // ended: what they did is not merged
    for (std::size_t n = 0; n < dispatcher.workers(); ++n) {
        if (!dispatcher.busy(n))
            continue;
        if (kafka)
            release_lanes(n);
        free_worker(n);
    }
    signals.wake.clear();
    ledger.release_retired(); // the states of partitions revoked while the units ran
}

void Engine::Impl::flush_commits()
{
    const auto now = Clock::now();
    pacer.attempted(now);
    // The group is rebalancing (GroupMember::commits_held()): the positions
    // stay in the ledger for the first commit after it.
    if (kafka->commits_held())
        return;
    kafka->commit(ledger.take_commits(nullptr), true, sync_commit_bound);
    if (const auto waited = pacer.sent(now))
        metrics.commit_delay_seconds.observe(waited->count());
}

void Engine::Impl::housekeeping()
{
    const auto now = Clock::now();
    watch_calls(now);
    const bool tick = pacer.tick(now);
    if (tick) {
        metrics.loop_heartbeat_unix_ms.set(
            std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
        update_lag(ledger, *kafka, metrics);
        watch_fetch_stalls(ledger, *kafka, metrics, log, cfg.fetch_stall_after);
        if (const auto kept = sidecars.expired_partitions_kept())
            metrics.expired_partitions_kept.set(static_cast<std::int64_t>(*kept));
    }
    // Each tick also resends failed commits of an idle partition.
    if (pacer.due(now, tick))
        flush_commits();
    const auto due = ledger.due(now);
    for (auto* ps : due.seek)
        seek(*ps);
    if (!gates.assignment_held())
        for (auto* ps : due.resume)
            kafka->pause(ps->tp, false);
}

void Engine::Impl::fill_room()
{
    // Ordering::partition: once a busy partition has a unit's worth waiting,
    // its later records stay in the Kafka adapter's hands until its unit is
    // merged, so they do not fill the waiting room ahead of records that
    // could run. The waiting records of each partition are counted only once
    // the waiting room holds a unit's worth (no partition has one before).
    std::map<const PartitionState*, std::size_t> waiting_of;
    take_parked();
    // One clock read per poll: what the loop decides is in milliseconds
    // (max_batch_wait, the poll's timeout, the keepalive), a record takes
    // microseconds.
    auto now = Clock::now();
    while (!room.full()) {
        // A unit ended: merge it (and hand its worker the next one) first.
        // A worker ending from here on wakes the poll below.
        if (!signals.wake.begin_poll())
            return;
        // A free worker and records it may take: take what librdkafka holds
        // already, without waiting, then hand it out.
        milliseconds timeout = idle_poll;
        if (dispatch_due(now))
            timeout = milliseconds(0);
        else if (dispatcher.dirty() && !room.empty())
            timeout =
                std::min(idle_poll, std::max(milliseconds(0),
                                             std::chrono::ceil<milliseconds>(room.since() + cfg.max_batch_wait - now)));
        auto m = kafka->poll(timeout);
        signals.wake.end_poll();
        now = Clock::now();
        gates.keepalive.polled(now);
        signals.fault.rethrow();
        if (!m)
            return;
        if (m->err) {
            kafka->consumer_error(*m);
            if (room.empty())
                return;
            continue;
        }
        auto* ps = take_polled(std::move(m), now);
        if (ps && cfg.ordering == Ordering::partition) {
            if (!waiting_of.empty())
                ++waiting_of[ps];
            else if (ps->unit != 0 && room.size() >= dispatcher.unit_cap())
                for (const auto& it : room)
                    ++waiting_of[it.part];
            if (ps->unit != 0 && !waiting_of.empty() && waiting_of[ps] >= dispatcher.unit_cap())
                kafka->defer(ps->tp, true);
        }
        if (signals.stop.requested())
            return;
    }
}

void Engine::Impl::take_parked()
{
    // Parked keys whose backoff is over run first, in their order (not
    // while PostgreSQL is away: they would only be rewound).
    if (parking.empty() || gates.db.closed())
        return;
    const auto now = Clock::now();
    const auto first = room.add_from([&](std::vector<Item>& records) { parking.take_due(now, records); }, now);
    if (room.size() == first)
        return;
    for (auto i = first; i < room.size(); ++i)
        if (dispatcher.decode_ahead())
            dispatcher.decode(room[i]);
    dispatcher.changed();
    count_parked();
}

PartitionState* Engine::Impl::take_polled(kafka::MessagePtr m, Clock::time_point now)
{
    auto* ps = ledger.find(kafka::GroupMember::topic_of(*m), m->partition);
    if (PartitionLedger::admit(ps, m->offset) != Admission::take)
        return nullptr; // not ours, or fetched before a rewind: it comes again
    // Until its outcome is merged, the position stays at or before it.
    PartitionLedger::take(*ps, m->offset);
    Item it;
    kafka::GroupMember::read(*m, it.record);
    PartitionLedger::note_taken(*ps, m->offset, it.record.timestamp_ms);
    it.part = ps;
    it.msg = std::move(m);
    metrics.in_flight_records.add(1);
    metrics.in_flight_bytes.add(static_cast<std::int64_t>(it.bytes()));
    if (!parking.empty() && parking.parked(ps, it.record.key)) {
        park(std::move(it)); // behind a failed record of its key
        count_parked();
        return nullptr;
    }
    auto& waiting = room.add(std::move(it), now);
    if (dispatcher.decode_ahead())
        dispatcher.decode(waiting); // while the workers run
    dispatcher.changed();
    return ps;
}

void Engine::Impl::count_in_flight()
{
    const auto [unit_records, unit_bytes] = dispatcher.in_units();
    metrics.in_flight_records.set(static_cast<std::int64_t>(room.size() + parking.records() + unit_records));
    metrics.in_flight_bytes.set(static_cast<std::int64_t>(room.bytes() + parking.bytes() + unit_bytes));
    count_parked();
}

void Engine::Impl::count_parked()
{
    metrics.parked_records.set(static_cast<std::int64_t>(parking.records()));
    metrics.parked_keys.set(static_cast<std::int64_t>(parking.keys()));
}

void Engine::Impl::merge_finished()
{
    signals.wake.clear(); // a unit ending from here on is seen again
    for (auto n : crew.pool->take_done())
        merge_unit(n);
}

void Engine::Impl::drain()
{
    merge_finished();
    while (dispatcher.busy_units() > 0) {
        await_unit();
        merge_finished();
    }
}

void Engine::Impl::merge_unit(std::size_t n)
{
    auto& unit = dispatcher.unit(n);
    // However the merge ends, the worker is free, its lanes before the
    // holds: a parked key's records may run again at once.
    struct Release {
        Impl& self;
        std::size_t n;
        ~Release() { self.free_worker(n); }
    } release{*this, n};
    release_lanes(n);

    const Merged merged = merge_worker(n);
    const Holds& holds = merged.holds;
    apply_holds(holds);
    pause_fenced();
    if (!holds.empty())
        room.drop_if([&](const Item& it) { return holds.covers(it.part, it.record.offset); });
    park_keys(holds);
    if (merged.failed && !forced())
        db_hold();
    if (merged.error) {
        unit.clear();
        count_in_flight();
        std::rethrow_exception(merged.error);
    }

    const auto committed_at = Clock::now();
    for (const auto& info : merged.commits)
        committed(info);
    if (!store_positions(complete_unit(unit, holds), n))
        return; // not stored: Kafka must not get ahead of the database either
    if (!merged.commits.empty())
        pacer.db_committed(committed_at);
    if (pacer.due_after_merge(committed_at))
        flush_commits();
}

Engine::Impl::Merged Engine::Impl::merge_worker(std::size_t n)
{
    auto& w = crew.workers[n];
    const auto& unit = dispatcher.unit(n);
    Merged m;
    // A rewind that overtook records of the unit while it ran (another
    // unit's hold, with Ordering::key) dropped them from there on: the
    // unit's own holds at or after that point are not applied (rewinding the
    // partition forward, they would skip records that come again).
    std::map<const PartitionState*, std::int64_t> dropped_from;
    for (const auto& it : unit)
        if (it.dropped) {
            auto [d, fresh] = dropped_from.emplace(it.part, it.record.offset);
            if (!fresh)
                d->second = std::min(d->second, it.record.offset);
        }
    auto kept = [&](const PartitionState* ps, std::int64_t offset) {
        auto d = dropped_from.find(ps);
        return d == dropped_from.end() || offset < d->second;
    };
    for (const auto& [ps, h] : w.holds)
        if (kept(ps, h.offset))
            m.holds.add(ps, h.offset, h.failures, h.wait);
    for (const auto& [key, h] : w.holds.keys())
        if (kept(key.first, h.offset))
            m.holds.park(key.first, key.second ? std::optional<std::string_view>(*key.second) : std::nullopt, h.offset,
                         h.failures, h.wait);
    // What committed (with a transaction per record, also before a failed
    // one): counted, its hook called, its stored positions noted.
    m.commits = std::move(w.commits);
    for (const auto& [ps, next] : w.stored)
        ps->stored.next = std::max(ps->stored.next, next);
    if (w.failed) {
        m.failed = !(w.fenced || (w.abandoned && w.revoked));
        m.error = w.error;
        for (std::size_t i : w.items)
            if (unit[i].state != ItemState::done && !unit[i].dropped)
                m.holds.add(unit[i].part, unit[i].record.offset, 0);
        if (w.lost_connection)
            w.disconnect();
    }
    return m;
}

void Engine::Impl::committed(const BatchInfo& info)
{
    metrics.db_commits.add();
    metrics.batch_records.observe(static_cast<double>(info.records));
    metrics.claimed.add(info.claimed);
    metrics.duplicates.add(info.duplicates);
    if (cfg.hooks.after_db_commit)
        cfg.hooks.after_db_commit(info); // may throw: then nothing after it happens
    if (info.claimed)
        sidecars.wake_relay(); // handlers may have enqueued
}

std::set<PartitionState*> Engine::Impl::complete_unit(std::vector<Item>& unit, const Holds& holds)
{
    std::vector<PartitionState*> completed; // the partition of each completed record
    completed.reserve(unit.size());
    for (auto& it : unit) {
        if (it.dropped || holds.covers(it.part, it.record.offset) || !ledger.owns(it.part))
            continue;
        if (held(holds, it)) {
            park(std::move(it)); // its key waits out the backoff
            continue;
        }
        it.state = ItemState::done;
        ledger.complete(*it.part, it.record.offset);
        completed.push_back(it.part);
    }
    std::sort(completed.begin(), completed.end(), std::less<>());
    std::set<PartitionState*> moved(completed.begin(), std::unique(completed.begin(), completed.end()));
    for (auto* ps : moved)
        ledger.trim(*ps);
    unit.clear();
    count_in_flight();
    return moved;
}

bool Engine::Impl::store_positions(std::set<PartitionState*> moved, std::size_t n)
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
            it = (*it)->position() > (*it)->stored.next ? std::next(it) : moved.erase(it);
    }
    if (moved.empty())
        return true;
    if (!crew.workers[n].db) {
        db_hold(); // its connection was lost: stored after the reconnect, with the next merge
        return false;
    }
    const auto stored = positions->store(crew.workers[n], moved);
    if (stored == StoredPositions::Stored::fenced)
        pause_fenced();
    return stored == StoredPositions::Stored::yes;
}

void Engine::Impl::rewind_room()
{
    Holds holds;
    for (const auto& it : room)
        holds.add(it.part, it.record.offset, 0);
    apply_holds(holds);
    room.clear();
    count_in_flight();
}

void Engine::Impl::start()
{
    crew.workers = std::vector<Worker>(cfg.workers);
    // With several workers the waiting room holds two batches: records behind
    // a slow call's lanes wait there, and the others must still find room.
    const std::size_t full = cfg.max_batch * unit_batches(cfg);
    room.size_to(cfg.workers > 1 ? 2 * full : full);
    // Each worker has Stage slots of its own for its unit.
    const auto records = room.limit() + cfg.workers * dispatcher.unit_cap();
    dispatcher.reserve_slots(records);
    stage.reserve(records);
    crew.pool = std::make_unique<WorkerPool>(cfg.workers, [this] {
        if (signals.wake.ended())
            kafka->wake_poll(); // a poll waiting for records returns now
    });
    connect_at_start(secrets, [this] {
        for (std::size_t i = 0; i < crew.workers.size(); ++i)
            connect(crew.workers[i], i == 0);
    });
    sidecars.start(cfg, tables.claims, metrics, log);
    kafka = std::make_unique<kafka::GroupMember>(cfg, *this, metrics, log, secrets);
    gates.keepalive.configure(kafka->max_poll_interval(), cfg.shutdown_timeout);
    if (cfg.max_batch_duration.count() > 0)
        dispatcher.set_budget(cfg.max_batch_duration);
    else // 40% of max.poll.interval.ms: a unit ends well before the group would drop this member
        dispatcher.set_budget(std::max(milliseconds(100), kafka->max_poll_interval() * 2 / 5));
}

void Engine::Impl::run()
{
    start();
    while (!signals.stop.requested()) {
        housekeeping();
        merge_finished();
        kafka->check_prefetch(true, 0, 0);
        fill_room(); // meanwhile the workers run their units
        kafka->check_prefetch(false, room.size(), room.bytes());
        merge_finished();
        bound_parking();
        const bool db_ready = ensure_db();
        const bool circuit_closed = circuit_ready();
        if (room.empty())
            continue;
        if (!db_ready || !circuit_closed) {
            rewind_room();
            continue;
        }
        const bool sent = dispatch();
        if (!pipelined())
            drain();
        else if (!sent && room.full())
            await_unit(); // the waiting room is full and nothing in it may run yet
    }
    shutdown();
}

void Engine::Impl::shutdown()
{
    // Positions of units already committed in PostgreSQL are always safe
    // to commit, also on a forced stop; unfinished work is not committed.
    drain();
    room.clear();
    count_in_flight();
    kafka->commit(ledger.take_commits(nullptr), false, std::min(sync_commit_bound, cfg.shutdown_timeout));
    say(log, LogLevel::info, {}, "closing consumer{}", forced() ? " (forced)" : "");
    kafka->close(cfg.shutdown_timeout);
    kafka.reset();
    sidecars.stop();
    crew.workers.clear();
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
    impl_->signals.stop.request();
}

const Metrics& Engine::metrics() const noexcept
{
    return impl_->metrics;
}

} // namespace idemkafka::detail
