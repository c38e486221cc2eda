#pragma once
// What holds the run loop back, each with its state in one place: PostgreSQL
// being away (DatabaseGate), the circuit breaker (CircuitGate), the offset
// commit's pace (CommitPacer), and a handler call that does not return: the
// keep-alive while every worker is busy and the watch on the call (KeepAlive,
// with its CallWatch); the three that pause the whole assignment together as
// Gates.
// Pure logic, no Kafka and no PostgreSQL. Private to the library.

#include <chrono>
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include "consumer/worker.hpp"
#include "core/backoff.hpp"
#include "core/circuit_breaker.hpp"
#include "core/ledger.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka::detail {

/// PostgreSQL's availability as the run loop sees it. Closed from hold()
/// until reopen(): meanwhile the whole assignment is paused and nothing is
/// dispatched, and retry_due() says when the next reconnect (or check of the
/// stored positions) may be tried, after a backoff that grows with each hold
/// in a row.
class DatabaseGate {
public:
    explicit DatabaseGate(Backoff shape) noexcept : backoff_(shape) {}

    bool closed() const noexcept { return closed_; }
    bool retry_due(Clock::time_point now) const noexcept { return now >= retry_at_; }
    /// The wait the next hold() will set.
    std::chrono::milliseconds upcoming() const noexcept { return backoff_.upcoming(); }

    /// Closes (again) for the next backoff; true when it was open.
    bool hold(Clock::time_point now) noexcept
    {
        retry_at_ = now + backoff_.next();
        return !std::exchange(closed_, true);
    }
    /// PostgreSQL takes transactions: the next hold waits the shortest
    /// backoff again; true when it was closed.
    bool reopen() noexcept
    {
        backoff_.reset();
        return std::exchange(closed_, false);
    }

private:
    GrowingBackoff backoff_;
    Clock::time_point retry_at_{};
    bool closed_ = false;
};

/// The circuit breaker's hold on the run loop. While it is open the whole
/// assignment is paused (paused()); when its backoff is over one probe unit
/// runs alone (probe_running()), and its outcome closes or reopens it. The
/// time it is open is counted into Metrics::circuit_open_ms; every decision
/// is a log line and a counter here.
class CircuitGate {
public:
    CircuitGate(const ConsumerConfig& cfg, Metrics& metrics, const LogSink& log)
        : circuit_(cfg.circuit_breaker), settings_(cfg.circuit_breaker), max_batch_(cfg.max_batch), metrics_(metrics),
          log_(log)
    {
    }

    Circuit& circuit() noexcept { return circuit_; }
    bool enabled() const noexcept { return circuit_.enabled(); }
    bool paused() const noexcept { return paused_; }
    void set_paused(bool paused) noexcept { paused_ = paused; }
    bool probing() const noexcept { return circuit_.state() == Circuit::State::probing; }
    /// The unit in a worker's hands is the probe.
    bool probe_running() const noexcept { return probe_running_; }
    void unit_started(bool probe) noexcept { probe_running_ = probe; }

    /// Counts the time open up to `now`. What the circuit decides must not
    /// meet a running unit: true when the units are to be drained first.
    bool must_drain(Clock::time_point now);

    /// After the probe unit merged: its outcome, logged and counted (nothing
    /// when no probe ran). Reopened: the assignment is to be held again;
    /// closed: the waiting room takes its own limit again.
    std::optional<Circuit::Probe::Outcome> settle(Clock::time_point now, std::size_t busy_units);

    /// The circuit opened while units ran: logged and counted; true when the
    /// assignment is to be held (rewound and paused).
    bool take_opened(Clock::time_point now);

    /// Its backoff is over: the records for one probe unit, logged (the
    /// assignment is to be resumed and polled afresh); nothing otherwise.
    std::optional<std::size_t> probe_due(Clock::time_point now);

private:
    Circuit circuit_;
    CircuitBreaker settings_;
    std::size_t max_batch_;
    Metrics& metrics_;
    const LogSink& log_;
    bool paused_ = false;
    bool probe_running_ = false;
    Clock::time_point counted_{}; // open time counted up to here
    Clock::time_point since_{};   // when it opened from closed
};

/// When the run loop sends the positions PostgreSQL committed to Kafka:
/// at most once per commit_interval, and each housekeeping tick resends a
/// failed commit of an idle partition. Keeps when the first transaction
/// not yet sent committed (Metrics::commit_delay_seconds).
class CommitPacer {
public:
    explicit CommitPacer(std::chrono::milliseconds interval) noexcept : interval_(interval) {}

    /// The housekeeping tick (every 200 ms) is due; it is counted from now.
    bool tick(Clock::time_point now) noexcept
    {
        if (now < next_tick_)
            return false;
        next_tick_ = now + std::chrono::milliseconds(200);
        return true;
    }
    /// An offset commit is due from housekeeping (with nothing new only at a tick).
    bool due(Clock::time_point now, bool tick) const noexcept
    {
        return now >= next_at_ && (tick || uncommitted_since_);
    }
    /// An offset commit is due after a merge.
    bool due_after_merge(Clock::time_point now) const noexcept { return now >= next_at_; }
    /// A transaction committed in PostgreSQL at `at`, not yet sent to Kafka.
    void db_committed(Clock::time_point at) noexcept
    {
        if (!uncommitted_since_)
            uncommitted_since_ = at;
    }
    /// An offset commit is tried now: the next one waits commit_interval.
    void attempted(Clock::time_point now) noexcept { next_at_ = now + interval_; }
    /// It was sent: how long the oldest of its transactions waited, if any.
    std::optional<std::chrono::duration<double>> sent(Clock::time_point now) noexcept
    {
        std::optional<std::chrono::duration<double>> waited;
        if (uncommitted_since_)
            waited = now - *uncommitted_since_;
        uncommitted_since_.reset();
        return waited;
    }

private:
    std::chrono::milliseconds interval_;
    Clock::time_point next_at_{};
    Clock::time_point next_tick_{};
    std::optional<Clock::time_point> uncommitted_since_;
};

/// A handler call cannot be interrupted, but one that does not return must
/// be seen: the gauge of the oldest call running (Metrics::oldest_call_ms,
/// every 200 ms at most), and a call running past max.poll.interval.ms is
/// an error line naming its record, again every max.poll.interval.ms while
/// it runs (Metrics::stuck_calls counts each such call once).
class CallWatch {
public:
    CallWatch(Metrics& metrics, const LogSink& log) : metrics_(metrics), log_(log) {}

    /// `calls[n]`: worker n's running call, if any; `bound`: max.poll.interval.ms.
    void watch(Clock::time_point now, const std::vector<std::optional<RunningCall::Seen>>& calls,
               std::chrono::milliseconds bound);
    /// Whether watch() looks again at `now` (every 200 ms).
    bool due(Clock::time_point now) const noexcept { return now >= next_; }

private:
    struct Told {
        Clock::time_point since{}; // the start of the call last said to be stuck
        Clock::time_point told{};  // and when
    };
    Metrics& metrics_;
    const LogSink& log_;
    std::vector<Told> told_;
    Clock::time_point next_{};
};

/// A handler call that does not return, while every worker is busy (or the
/// poll thread drains every unit). The member must poll to stay in its
/// group: past after() since the last poll the assignment is paused and
/// polled (paused()), and a revoke waits at most revoke_wait() for the units
/// with records of the revoked partitions. And the call must be seen: the
/// CallWatch hears of the running calls (watch_due(), watch()) with
/// max.poll.interval.ms as its bound, the one configure() was given.
class KeepAlive {
public:
    KeepAlive(Metrics& metrics, const LogSink& log) : calls_(metrics, log) {}

    /// From the group's max.poll.interval.ms and the stop's shutdown_timeout.
    void configure(std::chrono::milliseconds max_poll_interval, std::chrono::milliseconds shutdown_timeout) noexcept
    {
        max_poll_interval_ = max_poll_interval;
        after_ = std::min(std::chrono::milliseconds(10000), max_poll_interval / 5);
        revoke_wait_ = std::min(shutdown_timeout, max_poll_interval / 2);
    }
    void polled(Clock::time_point now) noexcept { last_polled_ = now; }
    /// Until when a wait for a unit may go on without a poll.
    Clock::time_point deadline() const noexcept { return last_polled_ + after_; }
    std::chrono::milliseconds after() const noexcept { return after_; }
    std::chrono::milliseconds revoke_wait() const noexcept { return revoke_wait_; }
    bool paused() const noexcept { return paused_; }
    void set_paused(bool paused) noexcept { paused_ = paused; }

    /// Whether watch() looks at the running calls again at `now`.
    bool watch_due(Clock::time_point now) const noexcept { return calls_.due(now); }
    /// `calls[n]`: worker n's running call, if any (CallWatch::watch).
    void watch(Clock::time_point now, const std::vector<std::optional<RunningCall::Seen>>& calls)
    {
        calls_.watch(now, calls, max_poll_interval_);
    }

private:
    Clock::time_point last_polled_ = Clock::now();
    std::chrono::milliseconds max_poll_interval_{300000};
    std::chrono::milliseconds after_{10000};
    std::chrono::milliseconds revoke_wait_{10000};
    bool paused_ = false;
    CallWatch calls_;
};

/// The gates that hold the whole assignment paused: PostgreSQL away (db),
/// the circuit open or probing (circuit) and the keep-alive polling while
/// every worker is busy (keepalive). The assignment resumes (all but the
/// partitions waiting out a retry backoff) only while neither the database
/// nor the circuit holds it (assignment_held()); partitions assigned while
/// any of the three holds it start paused (assigned_paused()).
struct Gates {
    Gates(const ConsumerConfig& cfg, Backoff db_backoff, Metrics& metrics, const LogSink& log)
        : db(db_backoff), circuit(cfg, metrics, log), keepalive(metrics, log)
    {
    }

    /// PostgreSQL is away or the circuit holds the assignment: nothing resumes.
    bool assignment_held() const noexcept { return db.closed() || circuit.paused(); }
    /// Partitions assigned now start paused.
    bool assigned_paused() const noexcept { return assignment_held() || keepalive.paused(); }

    DatabaseGate db;
    CircuitGate circuit;
    KeepAlive keepalive;
};

} // namespace idemkafka::detail
