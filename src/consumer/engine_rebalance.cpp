// The engine and the group: assignments and revocations (inside poll),
// rewinds, seeks and fences of partitions, and per-key parking.

#include "consumer/engine_impl.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace idemkafka::detail {

bool Engine::Impl::assigned(std::vector<std::pair<TopicPartition, std::int64_t>>& start)
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
            // Paused until verified; meanwhile a placeholder start that asks
            // nothing of the group coordinator (librdkafka's own fetch of the
            // committed offset, refused once, leaves a partition never
            // fetched): verify() seeks each to its start.
            for (auto& [tp, offset] : start)
                offset = kafka::offset_end;
            for (const auto& tp : tps)
                if (auto* ps = ledger.find(tp.topic, tp.partition))
                    ps->stored.verified = false;
            if (!gates.db.closed())
                db_hold();
        }
    }
    return gates.assigned_paused();
}

std::optional<std::vector<OffsetCommit>> Engine::Impl::inherit_failures(const std::vector<TopicPartition>& tps)
{
    std::vector<OffsetCommit> committed;
    committed.reserve(tps.size());
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
        ps->lag.start_offset = c.offset;
        ps->lag.start_known = true;
        const auto failures = parse_failures_metadata(c.metadata);
        if (failures.empty())
            continue;
        const auto n = ledger.inherit_failures(*ps, failures, c.offset);
        if (n)
            say(log, LogLevel::info, coordinates(c.tp.topic, c.tp.partition, c.offset),
                "{}/{}: {} record(s) from offset {} on failed before this assignment (up to {} times); their "
                "attempts go on from there",
                c.tp.topic, c.tp.partition, n, c.offset,
                std::max_element(failures.begin(), failures.end(), [](const auto& a, const auto& b) {
                    return a.second < b.second;
                })->second);
    }
    return committed;
}

void Engine::Impl::revoked(const std::set<TopicPartition>& tps, bool lost)
{
    // Records polled for revoked partitions but not processed yet are
    // dropped: their offsets were never committed, so the new owner reads them.
    room.drop_if([&](const Item& it) { return tps.count(it.part->tp) > 0; });
    count_in_flight();
    // The units with records of the revoked partitions first: their
    // positions belong to what is revoked. They are waited for (at most
    // revoke_wait); past that their transactions are abandoned (rolled back
    // when their handler calls return), and the states they point to stay
    // in memory until they are merged. Other units go on.
    std::vector<std::size_t> touching;
    for (std::size_t n = 0; n < crew.workers.size(); ++n)
        if (dispatcher.busy(n) && std::any_of(dispatcher.unit(n).begin(), dispatcher.unit(n).end(),
                                              [&](const Item& it) { return tps.count(it.part->tp) > 0; }))
            touching.push_back(n);
    if (!touching.empty()) {
        // What PostgreSQL holds already is committed before the wait: sent
        // after a wait the group did not sit out, it would carry a
        // generation the coordinator has left (ILLEGAL_GENERATION), which
        // librdkafka answers by dropping the whole assignment, the
        // partitions this member keeps included.
        if (!lost && !signals.fault.commits_stopped())
            kafka->commit(ledger.take_commits(&tps), false, sync_commit_bound);
        const auto deadline = Clock::now() + gates.keepalive.revoke_wait();
        for (auto n : touching)
            crew.pool->wait_until(n, deadline);
    }
    merge_in_callback();
    touching.erase(std::remove_if(touching.begin(), touching.end(), [&](std::size_t n) { return !dispatcher.busy(n); }),
                   touching.end());
    if (!touching.empty())
        abandon_for_revoke(touching, tps.size());
    if (!lost && !signals.fault.commits_stopped())
        kafka->commit(ledger.take_commits(&tps), false, sync_commit_bound);
    // Parked records go too: the position committed above stays before them.
    for (const auto& tp : tps)
        if (auto* ps = ledger.find(tp.topic, tp.partition))
            parking.drop(ps);
    dead_letters.forget(tps); // their records' next tries are the new owner's
    ledger.revoke(tps, !touching.empty());
    count_in_flight();
}

void Engine::Impl::abandon_for_revoke(const std::vector<std::size_t>& touching, std::size_t revoked)
{
    bool first = false;
    for (auto n : touching) {
        first = first || !crew.workers[n].revoked.exchange(true);
        dispatcher.retire(n);
    }
    if (!first)
        return;
    metrics.revoke_abandons.add();
    say(log, LogLevel::warning, {},
        "a rebalance revoked {} partition(s) while a handler call of {} unit(s) of work with their records has run "
        "past the revoke wait ({} ms): their transactions roll back when their calls return, and the new owners "
        "process those records (the claims keep their effects in PostgreSQL once; side effects outside it may "
        "happen twice)",
        revoked, touching.size(), gates.keepalive.revoke_wait().count());
}

void Engine::Impl::merge_in_callback() noexcept
{
    try {
        merge_finished();
    } catch (...) {
        signals.fault.keep(std::current_exception());
    }
}

void Engine::Impl::commit_failed(const TopicPartition& tp, std::int64_t offset)
{
    ledger.commit_failed(tp.topic, tp.partition, offset);
}

void Engine::Impl::rewind(PartitionState& ps, std::int64_t offset)
{
    PartitionLedger::rewind(ps, offset);
    parking.drop_from(&ps, offset); // they come again from Kafka
    dispatcher.drop_from(&ps, offset);
    seek(ps);
}

void Engine::Impl::seek(PartitionState& ps)
{
    if (kafka->seek(ps.tp, ps.rewind.resume_from) != kafka::GroupMember::SeekResult::failed)
        PartitionLedger::seek_sent(ps);
}

void Engine::Impl::apply_holds(const Holds& holds)
{
    for (const auto& action : ledger.apply(holds, Clock::now())) {
        parking.drop_from(action.ps, action.ps->rewind.resume_from); // they come again from Kafka
        dispatcher.drop_from(action.ps, action.ps->rewind.resume_from);
        seek(*action.ps);
        if (action.pause)
            kafka->pause(action.ps->tp, true);
    }
}

void Engine::Impl::pause_fenced()
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

void Engine::Impl::park(Item&& it)
{
    it.lease.reset(); // decoded again when it runs
    metrics.parked.add();
    parking.add(std::move(it));
}

void Engine::Impl::park_keys(const Holds& holds)
{
    if (holds.keys().empty())
        return;
    const auto now = Clock::now();
    for (const auto& [key, h] : holds.keys())
        if (ledger.owns(key.first))
            parking.hold(key.first, key.second, now + std::max(ledger.retry_backoff(h.failures), h.wait));
    for (auto& it : room.take_if([&](const Item& it) { return parking.parked(it.part, it.record.key); }))
        park(std::move(it));
}

void Engine::Impl::bound_parking()
{
    if (!parking.over())
        return;
    drain(); // its rewinds must not meet a running unit
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
        room.drop_if([&](const Item& it) { return held(hold, it); });
    }
    count_in_flight();
}

} // namespace idemkafka::detail
