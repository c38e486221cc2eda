#pragma once
// The partition ledger: what the consumer knows about each assigned
// partition, with no I/O. It answers "is this polled record stale?", "what
// may be committed now?", "what must be seeked, paused or resumed?"; the
// engine carries the answers out through the Kafka adapter. Private to the
// library.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/backoff.hpp"
#include "core/offset_set.hpp"
#include "idemkafka/dead_letter.hpp"

namespace idemkafka::detail {

using Clock = std::chrono::steady_clock;

struct TopicPartition {
    std::string topic;
    std::int32_t partition = 0;

    friend bool operator<(const TopicPartition& a, const TopicPartition& b)
    {
        return a.partition != b.partition ? a.partition < b.partition : a.topic < b.topic;
    }
    friend bool operator==(const TopicPartition& a, const TopicPartition& b)
    {
        return a.partition == b.partition && a.topic == b.topic;
    }
};

/// A partition's name without a copy of its topic, to look a TopicPartition
/// up by (PartitionLedger::find, once per polled record).
struct TopicPartitionView {
    std::string_view topic;
    std::int32_t partition = 0;
};

/// TopicPartition's order, also between a TopicPartition and a view of one.
struct TopicPartitionLess {
    using is_transparent = void;
    template <class A, class B> bool operator()(const A& a, const B& b) const noexcept
    {
        return a.partition != b.partition ? a.partition < b.partition
                                          : std::string_view(a.topic) < std::string_view(b.topic);
    }
};

/// An offset commit of one partition: the next offset to process and the
/// commit's metadata (the failures of records at or after it).
struct OffsetCommit {
    TopicPartition tp;
    std::int64_t offset = -1;
    std::string metadata;
};

/// The handler failures of the records at or after `from` as the metadata of
/// an offset commit, so that they survive a rebalance or a crash with the
/// position they belong to: "idemkafka.failures=<offset>:<failures>,..." (the
/// lowest offsets first, as many as fit in 1,000 bytes). Empty when none.
std::string failures_metadata(const std::map<std::int64_t, int>& failures, std::int64_t from);
/// What failures_metadata() wrote; other metadata (another tool's) gives none.
std::map<std::int64_t, int> parse_failures_metadata(std::string_view metadata);

/// A dead letter the broker refused: sent again, as it was, before anything
/// else is done with its record (the handler does not run again).
struct DeadLetterDue {
    DeadLetterReason reason = DeadLetterReason::handler_failed;
    std::string error;
    int attempts = 0;
    int refusals = 0;
};

/// What a partition's ledger knows of a polled record before it runs again.
struct RecordHistory {
    bool dead_lettered = false;       ///< its dead letter was acknowledged in this assignment: done
    std::optional<DeadLetterDue> due; ///< its dead letter was refused: it goes there again, as it was
    int failures = 0;                 ///< its handler failures, counted here or inherited
};

/// One assigned partition. Offsets are Kafka offsets; -1 means none yet.
struct PartitionState {
    /// What the lag gauge and the fetch-stall guard keep of the partition.
    struct Lag {
        std::int64_t start_offset = -1; // committed offset at assignment (for the lag gauge)
        bool start_known = false;
        Clock::time_point assigned_at = Clock::now(); // statistics from before are of an earlier owner
        // The fetch-stall guard: when a record last arrived (or the partition was
        // last paused, busy, or found with nothing to fetch), and whether it is
        // reported as stalled now.
        Clock::time_point fetched_at = assigned_at;
        bool stalled = false;
        // (offset, timestamp ms) of each record taken, in offset order, for the lag
        // in seconds: the engine's thread appends (note_taken()) and the lag gauge
        // drops what lies before the position, so its front is the first
        // unconsumed record. Bounded by max_taken_times.
        std::deque<std::pair<std::int64_t, std::int64_t>> taken_times;
        // The position the lag gauge saw last and since when (for stalled_seconds).
        std::int64_t seen_position = -2;
        Clock::time_point seen_position_at = Clock::now();
    };

    /// offsets_in_database: the positions this member stores in PostgreSQL.
    struct Stored {
        std::int64_t epoch = 0; // our ownership epoch
        bool verified = true;   // stored position applied
        std::int64_t next = -1; // the position last stored (or read) in PostgreSQL
        bool retake = false;    // take the partition over again when the pause ends
        int fenced = 0;         // position writes refused in a row
        // The lowest offset taken of the partition in this assignment: where it
        // is processed again from when, after a reconnect, PostgreSQL has none of
        // the positions this member stored.
        std::int64_t began_at = -1;
    };

    /// A rewind and the retry backoff (or fence) that may follow it.
    struct Rewind {
        std::int64_t resume_from = -1; // after a rewind, polled records before it are stale
        bool needs_seek = false;       // a rewind whose seek has not been sent yet
        bool paused = false;           // waiting out a retry backoff (or a fence)
        Clock::time_point resume_at{};
    };

    /// Dead letters of this assignment. Guarded like `failures`.
    struct DeadLetters {
        std::set<std::int64_t> acknowledged;       // acknowledged dead letters of this assignment
        std::map<std::int64_t, DeadLetterDue> due; // refused ones
    };

    TopicPartition tp;
    std::int64_t processed_next = -1; // next offset after the last processed record
    std::int64_t committed_next = -1; // last next-offset handed to an offset commit
    Rewind rewind;
    Lag lag;
    // The engine's, with Ordering::partition: 1 + the worker whose unit of
    // work holds records of this partition (one unit at a time), 0 when none.
    std::size_t unit = 0;
    bool retired = false; // revoked while a unit still pointed to it (PartitionLedger::revoke)
    Stored stored;
    // Ordering::key: offsets taken out of the partition's order (a parked
    // key's records, also once handed back to a batch) and not finished
    // yet. The committed position stays at the lowest of them.
    std::set<std::int64_t> parked;
    // Offsets taken for processing (polled and admitted) whose outcome has
    // not been merged yet, for continuous dispatch: a record can wait behind
    // one of its key while later records of other keys are handed out and
    // finish, and units are merged in whatever order they finish, while
    // complete() moves processed_next past the highest finished offset. The
    // committed position stays at the lowest of them. Taken in poll order
    // (ascending) and mostly merged in that order: an OffsetSet.
    OffsetSet in_flight;

    /// The position that may be committed: past every finished record, and
    /// at or before every unfinished one (-1: nothing yet).
    std::int64_t position() const noexcept
    {
        if (processed_next < 0)
            return processed_next;
        auto p = processed_next;
        if (!parked.empty())
            p = std::min(p, *parked.begin());
        if (!in_flight.empty())
            p = std::min(p, in_flight.lowest());
        return p;
    }

    // Guarded by PartitionLedger's failures lock while workers run.
    std::map<std::int64_t, int> failures; // handler failures by offset
    bool failures_dirty = false;          // `failures` changed since the last commit took them
    DeadLetters dead_letters;
};

/// Where a partition must stop in a batch: records from `offset` on are not
/// committed and come again after a rewind (and, for `failures` > 0, a
/// backoff).
struct Hold {
    std::int64_t offset;
    int failures;
    /// At least this long before the held records run again (besides the
    /// retry backoff of `failures`): a probe of the open circuit holds the
    /// records that failed in it past the rest of its round.
    std::chrono::milliseconds wait{0};
};

/// A record key as parking tells keys apart: a null key is a key of its own.
using KeyId = std::optional<std::string>;

inline KeyId key_id(std::optional<std::string_view> key)
{
    return key ? KeyId(std::in_place, *key) : KeyId();
}

/// The holds of one batch (or of one worker's share of it). A partition
/// hold stops the whole partition; a key hold (Ordering::key, after a
/// handler failure) stops only the records of one key of it: they are
/// parked, and the partition's other keys go on.
class Holds {
public:
    using KeyHolds = std::map<std::pair<PartitionState*, KeyId>, Hold>;

    /// Holds `ps` at `offset` or earlier; the larger failure count wins.
    void add(PartitionState* ps, std::int64_t offset, int failures,
             std::chrono::milliseconds wait = std::chrono::milliseconds(0));
    /// Holds the records of `key` in `ps` from `offset` (or earlier) on.
    void park(PartitionState* ps, std::optional<std::string_view> key, std::int64_t offset, int failures,
              std::chrono::milliseconds wait = std::chrono::milliseconds(0));
    /// Every hold of `other` added to these.
    void merge(const Holds& other);
    /// True when the record at `offset` of `ps` is held by a partition hold.
    bool covers(const PartitionState* ps, std::int64_t offset) const;
    /// True when the record at `offset` of `ps` with `key` is held by a
    /// partition hold or by a hold of its key.
    bool covers(PartitionState* ps, std::int64_t offset, std::optional<std::string_view> key) const;
    /// True when a partition hold stops `ps`.
    bool holds(const PartitionState* ps) const { return by_partition_.count(ps) > 0; }
    bool empty() const noexcept { return by_partition_.empty() && by_key_.empty(); }
    void clear() noexcept
    {
        by_partition_.clear();
        by_key_.clear();
    }
    /// The partition holds.
    auto begin() const { return by_partition_.begin(); }
    auto end() const { return by_partition_.end(); }
    /// The key holds.
    const KeyHolds& keys() const noexcept { return by_key_; }

private:
    std::map<PartitionState*, Hold, std::less<>> by_partition_;
    KeyHolds by_key_;
};

/// What a poll result is to the consumer.
enum class Admission {
    foreign, // not (or no longer) assigned: dropped
    stale,   // fetched before a rewind to a later offset: dropped, it comes again
    take,    // to be processed
};

class PartitionLedger {
public:
    /// retry: the backoff of a partition held after handler failures;
    /// fence: of a partition whose position write was refused.
    PartitionLedger(Backoff retry, Backoff fence) : retry_(retry), fence_(fence) {}

    PartitionLedger(const PartitionLedger&) = delete;
    PartitionLedger& operator=(const PartitionLedger&) = delete;

    // ---- assignment -------------------------------------------------------

    /// A newly assigned partition starts empty: nothing processed, nothing
    /// held. An existing state is replaced.
    PartitionState& assign(const TopicPartition& tp);
    /// Forgets revoked (or lost) partitions entirely. With `retire`, their
    /// states stay in memory, owned by no one, until release_retired(): a
    /// batch still running in the workers may point to them.
    void revoke(const std::set<TopicPartition>& tps, bool retire = false);
    /// Frees the states of partitions retired by revoke().
    void release_retired() noexcept { retired_.clear(); }
    /// True when `ps` is the state of a partition assigned now (not retired).
    static bool owns(const PartitionState* ps) noexcept { return !ps->retired; }
    PartitionState* find(std::string_view topic, std::int32_t partition);
    bool empty() const noexcept { return parts_.empty(); }
    std::size_t size() const noexcept { return parts_.size(); }
    auto begin() { return parts_.begin(); }
    auto end() { return parts_.end(); }
    auto begin() const { return parts_.begin(); }
    auto end() const { return parts_.end(); }

    // ---- polling and rewinds ------------------------------------------------

    /// Whether a polled record at `offset` of `ps` is processed. The first
    /// record at or past a rewind point (it may be past it: the point can be
    /// a transaction marker or a deleted offset) shows the seek took effect.
    static Admission admit(PartitionState* ps, std::int64_t offset) noexcept;
    /// Records of `ps` from `offset` on come again: polled ones before the
    /// seek are stale, and parked ones from `offset` on are no longer
    /// parked (they come again too). The caller seeks and reports with
    /// seek_sent().
    static void rewind(PartitionState& ps, std::int64_t offset) noexcept;
    /// The record at `offset` of `ps` was taken out of the partition's order
    /// (Ordering::key parking): the position stays at or before it until it
    /// is finished.
    static void park(PartitionState& ps, std::int64_t offset)
    {
        ps.in_flight.erase(offset);
        ps.parked.insert(offset);
    }
    /// The record at `offset` of `ps` was taken for processing: until its
    /// outcome is merged (complete(), park(), drop() or a rewind at or before
    /// it), the position stays at or before it, whatever finishes after it.
    static void take(PartitionState& ps, std::int64_t offset) { ps.in_flight.insert(offset); }
    /// The record at `offset` of `ps`, taken, has `timestamp_ms` (-1: unknown):
    /// kept for the lag in seconds. A record that comes again after a rewind
    /// replaces what was noted from its offset on.
    static void note_taken(PartitionState& ps, std::int64_t offset, std::int64_t timestamp_ms);
    /// Seconds from the timestamp of the first record of `ps` not yet
    /// processed (its position) to `now_ms`; 0 when `lag` is 0; -1 when that
    /// record has not been polled or has no timestamp. Drops the noted times
    /// before the position.
    static double lag_seconds(PartitionState& ps, std::int64_t lag, std::int64_t now_ms);
    /// The record at `offset` of `ps` was taken and comes again unfinished
    /// (a give-back, or a rewind that overtook it while it ran): it no
    /// longer holds the position back.
    static void drop(PartitionState& ps, std::int64_t offset) noexcept { ps.in_flight.erase(offset); }
    /// The seek of a rewind was sent (or queued): no need to send it again.
    static void seek_sent(PartitionState& ps) noexcept { ps.rewind.needs_seek = false; }

    /// What the consumer must do to one partition after a batch.
    struct Action {
        PartitionState* ps;
        bool pause; // for a retry backoff, after the seek
    };
    /// Rewinds each held partition to its hold, and starts a retry backoff for
    /// holds after failures. The caller seeks each (to ps->rewind.resume_from) and
    /// pauses those with `pause`. Holds on retired partitions are not ours
    /// to apply: they are skipped.
    std::vector<Action> apply(const Holds& holds, Clock::time_point now);
    /// The record at `offset` of `ps` is finished (committed in PostgreSQL, or
    /// dead-lettered): the partition's position moves past it.
    void complete(PartitionState& ps, std::int64_t offset);
    /// After completions: forgets acknowledged dead letters behind the position.
    void trim(PartitionState& ps);

    /// Partitions whose rewind still needs its seek, and partitions whose
    /// retry backoff is over (to be resumed). A resumed partition taken over
    /// again after a fence is unverified until the engine verifies it.
    struct Due {
        std::vector<PartitionState*> seek;
        std::vector<PartitionState*> resume;
    };
    Due due(Clock::time_point now);

    /// A refused position write (offsets_in_database): pauses `tp` for a
    /// backoff that grows with each refusal in a row, then it is taken over
    /// again. Returns the wait, or nothing when the partition is not ours or
    /// already waiting.
    std::optional<std::chrono::milliseconds> fence(const TopicPartition& tp, Clock::time_point now);

    // ---- commits -----------------------------------------------------------

    /// Positions (next offsets) that moved, or whose records' failures
    /// changed, since they were last handed to a commit, of every partition
    /// or only of `only`, each with its failures_metadata(); they count as
    /// handed over. A partition with nothing processed yet commits its start
    /// offset (as committed at the assignment) when only its failures changed.
    std::vector<OffsetCommit> take_commits(const std::set<TopicPartition>* only);
    /// A commit of `offset` for `tp` failed: the next take_commits() sends it again.
    void commit_failed(std::string_view topic, std::int32_t partition, std::int64_t offset);

    // ---- failures and dead letters (thread-safe: workers call these) ---------

    /// The attempt the next handler call of the record is: 1 + its failures.
    int attempt_of(PartitionState& ps, std::int64_t offset);
    /// Counts one failure of the record; returns its failures so far.
    int count_failure(PartitionState& ps, std::int64_t offset);
    void forget_failures(PartitionState& ps, std::int64_t offset);
    /// Failures counted by earlier owners of the partition (the committed
    /// offset's metadata), for records at or after `from`; a record keeps
    /// the larger count. Returns how many records had any.
    std::size_t inherit_failures(PartitionState& ps, const std::map<std::int64_t, int>& failures, std::int64_t from);
    /// Forgets the failures of every record (the circuit breaker took them
    /// for an outage's). Not while workers run.
    void forgive_failures();
    /// The dead letter of the record was acknowledged.
    void dead_lettered(PartitionState& ps, std::int64_t offset);
    /// The dead letter of the record was refused; returns the refusals so far.
    int dead_letter_refused(PartitionState& ps, std::int64_t offset, DeadLetterReason reason, const std::string& error,
                            int attempts);
    /// Before a polled record runs (again): its dead letter and its failures.
    RecordHistory history_of(const PartitionState& ps, std::int64_t offset);

    /// Backoff after `failures` handler failures or dead-letter refusals.
    std::chrono::milliseconds retry_backoff(int failures) const noexcept { return retry_.after(failures); }

private:
    using Parts = std::map<TopicPartition, PartitionState, TopicPartitionLess>;
    Parts parts_;
    std::vector<Parts::node_type> retired_; // same addresses as before
    Backoff retry_;
    Backoff fence_;
    std::mutex failures_mu_;
};

} // namespace idemkafka::detail
