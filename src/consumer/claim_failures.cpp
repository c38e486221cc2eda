// A record's handler failure in the claim transaction: counted toward
// max_attempts and retried after a backoff (its partition held, or its key
// parked), dead-lettered at the last attempt or when not retryable, or not
// counted when the circuit breaker takes it for an outage's or its probe.

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"

namespace idemkafka::detail {

void ClaimTransaction::handler_failed(Worker& w, Batch& b, const Failure& f)
{
    auto& it = b.items[f.index];
    if (f.retryable && s_.circuit.enabled()) {
        const bool last = s_.ledger.attempt_of(*it.part, it.record.offset) >= s_.cfg.max_attempts;
        const auto verdict =
            s_.circuit.failed(reinterpret_cast<std::uintptr_t>(it.part), circuit_key(it), f.what, Clock::now(), last);
        if (verdict != Circuit::Verdict::counted) {
            not_counted(w, b, f, verdict);
            return;
        }
    }
    const int failures = s_.ledger.count_failure(*it.part, it.record.offset);
    s_.metrics.handler_failures.add();
    const auto where = it.where();
    auto fields = it.log_fields(f.what);
    fields.push_back({"attempt", std::to_string(failures)});
    if (!f.retryable || failures >= s_.cfg.max_attempts) {
        say(s_.log, LogLevel::error, std::move(fields), "handler failed on {} (event {}, attempt {} of {}{}): {}",
            where, it.id.to_string(), failures, s_.cfg.max_attempts, f.retryable ? "" : ", not retryable", f.what);
        it.poison(f.retryable ? DeadLetterReason::handler_failed : DeadLetterReason::non_retryable, f.what);
        s_.dead_letters.send({&it}, w.holds); // done when acknowledged, else held for another try
        return;
    }
    s_.metrics.retries.add();
    it.error = f.what; // the record's last error (HandlerHarness reports it)
    const bool by_key = s_.cfg.ordering == Ordering::key;
    say(s_.log, LogLevel::warning, std::move(fields),
        "handler failed on {} (event {}, attempt {} of {}), retrying in {} ms{}: {}", where, it.id.to_string(),
        failures, s_.cfg.max_attempts, s_.ledger.retry_backoff(failures).count(),
        by_key ? " (its key waits; the partition's other keys go on)" : "", f.what);
    // Ordering::key: only the record's key waits behind it (parked);
    // otherwise its whole partition does.
    if (by_key)
        w.holds.park(it.part, it.record.key, it.record.offset, failures);
    else
        w.holds.add(it.part, it.record.offset, failures);
}

// A handler failure the circuit breaker takes for an outage's, or one of
// its probe: not counted toward max_attempts. While the circuit is open the
// worker gives back every record it has not finished (they run again after
// the outage: the engine pauses the assignment); a probe goes on with its
// other records.
void ClaimTransaction::not_counted(Worker& w, Batch& b, const Failure& f, Circuit::Verdict verdict)
{
    auto& it = b.items[f.index];
    s_.metrics.handler_failures.add();
    s_.metrics.retries.add();
    it.error = f.what;
    const int failures = s_.ledger.attempt_of(*it.part, it.record.offset) - 1;
    const bool probe = verdict == Circuit::Verdict::probe;
    say(s_.log, LogLevel::info, it.log_fields(f.what),
        "handler failed on {} (event {}) {}; not counted toward max_attempts ({} of {} so far): {}", it.where(),
        it.id.to_string(),
        probe ? "in a probe of the open circuit" : "while the circuit is open (an outage, not this record's fault)",
        failures, s_.cfg.max_attempts, f.what);
    if (probe) {
        // Out of the rest of this round of probes: the next batches go past it.
        const auto wait = s_.circuit.round_wait();
        if (s_.cfg.ordering == Ordering::key)
            w.holds.park(it.part, it.record.key, it.record.offset, failures, wait);
        else
            w.holds.add(it.part, it.record.offset, failures, wait);
        return;
    }
    for (std::size_t j : w.items) {
        const auto& other = b.items[j];
        if (to_run(w.holds, other))
            w.holds.add(other.part, other.record.offset, 0);
    }
}

} // namespace idemkafka::detail
