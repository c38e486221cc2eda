#pragma once
// The circuit breaker's judgement, with no I/O: whether handler failures are
// an outage (a downstream service down: every record fails) rather than the
// records' own fault. Workers report their handler attempts; the engine asks
// what to do (pause everything, probe, resume) and carries it out through
// the Kafka adapter. Thread-safe. Private to the library.
//
// States: closed (failures count toward max_attempts) -> open (the
// evidence below was seen; nothing runs until the backoff is over) ->
// probing (one probe batch runs) -> closed when a handler call of the probe
// succeeded, or open again, for a doubled backoff, when it only failed.
//
// A probe tells an outage from poison only with records that had not failed
// before. Its failures of keys that failed before (the suspects: the keys of
// the evidence, and those that failed in earlier probes) prove nothing on
// their own: poison at the heads of several partitions, with healthy records
// behind it, would otherwise hold the circuit open for good, every probe
// meeting the same poison first. So a probe in which only suspects failed
// stays probing, with no backoff: the records that failed in it wait the
// circuit's last backoff (round_wait()), and the next batches go past them.
// This round of probes ends, open again for the backoff, at a failure of a
// key not yet suspect (an outage reaches every record), at a probe that
// brought nothing but suspects failing again in this round (nothing else
// could run: every partition held by them), or past 10 x probe_records
// failures in the round (an outage over many keys is not probed at full
// speed).
//
// When a probe's success closes the circuit, its suspects are blamed: the
// handler works, so their records may fail on their own. Until one of their
// records succeeds (succeeded_on()), a failure of theirs opens the circuit
// only at a record's last attempt: poison that had waited out the circuit
// comes back all at once and fails in a burst, before the successes of
// records running beside it are reported (once per transaction), and would
// otherwise open the circuit again, have its attempts forgiven, and never
// be dead-lettered. By its last attempt the successes are in: the evidence
// is judged as usual, and an outage that came back (nothing succeeding)
// still opens it. Opening again makes them suspects again, and convicts
// them (and the blamed keys failing beside them): when a probe's success
// closes the circuit once more before one of their records succeeded, the
// handler has worked twice while they failed, so their failures are no
// evidence any more, only their own (counted, dead-lettered after
// max_attempts). Without this, poison among healthy records that trickle in
// (its retries outnumbering their successes) would open the circuit at each
// last attempt, be forgiven, and never be dead-lettered.
//
// A flapping downstream (a share of all calls failing at random) fails
// records of many keys, and with enough of them one fails at all its
// attempts by chance. At a record's last attempt the circuit also opens when
// the window shows it: at least min_keys keys failing in min_partitions
// partitions, and since the oldest failure in the window at least min_keys
// records that had failed succeeded, as many as failure_ratio / 2 of all
// successes (about the chance a call fails, for records that are not
// poison; poison never succeeds, and a healthy handler rarely needs a
// retry).
//
// When nothing but failing records is left to run, no probe can succeed:
// after `give_up_after` open since it opened from closed, the circuit gives
// up telling poison from an outage. The probes' failures count toward
// max_attempts from then on (failed() says counted), and a probe in which
// only suspects failed passes whatever else it saw, so that they are
// dead-lettered; a key not yet suspect failing still opens it again.
//
// The evidence, judged at each failure: failures within `window` on at
// least `min_keys` keys in `min_partitions` partitions, where each of those
// keys failed as most attempts did: since the key began failing, at least
// `failure_ratio` of all handler attempts failed (a key that keeps failing
// while the handler works for other records is its own problem, not
// evidence); and at least `min_attempts` attempts since the first of them
// began. Successes are counts, not times: a busy stretch before an outage
// does not hide it, and a poison record among healthy ones sees healthy
// successes after its first failure. Per failure O(log n + min_keys +
// min_attempts + partitions failing), per report of successes O(1).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/backoff.hpp"
#include "idemkafka/config.hpp"

namespace idemkafka::detail {

class Circuit {
public:
    using Clock = std::chrono::steady_clock;
    using milliseconds = std::chrono::milliseconds;

    enum class State { closed, open, probing };

    /// What a handler failure is to its record.
    enum class Verdict {
        counted, ///< closed: the record's own failure, toward max_attempts
        probe,   ///< probing: not counted; the rest of the probe batch goes on
        outage,  ///< open: not counted; the worker gives its remaining records back
    };

    /// What opened the circuit.
    struct Evidence {
        std::size_t attempts = 0;
        std::size_t failures = 0;
        std::size_t keys = 0;       // distinct, counted up to what was needed
        std::size_t partitions = 0; // likewise
        milliseconds span{0};       // from the oldest failure counted to the last
        milliseconds wait{0};       // before the first probe
        // A flapping downstream: records that had failed and then succeeded
        // since the oldest failure counted (0: opened by the keys' evidence).
        std::size_t recovered = 0;
        std::string last_error;
    };

    /// What a probe batch showed.
    struct Probe {
        enum class Outcome {
            closed,    ///< a handler call succeeded: everything resumes
            reopened,  ///< calls failed and none succeeded: open again for `wait`
            unsettled, ///< no handler call ran (duplicates only, or nothing): probe again
            passed,    ///< only suspects failed, and something else was tried: probe on past them
        } outcome = Outcome::unsettled;
        std::size_t successes = 0;
        std::size_t failures = 0;
        std::size_t new_keys = 0; // of `failures`, those of keys not suspect before
        std::size_t skipped = 0;  // records settled without a handler call (duplicates)
        milliseconds wait{0};
        milliseconds open_for{0};  // closed: since the circuit opened; else gave_up: likewise
        bool counted = false;      // its failures counted toward max_attempts (the circuit gave up)
        bool gave_up = false;      // the first probe since the circuit gave up
        std::size_t blamed = 0;    // closed: the suspects, blamed from now on
        std::size_t convicted = 0; // closed: of them, those whose failures are no evidence any more
        std::string last_error;
    };

    explicit Circuit(const CircuitBreaker& settings);

    Circuit(const Circuit&) = delete;
    Circuit& operator=(const Circuit&) = delete;

    bool enabled() const noexcept { return s_.enabled; }

    // ---- the workers ----------------------------------------------------------

    /// `calls` handler calls returned normally (one per record, also within a
    /// batch handler call), `recovered` of them for records that had failed
    /// before (a counted failure). Reported once per transaction, not per
    /// record, before that transaction's failure, if any.
    void succeeded(std::size_t calls, std::size_t recovered = 0);
    /// While blaming(): the keys (as failed() has them) of handler calls that
    /// returned normally; they are no longer blamed.
    void succeeded_on(const std::vector<std::uint64_t>& keys);
    /// Whether some keys are blamed (see above): a hint, read without a lock,
    /// for whether succeeded_on() is worth its work.
    bool blaming() const noexcept { return blame_.any(); }
    /// `records` of a transaction were settled without a handler call
    /// (duplicates): a probe that had them tried more than its failures.
    void skipped(std::size_t records);
    /// A retryable handler failure at `now` of a record whose key (a record
    /// without one: the record itself) is `key` in `partition` (opaque ids;
    /// `key` already tells partitions apart). May open the circuit; for a
    /// blamed key only at the record's `last_attempt` (the one that would
    /// dead-letter it). Probing after give_up_after: counted (and still the
    /// probe's).
    Verdict failed(std::uint64_t partition, std::uint64_t key, std::string_view what, Clock::time_point now,
                   bool last_attempt = false);

    // ---- the poll thread ------------------------------------------------------

    State state() const;
    /// How long a record that failed in a probe waits before it runs again:
    /// the backoff the circuit last waited, so that the rest of the round
    /// goes past it.
    milliseconds round_wait() const;
    /// Once after the circuit opened from closed: what it saw.
    std::optional<Evidence> take_opened();
    /// True once when the circuit is open and its backoff is over: it is
    /// probing from now on.
    bool probe_due(Clock::time_point now);
    /// After a batch that ran while probing: closes (a handler call
    /// succeeded), opens again (calls failed and none succeeded, unless
    /// passed), or stays probing (nothing ran, or passed: see above).
    Probe settle_probe(Clock::time_point now);

private:
    using Keys = std::unordered_set<std::uint64_t>;

    // The evidence window, while closed: the failures within `window` and
    // the streaks of their keys, and the counts of every failure and success
    // judged while closed. Invariant: `streaks_` holds exactly the keys with
    // a failure in `window_` (in_window: how many), and `order_` and
    // `partitions_` hold one place per streak. Guarded by the circuit's mutex.
    class Window {
    public:
        explicit Window(const CircuitBreaker& settings) : s_(settings) {}

        /// `calls` successes, `recovered` of them of records that had failed.
        void succeeded(std::size_t calls, std::size_t recovered);
        /// Forgets what fell out of the window by `now` (made no earlier than
        /// the last failure: workers report out of order by a little), and
        /// returns that `now`.
        Clock::time_point advance(Clock::time_point now);
        /// A failure, into the window and its key's streak.
        void track(std::uint64_t partition, std::uint64_t key, Clock::time_point now);
        /// The keys' evidence (see above), without last_error and wait.
        std::optional<Evidence> judge(Clock::time_point now) const;
        /// The evidence of a flapping downstream (see above), likewise.
        std::optional<Evidence> flapping(Clock::time_point now) const;
        /// The keys with failures in the window.
        template <class F> void for_each_key(F&& f) const
        {
            for (const auto& streak : streaks_)
                f(streak.first);
        }
        /// A fresh start: the failures forgotten, the counts kept.
        void clear();

    private:
        struct Failure {
            Clock::time_point at;
            std::uint64_t key;
            // The counts just before it.
            std::uint64_t failures_before;
            std::uint64_t successes_before;
            std::uint64_t recovered_before;
        };
        // Keys are ordered by (1 - r) x failures_before - r x successes_before
        // (r: failure_ratio): a key failed as most attempts did since it began
        // failing exactly when that is at most (1 - r) x failures_ - r x
        // successes_, so the keys that are evidence are a prefix of the order.
        using Order = std::multimap<double, std::uint64_t>;
        struct Streak {
            std::uint64_t partition;
            std::uint64_t failures_before;  // failures_ when the key began failing
            std::uint64_t successes_before; // successes_ likewise
            Clock::time_point since;
            std::size_t in_window; // its failures within the window; none: the streak ends
            Order::iterator order;
            std::multiset<double>::iterator in_partition;
        };

        void forget_oldest();

        const CircuitBreaker& s_;
        std::deque<Failure> window_;                        // the failures within the window, oldest first
        std::unordered_map<std::uint64_t, Streak> streaks_; // the keys with failures in the window
        Order order_;
        // Per partition, the places in the order of its keys in `streaks_`.
        std::unordered_map<std::uint64_t, std::multiset<double>> partitions_;
        std::uint64_t failures_ = 0;  // every failure judged while closed
        std::uint64_t successes_ = 0; // every success reported while closed
        std::uint64_t recovered_ = 0; // of them, those of records that had failed before
    };

    // The probes since the circuit opened from closed: the tallies of the
    // probe batch in flight, the round of probes (since it last opened), and
    // the suspects. Invariant: every key of `round_` is a suspect; the
    // tallies are zero outside a probe. Guarded by the circuit's mutex.
    class Probes {
    public:
        /// What one probe batch saw.
        struct Tally {
            std::size_t successes = 0;
            std::size_t failures = 0;
            std::size_t new_keys = 0; // of `failures`, those of keys not suspect before
            std::size_t repeats = 0;  // failures of keys that failed before in this round
            std::size_t skipped = 0;
        };

        explicit Probes(std::size_t probe_records) : limit_(10 * std::max<std::size_t>(1, probe_records)) {}

        /// A probe batch begins.
        void begin() { tally_ = Tally{}; }
        void succeeded(std::size_t calls) { tally_.successes += calls; }
        void skipped(std::size_t records) { tally_.skipped += records; }
        /// A failure of `key` in the probe: a suspect from now on.
        void failed(std::uint64_t key);
        /// The probe batch's tallies, zeroed.
        Tally take() { return std::exchange(tally_, Tally{}); }
        /// Whether a probe that saw `t` stays probing past its failures:
        /// only suspects failed, none again in this round unless something
        /// else was tried, and the round is within its limit; `given_up`:
        /// whenever only suspects failed.
        bool passes(const Tally& t, bool given_up) const;
        /// The circuit opened from closed: `suspects` (the keys blamed till
        /// then) and the keys of the evidence, added by suspect().
        void opened(Keys suspects);
        void suspect(std::uint64_t key) { suspects_.insert(key); }
        /// A probe's success closed the circuit: its suspects, forgotten here.
        Keys closed();
        /// The round ends: open again for a backoff.
        void end_round();

    private:
        const std::size_t limit_; // of failures in a round
        Tally tally_;
        // The keys that failed since the circuit opened from closed (the
        // evidence's and the probes'), and those that failed in a probe of this
        // round (since it last opened).
        Keys suspects_;
        Keys round_;
        std::size_t round_failures_ = 0;
    };

    // The blame, while closed: the suspects when a probe's success last
    // closed the circuit, until they succeed, and of them the convicted.
    // Invariant: blaming_ == !blamed_.empty() || !convicted_.empty() whenever
    // the circuit's mutex is free; convicted keys stay convicted across
    // openings until they succeed.
    class Blame {
    public:
        /// Read without a lock.
        bool any() const noexcept { return blaming_.load(std::memory_order_relaxed); }
        bool blamed(std::uint64_t key) const { return blamed_.count(key) != 0; }
        bool convicted(std::uint64_t key) const { return convicted_.count(key) != 0; }
        /// Blamed keys opened it again at a last attempt: if the handler
        /// works once more before they do, they are poison (a blamed `key`
        /// is convicted; bounded).
        void convict(std::uint64_t key);
        /// The circuit opened: the blamed keys, suspects again.
        Keys take_blamed();
        /// A probe's success closed it: `suspects` are blamed from now on.
        /// Returns how many are blamed (bounded), and of them convicted.
        std::pair<std::size_t, std::size_t> blame(Keys suspects);
        /// Their records succeeded: no longer blamed.
        void succeeded_on(const std::vector<std::uint64_t>& keys);

    private:
        void update() { blaming_.store(!blamed_.empty() || !convicted_.empty(), std::memory_order_relaxed); }

        Keys blamed_; // the suspects when it last closed, until they succeed
        // Blamed keys that opened it again at a last attempt (they and the
        // blamed keys failing beside them), until they succeed: blamed again,
        // their failures are no evidence.
        Keys convicted_;
        std::atomic<bool> blaming_{false};
    };

    Verdict probe_failed(std::uint64_t key, Clock::time_point now);
    void open(Evidence evidence, Clock::time_point now);

    const CircuitBreaker s_;
    mutable std::mutex mu_;
    State state_ = State::closed;
    Window window_;
    Probes probes_;
    Blame blame_;
    GrowingBackoff backoff_;
    Clock::time_point opened_at_{};  // when it last opened from closed
    Clock::time_point probe_at_{};   // open: when the backoff is over
    std::optional<Evidence> opened_; // not yet taken
    milliseconds round_wait_{0};     // the last backoff
    bool given_up_ = false;          // open past give_up_after: the probes' failures count
    bool given_up_told_ = false;     // a settled probe has said so
    std::string last_error_;
};

/// "closed", "open", "probing".
const char* to_string(Circuit::State state) noexcept;

} // namespace idemkafka::detail
