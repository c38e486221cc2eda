// Handing out units of work (see Dispatcher): the screening before each
// unit's transaction, the worker that runs it.

#include "consumer/engine_impl.hpp"

#include <algorithm>
#include <cstdint>

namespace idemkafka::detail {

bool Engine::Impl::dispatch_due(Clock::time_point now) const
{
    return dispatcher.due(room, now, cfg.max_batch_wait, signals.stop.requested());
}

bool Engine::Impl::dispatch()
{
    const auto now = Clock::now();
    if (!dispatch_due(now))
        return false;
    // The circuit's probe runs alone, as one unit of at most the waiting
    // room's (probe) limit.
    const bool probe = gates.circuit.probing();
    const std::size_t cap = probe ? std::min(dispatcher.unit_cap(), room.limit()) : dispatcher.unit_cap();
    if (dispatcher.hand_out(room, cap, probe, now) == 0)
        return false;
    gates.circuit.unit_started(probe);
    return true;
}

void Engine::Impl::release_lanes(std::size_t n)
{
    dispatcher.release_lanes(n, [this](PartitionState& ps) { kafka->defer(ps.tp, false); });
}

void Engine::Impl::free_worker(std::size_t n)
{
    crew.workers[n].revoked = false;
    if (dispatcher.finish(n))
        ledger.release_retired();
}

void Engine::Impl::submit(std::size_t n)
{
    auto& w = crew.workers[n];
    metrics.consumed.add(dispatcher.unit(n).size());
    w.reset(Holds{});
    // Always on the pool, also with one worker and no pipeline, the
    // screening too: the poll thread stays free to keep the membership
    // during a long handler call, a reconcile hook call, or dead-letter
    // publishes that wait for the broker (up to their timeout each).
    crew.pool->submit(n, [this, n] {
        auto& worker = crew.workers[n];
        auto& items = dispatcher.unit(n);
        try {
            worker.holds = claims.screen(intake, worker, items); // held before the transactions
            for (std::size_t i = 0; i < items.size(); ++i)
                if (items[i].state == ItemState::pending)
                    worker.items.push_back(i);
            if (!worker.items.empty()) // else settled by the screening
                claims.run(worker, items, dispatcher.deadline(n));
        } catch (...) {
            worker.failed = true;
            worker.error = std::current_exception();
        }
    });
}

} // namespace idemkafka::detail
