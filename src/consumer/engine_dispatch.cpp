// Handing out units of work: which waiting records a free worker takes (its
// lanes, its share), their Stage slots, the screening before its transaction.

#include "consumer/engine_impl.hpp"

#include <algorithm>
#include <cstdint>

namespace idemkafka::detail {

std::pair<PartitionState*, KeyId> Engine::Impl::lane_of(const Item& it) const
{
    if (cfg.ordering == Ordering::key)
        return {it.part, key_id(it.record.key)};
    return {it.part, KeyId()};
}

bool Engine::Impl::decode_ahead() const
{
    // Slots for the free workers' next units stay free: records that wait
    // without one are decoded when they are handed out.
    return slots->available() > (workers.size() - busy_units) * unit_cap;
}

bool Engine::Impl::decode(Item& it)
{
    const auto slot = slots->acquire();
    if (!slot)
        return false;
    it.slot = *slot;
    it.lease = SlotLease(*slots, *slot);
    intake.decode(it);
    return true;
}

bool Engine::Impl::dispatch_due() const
{
    if (!dispatch_dirty || batch.empty() || busy_units == workers.size())
        return false;
    // As a batch used to: a full unit, the waiting room full, the fill wait
    // over, or a worker just freed (hand it what there is rather than leave
    // PostgreSQL idle).
    return worker_freed || batch.size() >= unit_cap || batch.size() >= batch_limit ||
           fill_bytes >= cfg.max_batch_bytes || Clock::now() >= waiting_since + cfg.max_batch_wait ||
           stop_requests.load() != 0;
}

bool Engine::Impl::dispatch()
{
    if (!dispatch_due())
        return false;
    dispatch_dirty = false;
    // The circuit's probe runs alone, as one unit of at most batch_limit records.
    const bool probe = circuit.state() == Circuit::State::probing;
    if (probe && busy_units > 0)
        return false;
    const std::size_t cap = probe ? std::min(unit_cap, batch_limit) : unit_cap;
    // A unit takes at most its worker's share of the lanes: a slow call
    // holds back the later records of every lane in its unit, so one unit
    // must not take them all while other workers are free.
    // (With one worker its share is every lane: nothing to count.)
    std::size_t lanes_per_unit = SIZE_MAX;
    if (workers.size() > 1)
        lanes_per_unit = std::max<std::size_t>(1, (lanes_known() + workers.size() - 1) / workers.size());
    bool sent = false;
    for (std::size_t n = 0; n < workers.size() && !batch.empty(); ++n) {
        if (busy[n] || !workers[n].db)
            continue;
        fill_unit(n, cap, lanes_per_unit);
        if (units[n].empty())
            break; // every waiting record is behind a busy lane
        probe_running = probe;
        submit(n);
        sent = true;
        if (probe)
            break;
    }
    fill_bytes = 0;
    for (const auto& it : batch)
        fill_bytes += it.bytes();
    if (sent)
        worker_freed = false;
    waiting_since = Clock::now(); // what is left waits behind busy lanes: a merge frees them
    return sent;
}

std::size_t Engine::Impl::lanes_known() const
{
    if (cfg.ordering == Ordering::partition) {
        std::vector<const PartitionState*> waiting; // partitions of waiting records in no busy unit
        waiting.reserve(batch.size());
        for (const auto& it : batch)
            if (it.part->unit == 0)
                waiting.push_back(it.part);
        std::sort(waiting.begin(), waiting.end(), std::less<>());
        return busy_partitions +
               static_cast<std::size_t>(std::unique(waiting.begin(), waiting.end()) - waiting.begin());
    }
    std::set<std::pair<PartitionState*, KeyId>> known(key_lanes);
    for (const auto& it : batch)
        known.insert(lane_of(it));
    return known.size();
}

void Engine::Impl::fill_unit(std::size_t n, std::size_t cap, std::size_t lanes_per_unit)
{
    auto& unit = units[n];
    const std::size_t mark = n + 1; // PartitionState::unit of this unit's partitions
    const bool by_key = cfg.ordering == Ordering::key;
    const bool shared = workers.size() > 1;           // other units may hold lanes
    std::size_t partitions = 0;                       // Ordering::partition: lanes this unit took
    std::set<std::pair<PartitionState*, KeyId>> mine; // Ordering::key with several workers: lanes this unit took
    still_waiting.clear();
    bool full = false; // the unit is complete: what follows waits, in order
    for (auto& it : batch) {
        if (!full && unit.size() < cap) {
            auto* ps = it.part;
            std::pair<PartitionState*, KeyId> lane;
            bool fits = true;
            if (!by_key) {
                fits = ps->unit == mark || (ps->unit == 0 && partitions < lanes_per_unit);
            } else if (shared) {
                lane = lane_of(it);
                fits = mine.count(lane) || (!key_lanes.count(lane) && mine.size() < lanes_per_unit);
            }
            if (fits) {
                if (it.lease || decode(it)) {
                    if (!by_key && ps->unit == 0) {
                        ps->unit = mark;
                        ++partitions;
                        ++busy_partitions;
                    } else if (by_key && shared) {
                        mine.insert(std::move(lane));
                    }
                    unit.push_back(std::move(it));
                    continue;
                }
                full = true; // no slot left (they come back as units end)
            }
        }
        still_waiting.push_back(std::move(it));
    }
    batch.swap(still_waiting);
    still_waiting.clear();
    key_lanes.insert(mine.begin(), mine.end());
}

void Engine::Impl::release_lanes(std::size_t n)
{
    const std::size_t mark = n + 1;
    const bool by_key = cfg.ordering == Ordering::key;
    if (by_key && workers.size() == 1)
        return; // no key lanes kept
    for (const auto& it : units[n]) {
        if (by_key) {
            key_lanes.erase(lane_of(it));
        } else if (it.part->unit == mark) {
            it.part->unit = 0;
            --busy_partitions;
            kafka->defer(it.part->tp, false);
        }
    }
}

void Engine::Impl::submit(std::size_t n)
{
    auto& unit = units[n];
    auto& w = workers[n];
    metrics.consumed.add(unit.size());
    unit_deadlines[n] = Clock::now() + batch_budget;
    w.reset(Holds{});
    busy[n] = true;
    ++busy_units;
    // Always on the pool, also with one worker and no pipeline, the
    // screening too: the poll thread stays free to keep the membership
    // during a long handler call, a reconcile hook call, or dead-letter
    // publishes that wait for the broker (up to their timeout each).
    pool->submit(n, [this, n] {
        auto& worker = workers[n];
        auto& items = units[n];
        try {
            worker.holds = claims.screen(intake, worker, items); // held before the transactions
            for (std::size_t i = 0; i < items.size(); ++i)
                if (items[i].state == ItemState::pending)
                    worker.items.push_back(i);
            if (!worker.items.empty()) // else settled by the screening
                claims.run(worker, items, unit_deadlines[n]);
        } catch (...) {
            worker.failed = true;
            worker.error = std::current_exception();
        }
    });
}

} // namespace idemkafka::detail
