#pragma once
// When the group member's periodic offset commits wait: pure logic, no
// client. Private to the library.

#include <atomic>
#include <chrono>

namespace idemkafka::detail::kafka {

/// Holds the periodic offset commits while the group rebalances (the classic
/// protocol only) and while an asynchronous commit waits for its answer (see
/// GroupMember::commits_held()).
///
/// Invariant: a rebalance hold lasts from a commit refused for a rebalance,
/// or a revoke, until the assignment that ends this member's part in the
/// rebalance (after a cooperative revoke that is not a loss, the assignment
/// after the next one), and at most session.timeout.ms; there is none under
/// the consumer protocol (KIP-848). An asynchronous commit holds from its
/// sending until its answer, at most session.timeout.ms, so no more than one
/// is in flight. held() may be called from any thread; the rest is called
/// by the thread that polls.
class CommitHold {
public:
    using Clock = std::chrono::steady_clock;

    /// session.timeout.ms and the group protocol: set before the client exists.
    void configure(std::chrono::milliseconds session_timeout, bool consumer_protocol) noexcept
    {
        session_timeout_ = session_timeout;
        consumer_protocol_ = consumer_protocol;
    }
    std::chrono::milliseconds session_timeout() const noexcept { return session_timeout_; }

    /// Holds the commits for a rebalance, until `now` plus session.timeout.ms
    /// at most; true when the hold began now (none was on).
    bool hold(Clock::time_point now) noexcept
    {
        if (consumer_protocol_)
            return false; // KIP-848 has no generation of the whole group; librdkafka retries stale epochs itself
        return held_until_.exchange((now + session_timeout_).time_since_epoch().count()) == 0;
    }
    /// Partitions are revoked: a rebalance is under way. After a cooperative
    /// one that is not a loss, librdkafka calls the assign of the partitions
    /// added to this member, then rejoins for the rebalance's second round.
    void revoked(bool cooperative, bool lost, Clock::time_point now) noexcept
    {
        hold(now);
        assigns_before_release_ = cooperative && !lost ? 1 : 0;
    }
    /// Partitions are assigned; true when that ended a hold.
    bool assigned(Clock::time_point now) noexcept
    {
        if (assigns_before_release_ > 0) {
            // The assign that follows a cooperative revoke: this member
            // rejoins next, and the group moves on to another generation.
            --assigns_before_release_;
            hold(now);
            return false;
        }
        return held_until_.exchange(0) != 0;
    }

    /// An asynchronous commit was sent at `now`, or its answer came (or it
    /// could not be sent).
    void async_sent(Clock::time_point now) noexcept { async_sent_at_ = now.time_since_epoch().count(); }
    void async_answered() noexcept { async_sent_at_ = 0; }

    /// True while the periodic commits wait.
    bool held(Clock::time_point now) const noexcept
    {
        const auto at = now.time_since_epoch().count();
        const auto until = held_until_.load();
        const auto sent = async_sent_at_.load();
        return (until != 0 && at < until) || (sent != 0 && at < sent + Clock::duration(session_timeout_).count());
    }

private:
    std::chrono::milliseconds session_timeout_{45000};
    bool consumer_protocol_ = false;
    // Until when the rebalance hold lasts, as steady_clock ticks (0: none).
    std::atomic<Clock::rep> held_until_{0};
    // When the asynchronous commit waiting for its answer was sent (0: none).
    std::atomic<Clock::rep> async_sent_at_{0};
    // Assignments still to come before the hold ends (see revoked()).
    int assigns_before_release_ = 0;
};

} // namespace idemkafka::detail::kafka
