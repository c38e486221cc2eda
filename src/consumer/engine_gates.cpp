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
        layout = claims.settle_schema(*w.db);
        intake.set_layout(layout);
    }
    claims.prepare(w);
}

bool Engine::Impl::ensure_db()
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
            dispatch_dirty = true; // a worker can take a unit again
            say(log, LogLevel::info, {}, "reconnected to PostgreSQL (worker {})", i);
        } catch (const std::exception& e) {
            w.disconnect();
            say(log, LogLevel::warning, error_field(e.what()), "PostgreSQL reconnect failed, next attempt in {} ms: {}",
                db_backoff.upcoming().count(), e.what());
            db_hold();
            return false;
        }
    }
    if (positions) {
        // Takeovers rewind partitions: no unit may be running then.
        if (reconnected ||
            std::any_of(ledger.begin(), ledger.end(), [](const auto& p) { return !p.second.position_verified; }))
            drain();
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
            batch.erase(
                std::remove_if(batch.begin(), batch.end(), [&](const Item& it) { return rewinds.count(it.part) > 0; }),
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

void Engine::Impl::db_hold()
{
    db_retry_at = Clock::now() + db_backoff.next();
    if (!db_pause)
        set_db_pause(true);
}

void Engine::Impl::set_db_pause(bool pause)
{
    db_pause = pause;
    metrics.db_paused.set(pause ? 1 : 0);
    std::set<TopicPartition> keep; // partitions waiting out a retry backoff stay paused
    for (const auto& [tp, ps] : ledger)
        if (ps.retry_paused)
            keep.insert(tp);
    kafka->pause_assignment(pause || circuit_pause, keep);
}

void Engine::Impl::await_unit()
{
    const auto before = busy_units;
    if (before == 0 || pool->wait_any_until(last_polled + keepalive_after))
        return;
    const auto since = Clock::now();
    metrics.long_call_waits.add();
    say(log, LogLevel::info, {},
        "every worker has been busy past the keep-alive point ({} ms after the last poll); the assignment is paused "
        "and polled until a unit of work ends, so this member stays in the group",
        keepalive_after.count());
    keepalive_paused = true;
    kafka->pause_assignment(true);
    bool cut = false;
    // Until a unit ends, or a revoke served in the poll merged one.
    while (busy_units == before && !pool->wait_any_until(Clock::now())) {
        // Also for units a revoke abandoned before: their calls may still
        // block on PostgreSQL.
        if (!cut && forced()) {
            for (std::size_t n = 0; n < workers.size(); ++n)
                if (busy[n])
                    workers[n].revoked = true;
            cut = true;
            cut_for_stop();
        }
        auto m = kafka->poll(milliseconds(100)); // rebalances are served in here
        last_polled = Clock::now();
        watch_calls(last_polled);
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
    say(log, LogLevel::info, {}, "a unit of work ended after {} ms of polling; the assignment is resumed",
        std::chrono::duration_cast<milliseconds>(Clock::now() - since).count());
}

void Engine::Impl::watch_calls(Clock::time_point now)
{
    if (now < next_call_watch)
        return;
    next_call_watch = now + milliseconds(200);
    stuck.resize(workers.size());
    const auto bound = kafka->max_poll_interval();
    milliseconds oldest{0};
    for (std::size_t n = 0; n < workers.size(); ++n) {
        const auto call = busy[n] ? workers[n].call.seen() : std::nullopt;
        if (!call)
            continue;
        const auto ran = std::chrono::duration_cast<milliseconds>(now - call->since);
        oldest = std::max(oldest, ran);
        auto& told = stuck[n];
        const bool again = told.since == call->since;
        if (ran < bound || (again && now - told.told < bound))
            continue;
        if (!again)
            metrics.stuck_calls.add();
        told = {call->since, now};
        auto fields = call->fields;
        fields.push_back({"running_ms", std::to_string(ran.count())});
        say(log, LogLevel::error, std::move(fields),
            "handler call on {}{} has run for {} s and not returned (worker {}; max.poll.interval.ms {} ms): it "
            "cannot be interrupted; the member stays in the group, keeping its partitions until a rebalance "
            "takes them, and stop() waits for it. Said again every {} s while it runs",
            call->where, call->records > 1 ? fmt::format(" and {} more records", call->records - 1) : "",
            ran.count() / 1000, n, bound.count(), bound.count() / 1000);
    }
    metrics.oldest_call_ms.set(oldest.count());
}

void Engine::Impl::cut_for_stop()
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

bool Engine::Impl::circuit_ready()
{
    if (!circuit.enabled())
        return true;
    const auto now = Clock::now();
    if (metrics.circuit_open.get() != 0) {
        metrics.circuit_open_ms.add(
            static_cast<std::uint64_t>(std::chrono::duration_cast<milliseconds>(now - circuit_counted).count()));
        circuit_counted = now;
    }
    if (circuit.state() != Circuit::State::closed || probe_running)
        drain(); // what it decides must not meet a running unit
    if (probe_running && busy_units == 0) {
        probe_running = false;
        settle_probe(now);
    }
    if (const auto e = circuit.take_opened())
        circuit_opened(*e, now);
    if (circuit.probe_due(now)) {
        set_circuit_pause(false); // all but partitions waiting out a retry backoff (or PostgreSQL)
        worker_freed = false;     // the probe fills its batch (or waits max_batch_wait), not one poll's worth
        batch_limit = std::max<std::size_t>(1, std::min(cfg.max_batch, cfg.circuit_breaker.probe_records));
        say(log, LogLevel::info, {},
            "circuit breaker probing, {} ms after it opened (its backoff is over): the assignment is resumed "
            "for one batch of at most {} records",
            std::chrono::duration_cast<milliseconds>(now - circuit_since).count(), batch_limit);
        return false; // what was polled while paused goes back: the probe is polled afresh
    }
    return !circuit_pause;
}

void Engine::Impl::circuit_opened(const Circuit::Evidence& e, Clock::time_point now)
{
    metrics.circuit_opened.add();
    metrics.circuit_open.set(1);
    circuit_counted = circuit_since = now;
    ledger.forgive_failures(); // the failures that showed the outage were not the records' either
    circuit_hold();
    const auto flapping = e.recovered == 0 ? std::string()
                                           : fmt::format(", and {} records that had failed succeeded at a later "
                                                         "attempt (a flapping downstream)",
                                                         e.recovered);
    say(log, LogLevel::warning, error_field(e.last_error),
        "circuit breaker open: {} of {} handler attempts failed within {} ms, on {} or more keys in {} or more "
        "partitions{}: taken for an outage, not the records' fault. The assignment is paused and rewound for {} "
        "ms, then a probe batch runs; failures meanwhile do not count toward max_attempts (nor do those so "
        "far). Last error: {}",
        e.failures, e.attempts, e.span.count(), e.keys, e.partitions, flapping, e.wait.count(), e.last_error);
}

void Engine::Impl::settle_probe(Clock::time_point now)
{
    const auto p = circuit.settle_probe(now);
    using Outcome = Circuit::Probe::Outcome;
    if (p.outcome == Outcome::closed) {
        metrics.circuit_open.set(0);
        batch_limit = room_limit;
        say(log, LogLevel::info, {},
            "circuit breaker closed after {} ms: {} handler call(s) of the probe succeeded ({} failed); the "
            "assignment runs as before, and failures count toward max_attempts again. The {} key(s) that failed "
            "while it was open are blamed until one of their records succeeds: their failures open the circuit "
            "again only at a record's last attempt; those of {} of them (which opened it again so, and the "
            "handler has worked since) do not open it at all, they are dead-lettered after max_attempts",
            p.open_for.count(), p.successes, p.failures, p.blamed, p.convicted);
    } else if (p.outcome == Outcome::reopened) {
        circuit_hold();
        say(log, LogLevel::warning, error_field(p.last_error),
            "circuit breaker probe failed ({} handler call(s) failed, none succeeded): open again, the next "
            "probe in {} ms. Last error: {}",
            p.failures, p.wait.count(), p.last_error);
    } else if (p.outcome == Outcome::passed && p.counted) {
        say(log, LogLevel::info, error_field(p.last_error),
            "circuit breaker probe inconclusive: only records of keys that had failed before failed again ({}); "
            "given up, they count toward max_attempts. Last error: {}",
            p.failures, p.last_error);
    } else if (p.outcome == Outcome::passed) {
        say(log, LogLevel::info, error_field(p.last_error),
            "circuit breaker probe inconclusive: only records of keys that had failed before failed again ({}); "
            "the next batches probe past them (they wait {} ms, not counted toward max_attempts). Last error: {}",
            p.failures, circuit.round_wait().count(), p.last_error);
    }
    if (p.gave_up) {
        metrics.circuit_gave_up.add();
        say(log, LogLevel::warning, error_field(p.last_error),
            "circuit breaker gives up: open for {} ms (give_up_after {} ms) and no handler call succeeded, so the "
            "failing records cannot be told from an outage; the probes' failures count toward max_attempts from "
            "now on, and those records are dead-lettered after it, until a handler call succeeds. Last error: {}",
            p.open_for.count(), cfg.circuit_breaker.give_up_after.count(), p.last_error);
    }
    // unsettled (duplicates only, or nothing polled): the next batch probes again
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
        batch.erase(std::remove_if(batch.begin(), batch.end(),
                                   [&](const Item& it) { return holds.covers(it.part, it.record.offset); }),
                    batch.end());
    count_in_flight();
    set_circuit_pause(true);
}

void Engine::Impl::set_circuit_pause(bool pause)
{
    circuit_pause = pause;
    set_db_pause(db_pause); // pauses or resumes the assignment for both
}

} // namespace idemkafka::detail
