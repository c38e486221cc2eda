#pragma once
// What reaches the run loop from outside its own steps: stop() (from any
// thread, or a signal handler), a worker's unit ending while the poll thread
// waits in a poll, and an exception thrown inside a librdkafka callback; the
// run's RunSignals hold one of each. Private to the library.

#include <atomic>
#include <chrono>
#include <exception>
#include <utility>

#include "core/ledger.hpp"

namespace idemkafka::detail {

/// stop() requests. The first asks for a graceful stop; a second one, or
/// the first once older than shutdown_timeout, forces it (the current
/// transaction is abandoned). request() is async-signal-safe.
class StopSignal {
public:
    explicit StopSignal(std::chrono::milliseconds shutdown_timeout) noexcept : timeout_(shutdown_timeout) {}

    void request() noexcept { requests_.fetch_add(1); }
    bool requested() const noexcept { return requests_.load() != 0; }
    /// A second stop(), or a first one older than shutdown_timeout.
    bool forced() noexcept
    {
        const int stops = requests_.load();
        if (stops >= 2)
            return true;
        if (stops == 0)
            return false;
        const auto now = Clock::now().time_since_epoch().count();
        Clock::rep seen = 0;
        seen_.compare_exchange_strong(seen, now); // the first look at this stop
        seen = seen_.load();
        return Clock::duration(now - seen) >= timeout_;
    }

private:
    static_assert(std::atomic<int>::is_always_lock_free, "stop() must be async-signal-safe");
    std::atomic<int> requests_{0};
    std::atomic<Clock::rep> seen_{0};
    std::chrono::milliseconds timeout_;
};

/// A worker's unit ended: the poll thread merges it before it polls again,
/// and a poll waiting for records returns at once. ended() is called on the
/// worker; the rest on the poll thread.
class UnitWake {
public:
    /// Before a poll: false when a unit ended already (merge it first). A
    /// unit ending from here on finds polling() true and wakes the poll.
    bool begin_poll() noexcept
    {
        polling_ = true;
        if (!ended_.load()) {
            return true;
        }
        polling_ = false;
        return false;
    }
    void end_poll() noexcept { polling_ = false; }
    /// On the worker: true when the poll thread is in a poll to be woken.
    bool ended() noexcept
    {
        ended_ = true;
        return polling_.load();
    }
    /// Before merging the units that ended: one ending from now on is seen again.
    void clear() noexcept { ended_ = false; }

private:
    std::atomic<bool> ended_{false};
    std::atomic<bool> polling_{false};
};

/// An exception thrown inside a librdkafka callback (a rebalance's merge)
/// must not cross librdkafka's frames: it is kept, rethrown after the poll,
/// and nothing more is committed meanwhile, as after a crash.
class CallbackFault {
public:
    void keep(std::exception_ptr e) noexcept
    {
        stop_commits();
        if (!error_)
            error_ = std::move(e);
    }
    /// After the poll: throws what a callback kept.
    void rethrow()
    {
        if (error_)
            std::rethrow_exception(std::exchange(error_, nullptr));
    }
    /// run() was left by an exception: nothing more is committed.
    void stop_commits() noexcept { no_commit_ = true; }
    bool commits_stopped() const noexcept { return no_commit_; }

private:
    std::exception_ptr error_;
    bool no_commit_ = false;
};

/// The signals of one run, each set from outside the run loop's own steps
/// and read by the loop at its own points: `stop` by stop() (any thread, a
/// signal handler; read between steps and by a transaction before its next
/// handler call), `wake` by a worker whose unit ended (read before and after
/// each poll), `fault` by a librdkafka callback inside a poll (rethrown after
/// it; no commit meanwhile).
struct RunSignals {
    explicit RunSignals(std::chrono::milliseconds shutdown_timeout) noexcept : stop(shutdown_timeout) {}

    StopSignal stop;
    UnitWake wake;
    CallbackFault fault;
};

} // namespace idemkafka::detail
