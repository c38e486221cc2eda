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
    if (workers.size() > 1) {
        std::set<std::pair<PartitionState*, KeyId>> known(lanes);
        for (const auto& it : batch)
            known.insert(lane_of(it));
        lanes_per_unit = std::max<std::size_t>(1, (known.size() + workers.size() - 1) / workers.size());
    }
    bool sent = false;
    for (std::size_t n = 0; n < workers.size() && !batch.empty(); ++n) {
        if (busy[n] || !workers[n].db)
            continue;
        auto& unit = units[n];
        std::set<std::pair<PartitionState*, KeyId>> mine; // lanes this unit takes
        std::vector<Item> rest;
        rest.reserve(batch.size());
        bool full = false; // the unit is complete: what follows waits, in order
        for (auto& it : batch) {
            if (!full && unit.size() < cap) {
                auto lane = lane_of(it);
                if (mine.count(lane) || (!lanes.count(lane) && mine.size() < lanes_per_unit)) {
                    if (it.lease || decode(it)) {
                        mine.insert(std::move(lane));
                        unit.push_back(std::move(it));
                        continue;
                    }
                    full = true; // no slot left (they come back as units end)
                }
            }
            rest.push_back(std::move(it));
        }
        batch = std::move(rest);
        if (unit.empty())
            break; // every waiting record is behind a busy lane
        lanes.insert(mine.begin(), mine.end());
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

void Engine::Impl::submit(std::size_t n)
{
    auto& unit = units[n];
    auto& w = workers[n];
    metrics.consumed.add(unit.size());
    unit_deadlines[n] = Clock::now() + batch_budget;
    const Holds holds = claims.screen(intake, w, unit);
    w.reset(holds);
    for (std::size_t i = 0; i < unit.size(); ++i)
        if (unit[i].state == ItemState::pending)
            w.items.push_back(i);
    busy[n] = true;
    ++busy_units;
    if (w.items.empty()) {
        merge_unit(n); // nothing for a transaction: settled by the screening
        return;
    }
    // Always on the pool, also with one worker and no pipeline: the poll
    // thread stays free to keep the membership during a long handler call.
    pool->submit(n, [this, n] {
        auto& worker = workers[n];
        try {
            claims.run(worker, units[n], unit_deadlines[n]);
        } catch (...) {
            worker.failed = true;
            worker.error = std::current_exception();
        }
    });
}

} // namespace idemkafka::detail
