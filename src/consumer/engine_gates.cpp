// What holds the engine's run loop back: PostgreSQL being away, the
// circuit breaker, and a long handler call (the keep-alive polls meanwhile).

#include "consumer/engine_impl.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace idemkafka::detail {

void Engine::Impl::connect(Worker& w, bool first)
{
    w.connect(cfg.postgres); // connect_timeout bounds this
    const pg::Watch::Armed armed(w.watch, first ? schema_bound(cfg) : cfg.db_timeout);
    if (first) {
        intake.set_layout(claims.settle_schema(*w.db)); // the claims table as found
    }
    claims.prepare(w);
}

bool Engine::Impl::ensure_db()
{
    if (!gates.db.retry_due(Clock::now()))
        return false;
    bool reconnected = false;
    for (std::size_t i = 0; i < crew.workers.size(); ++i) {
        auto& w = crew.workers[i];
        if (w.db)
            continue;
        try {
            connect(w, false);
            metrics.db_reconnects.add();
            reconnected = true;
            dispatcher.changed(); // a worker can take a unit again
            say(log, LogLevel::info, {}, "reconnected to PostgreSQL (worker {})", i);
        } catch (const std::exception& e) {
            w.disconnect();
            say(log, LogLevel::warning, error_field(e.what()), "PostgreSQL reconnect failed, next attempt in {} ms: {}",
                gates.db.upcoming().count(), e.what());
            db_hold();
            return false;
        }
    }
    if (positions) {
        // Takeovers rewind partitions: no unit may be running then.
        if (reconnected ||
            std::any_of(ledger.begin(), ledger.end(), [](const auto& p) { return !p.second.stored.verified; }))
            drain();
        // A new connection may reach another server than the one that
        // committed this member's last transactions (a failover to a
        // standby without them): their positions are gone with their
        // claims and effects, so every partition takes its stored position
        // again instead of going on from its position in memory.
        if (reconnected) {
            positions->reconnect();
            for (auto& [tp, ps] : ledger)
                ps.stored.verified = false;
        }
        // Partitions assigned while PostgreSQL was away, or verified again
        // after a reconnect, take their stored positions now (a seek),
        // before they are resumed; what the waiting room holds of them comes
        // again after the seek.
        const auto rewinds = positions->verify(*kafka);
        for (const auto& [ps, offset] : rewinds)
            rewind(*ps, offset);
        if (!rewinds.empty()) {
            room.drop_if([&](const Item& it) { return rewinds.count(it.part) > 0; });
            count_in_flight();
        }
        for (const auto& [tp, ps] : ledger)
            if (!ps.stored.verified) {
                db_hold();
                return false;
            }
    }
    if (gates.db.reopen())
        apply_pauses();
    return true;
}

void Engine::Impl::db_hold()
{
    if (gates.db.hold(Clock::now()))
        apply_pauses();
}

void Engine::Impl::apply_pauses()
{
    metrics.db_paused.set(gates.db.closed() ? 1 : 0);
    std::set<TopicPartition> keep; // partitions waiting out a retry backoff stay paused
    for (const auto& [tp, ps] : ledger)
        if (ps.rewind.paused)
            keep.insert(tp);
    kafka->pause_assignment(gates.assignment_held(), keep);
}

void Engine::Impl::await_unit()
{
    const auto before = dispatcher.busy_units();
    if (before == 0 || crew.pool->wait_any_until(gates.keepalive.deadline()))
        return;
    const auto since = Clock::now();
    metrics.long_call_waits.add();
    say(log, LogLevel::info, {},
        "every worker has been busy past the keep-alive point ({} ms after the last poll); the assignment is paused "
        "and polled until a unit of work ends, so this member stays in the group",
        gates.keepalive.after().count());
    gates.keepalive.set_paused(true);
    kafka->pause_assignment(true);
    bool cut = false;
    // Until a unit ends, or a revoke served in the poll merged one.
    while (dispatcher.busy_units() == before && !crew.pool->wait_any_until(Clock::now())) {
        // Also for units a revoke abandoned before: their calls may still
        // block on PostgreSQL.
        if (!cut && forced()) {
            for (std::size_t n = 0; n < crew.workers.size(); ++n)
                if (dispatcher.busy(n))
                    crew.workers[n].revoked = true;
            cut = true;
            cut_for_stop();
        }
        auto m = kafka->poll(milliseconds(100)); // rebalances are served in here
        const auto now = Clock::now();
        gates.keepalive.polled(now);
        watch_calls(now);
        if (m && m->err) {
            kafka->consumer_error(*m);
        } else if (m) {
            // Fetched before the pause: it comes again after the resume.
            auto* ps = ledger.find(kafka::GroupMember::topic_of(*m), m->partition);
            if (PartitionLedger::admit(ps, m->offset) == Admission::take)
                rewind(*ps, m->offset);
        }
    }
    gates.keepalive.set_paused(false);
    if (!gates.db.closed())
        apply_pauses(); // resumes all but partitions waiting out a retry backoff
    say(log, LogLevel::info, {}, "a unit of work ended after {} ms of polling; the assignment is resumed",
        std::chrono::duration_cast<milliseconds>(Clock::now() - since).count());
}

void Engine::Impl::watch_calls(Clock::time_point now)
{
    if (!gates.keepalive.watch_due(now))
        return;
    std::vector<std::optional<RunningCall::Seen>> running(crew.workers.size());
    for (std::size_t n = 0; n < crew.workers.size(); ++n)
        if (dispatcher.busy(n))
            running[n] = crew.workers[n].call.seen();
    gates.keepalive.watch(now, running);
}

void Engine::Impl::cut_for_stop()
{
    std::size_t cut = 0;
    for (auto& w : crew.workers)
        if (w.watch.cut())
            ++cut;
    say(log, LogLevel::warning, {},
        "stop forced during a call that has not returned: its transaction rolls back; {} PostgreSQL "
        "connection(s) cut so that a call blocked on PostgreSQL returns now",
        cut);
}

bool Engine::Impl::circuit_ready()
{
    if (!gates.circuit.enabled())
        return true;
    const auto now = Clock::now();
    if (gates.circuit.must_drain(now))
        drain(); // what it decides must not meet a running unit
    const auto settled = gates.circuit.settle(now, dispatcher.busy_units());
    if (settled == Circuit::Probe::Outcome::closed)
        room.restore_limit();
    else if (settled == Circuit::Probe::Outcome::reopened)
        circuit_hold();
    if (gates.circuit.take_opened(now)) {
        ledger.forgive_failures(); // the failures that showed the outage were not the records' either
        circuit_hold();
    }
    if (const auto records = gates.circuit.probe_due(now)) {
        gates.circuit.set_paused(false);
        apply_pauses();          // all but partitions waiting out a retry backoff (or PostgreSQL)
        dispatcher.await_fill(); // the probe fills its unit (or waits max_batch_wait), not one poll's worth
        room.limit_to(*records);
        return false; // what was polled while paused goes back: the probe is polled afresh
    }
    return !gates.circuit.paused();
}

void Engine::Impl::circuit_hold()
{
    Holds holds;
    for (auto& [tp, ps] : ledger)
        if (!ps.parked.empty()) {
            holds.add(&ps, *ps.parked.begin(), 0);
            parking.drop(&ps);
        }
    apply_holds(holds);
    if (!holds.empty())
        room.drop_if([&](const Item& it) { return holds.covers(it.part, it.record.offset); });
    count_in_flight();
    gates.circuit.set_paused(true);
    apply_pauses();
}

} // namespace idemkafka::detail
