// The circuit breaker's decisions as the run loop sees them, and the watch on
// handler calls that do not return: their log lines and counters.

#include "consumer/gates.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "observe/log_context.hpp"

namespace idemkafka::detail {

using std::chrono::milliseconds;

namespace {

milliseconds ms_between(Clock::time_point from, Clock::time_point to)
{
    return std::chrono::duration_cast<milliseconds>(to - from);
}

} // namespace

bool CircuitGate::must_drain(Clock::time_point now)
{
    if (metrics_.circuit_open.get() != 0) {
        metrics_.circuit_open_ms.add(static_cast<std::uint64_t>(ms_between(counted_, now).count()));
        counted_ = now;
    }
    return circuit_.state() != Circuit::State::closed || probe_running_;
}

std::optional<Circuit::Probe::Outcome> CircuitGate::settle(Clock::time_point now, std::size_t busy_units)
{
    if (!probe_running_ || busy_units > 0)
        return std::nullopt;
    probe_running_ = false;
    const auto p = circuit_.settle_probe(now);
    using Outcome = Circuit::Probe::Outcome;
    if (p.outcome == Outcome::closed) {
        metrics_.circuit_open.set(0);
        say(log_, LogLevel::info, {},
            "circuit breaker closed after {} ms: {} handler call(s) of the probe succeeded ({} failed); the "
            "assignment runs as before, and failures count toward max_attempts again. The {} key(s) that failed "
            "while it was open are blamed until one of their records succeeds: their failures open the circuit "
            "again only at a record's last attempt; those of {} of them (which opened it again so, and the "
            "handler has worked since) do not open it at all, they are dead-lettered after max_attempts",
            p.open_for.count(), p.successes, p.failures, p.blamed, p.convicted);
    } else if (p.outcome == Outcome::reopened) {
        say(log_, LogLevel::warning, error_field(p.last_error),
            "circuit breaker probe failed ({} handler call(s) failed, none succeeded): open again, the next "
            "probe in {} ms. Last error: {}",
            p.failures, p.wait.count(), p.last_error);
    } else if (p.outcome == Outcome::passed && p.counted) {
        say(log_, LogLevel::info, error_field(p.last_error),
            "circuit breaker probe inconclusive: only records of keys that had failed before failed again ({}); "
            "given up, they count toward max_attempts. Last error: {}",
            p.failures, p.last_error);
    } else if (p.outcome == Outcome::passed) {
        say(log_, LogLevel::info, error_field(p.last_error),
            "circuit breaker probe inconclusive: only records of keys that had failed before failed again ({}); "
            "the next batches probe past them (they wait {} ms, not counted toward max_attempts). Last error: {}",
            p.failures, circuit_.round_wait().count(), p.last_error);
    }
    if (p.gave_up) {
        metrics_.circuit_gave_up.add();
        say(log_, LogLevel::warning, error_field(p.last_error),
            "circuit breaker gives up: open for {} ms (give_up_after {} ms) and no handler call succeeded, so the "
            "failing records cannot be told from an outage; the probes' failures count toward max_attempts from "
            "now on, and those records are dead-lettered after it, until a handler call succeeds. Last error: {}",
            p.open_for.count(), settings_.give_up_after.count(), p.last_error);
    }
    // unsettled (duplicates only, or nothing polled): the next batch probes again
    return p.outcome;
}

bool CircuitGate::take_opened(Clock::time_point now)
{
    const auto e = circuit_.take_opened();
    if (!e)
        return false;
    metrics_.circuit_opened.add();
    metrics_.circuit_open.set(1);
    counted_ = since_ = now;
    const auto flapping = e->recovered == 0 ? std::string()
                                            : fmt::format(", and {} records that had failed succeeded at a later "
                                                          "attempt (a flapping downstream)",
                                                          e->recovered);
    say(log_, LogLevel::warning, error_field(e->last_error),
        "circuit breaker open: {} of {} handler attempts failed within {} ms, on {} or more keys in {} or more "
        "partitions{}: taken for an outage, not the records' fault. The assignment is paused and rewound for {} "
        "ms, then a probe batch runs; failures meanwhile do not count toward max_attempts (nor do those so "
        "far). Last error: {}",
        e->failures, e->attempts, e->span.count(), e->keys, e->partitions, flapping, e->wait.count(), e->last_error);
    return true;
}

std::optional<std::size_t> CircuitGate::probe_due(Clock::time_point now)
{
    if (!circuit_.probe_due(now))
        return std::nullopt;
    const auto records = std::max<std::size_t>(1, std::min(max_batch_, settings_.probe_records));
    say(log_, LogLevel::info, {},
        "circuit breaker probing, {} ms after it opened (its backoff is over): the assignment is resumed for one "
        "batch of at most {} records",
        ms_between(since_, now).count(), records);
    return records;
}

void CallWatch::watch(Clock::time_point now, const std::vector<std::optional<RunningCall::Seen>>& calls,
                      milliseconds bound)
{
    next_ = now + milliseconds(200);
    told_.resize(calls.size());
    milliseconds oldest{0};
    for (std::size_t n = 0; n < calls.size(); ++n) {
        const auto& call = calls[n];
        if (!call)
            continue;
        const auto ran = ms_between(call->since, now);
        oldest = std::max(oldest, ran);
        auto& told = told_[n];
        const bool again = told.since == call->since;
        if (ran < bound || (again && now - told.told < bound))
            continue;
        if (!again)
            metrics_.stuck_calls.add();
        told = {call->since, now};
        auto fields = call->fields;
        fields.push_back({"running_ms", std::to_string(ran.count())});
        say(log_, LogLevel::error, std::move(fields),
            "handler call on {}{} has run for {} s and not returned (worker {}; max.poll.interval.ms {} ms): it "
            "cannot be interrupted; the member stays in the group, keeping its partitions until a rebalance "
            "takes them, and stop() waits for it. Said again every {} s while it runs",
            call->where, call->records > 1 ? fmt::format(" and {} more records", call->records - 1) : "",
            ran.count() / 1000, n, bound.count(), bound.count() / 1000);
    }
    metrics_.oldest_call_ms.set(oldest.count());
}

} // namespace idemkafka::detail
