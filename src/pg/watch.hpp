#pragma once
// A client-side deadline on the library's own PostgreSQL calls. A server that
// froze (SIGSTOP, a paused VM, a storage stall, a COMMIT waiting on a dead
// synchronous standby) still has its kernel acknowledge every packet, so
// neither keepalives nor tcp_user_timeout end the wait, and statement_timeout
// is enforced by the frozen server itself. A Watch bounds such a wait from
// this side: while it is armed and its deadline passes, one process-wide
// thread shuts the connection's socket down (shutdown(2), not close: the
// descriptor stays the connection's), so the blocked libpq call returns at
// once as a lost connection and the caller reconnects. What was in flight is
// rolled back by the server when it notices, or (a COMMIT) in doubt, which
// redelivery and the claims settle. Private to the library.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <pqxx/pqxx>

#include "pg/kept_work.hpp"

namespace idemkafka::detail::pg {

/// The deadline of one connection's calls. attach() it to a connection right
/// after connecting and detach() it (or destroy it) before the connection is
/// closed; arm() and disarm() are two atomic stores, cheap enough for every
/// handler call. Thread safety: arm/disarm/take_fired from the thread using
/// the connection; cut() from any thread.
class Watch {
public:
    Watch() = default;
    ~Watch() { detach(); }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

    /// Watches `db`'s socket as it is now (a connection libpqxx 6 re-opens by
    /// itself gets a new socket, which the watch then leaves alone). Disarmed.
    void attach(const pqxx::connection& db);
    /// Stops watching; after it returns the socket is never touched again.
    void detach() noexcept;

    /// From now on, a call still running `limit` from now has its connection
    /// cut. A zero or negative limit disarms.
    void arm(std::chrono::milliseconds limit) noexcept;
    void disarm() noexcept { deadline_.store(0, std::memory_order_relaxed); }
    /// True once if the deadline cut the connection since the last call.
    bool take_fired() noexcept { return fired_.exchange(false); }
    /// Cuts the connection now (a forced stop). False when nothing is attached.
    bool cut() noexcept;

    /// arm() for a scope: the previous deadline comes back when it ends.
    class Armed {
    public:
        Armed(Watch& w, std::chrono::milliseconds limit) noexcept
            : w_(w), previous_(w.deadline_.load(std::memory_order_relaxed))
        {
            w_.arm(limit);
        }
        ~Armed() { w_.deadline_.store(previous_, std::memory_order_relaxed); }
        Armed(const Armed&) = delete;
        Armed& operator=(const Armed&) = delete;

    private:
        Watch& w_;
        std::int64_t previous_;
    };

    /// disarm() for a scope (a handler call: its duration is the handler's):
    /// the deadline is re-armed with `limit` from the end of the scope.
    class Paused {
    public:
        Paused(Watch& w, std::chrono::milliseconds limit) noexcept : w_(w), limit_(limit) { w_.disarm(); }
        ~Paused() { w_.arm(limit_); }
        Paused(const Paused&) = delete;
        Paused& operator=(const Paused&) = delete;

    private:
        Watch& w_;
        std::chrono::milliseconds limit_;
    };

private:
    friend class Watchdog;
    std::atomic<std::int64_t> deadline_{0}; // steady-clock nanoseconds; 0: disarmed
    std::atomic<bool> fired_{false};
    // The socket and its identity when attached: the watchdog's, under its lock.
    int fd_ = -1;
    std::uint64_t dev_ = 0, ino_ = 0;
    bool attached_ = false; // the owning thread's
};

/// How long a call of a background thread (maintenance, the outbox relay,
/// the claim-age gauge) may still run once its owner stops it before its
/// connection is cut: the owner's stop() is bounded while PostgreSQL is frozen.
constexpr std::chrono::milliseconds stop_grace{2000};

/// A library connection, the watch of its calls, and the work kept on it
/// (claim transactions: KeptWork).
struct Session {
    std::unique_ptr<pqxx::connection> db;
    Watch watch;   // declared after db: detached before db closes
    KeptWork kept; // declared after both: dropped while they are there

    Session() = default;
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;
    ~Session() { disconnect(); }

    /// A new connection to `conninfo` (pg::connect), watched, not armed.
    void connect(const std::string& conninfo);
    /// No connection. A kept work goes without a round trip: the socket is
    /// cut first, so its ROLLBACK fails at once (the server rolls back what
    /// was open when it sees the connection gone).
    void disconnect() noexcept;
};

} // namespace idemkafka::detail::pg
