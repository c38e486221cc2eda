#pragma once
// A worker of the consumer, split by what it holds: its PostgreSQL
// connection (pg::Session), its share of a batch and the outcome the poll
// thread merges (BatchOutcome), the scratch of its batch handler calls
// (CallScratch), the tallies the circuit breaker learns from (CallTallies),
// and the handler call running now (RunningCall, for the poll thread's
// watch). ClaimTransaction writes them; the engine reads the outcome.
// Private to the library.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "consumer/item.hpp"
#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "observe/log_context.hpp"
#include "pg/watch.hpp"

namespace idemkafka::detail {

/// The handler call a worker runs now, for the poll thread's watch over
/// calls that do not return (a call cannot be interrupted: only seen). The
/// worker marks each call's start and end (an uncontended lock); the poll
/// thread reads it now and then.
class RunningCall {
public:
    /// What runs: since when, and its (first) record.
    struct Seen {
        Clock::time_point since;
        std::string where;       // topic/partition@offset
        LogFields fields;        // its log fields
        std::size_t records = 1; // a batch handler call's records
    };

    /// `first` (of `records` in one call) runs from now; it must stay alive until end().
    void begin(const Item& first, std::size_t records = 1) noexcept
    {
        std::lock_guard<std::mutex> lock(mu_);
        item_ = &first;
        records_ = records;
        since_ = Clock::now();
    }
    /// The call returned (or threw).
    void end() noexcept
    {
        std::lock_guard<std::mutex> lock(mu_);
        item_ = nullptr;
    }
    /// The call running now, if any.
    std::optional<Seen> seen() const
    {
        std::lock_guard<std::mutex> lock(mu_); // the item lives until end()
        if (!item_)
            return std::nullopt;
        return Seen{since_, item_->where(), item_->log_fields(), records_};
    }

private:
    mutable std::mutex mu_;
    const Item* item_ = nullptr;
    std::size_t records_ = 0;
    Clock::time_point since_{};
};

/// Marks a handler call in a RunningCall for its scope.
class CallScope {
public:
    CallScope(RunningCall& call, const Item& first, std::size_t records = 1) noexcept : call_(call)
    {
        call_.begin(first, records);
    }
    ~CallScope() { call_.end(); }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

private:
    RunningCall& call_;
};

/// A worker's share of a batch and what became of it, for the poll thread
/// to merge. Reset before each batch (except `fenced`, which the engine
/// clears when it has acted on it).
struct BatchOutcome {
    std::vector<std::size_t> items; // indices into the batch, in batch order
    Holds holds;
    BatchInfo info;
    bool failed = false; // nothing of this worker's final transaction committed
    bool lost_connection = false;
    bool abandoned = false; // a forced stop abandoned it
    // Set by the poll thread: a rebalance took partitions of this worker's
    // records while a handler call ran past revoke_wait; its transaction
    // rolls back at the next chance. Cleared when its outcome is merged.
    std::atomic<bool> revoked{false};
    bool fenced = false;      // the offset table refused our epoch: we lost a partition
    std::exception_ptr error; // an unexpected exception, rethrown on the poll thread
    // offsets_in_database: the positions the final transaction stored, for
    // the poll thread to note in their states after the batch.
    std::vector<std::pair<PartitionState*, std::int64_t>> stored;
    // Every transaction of the batch that committed, in order: one, or with
    // several per unit (ConsumerConfig::transaction_per_record,
    // batches_per_unit) each of them (also where a later one failed).
    // after_db_commit is called for each.
    std::vector<BatchInfo> commits;
};

/// A batch handler's calls within one attempt: the records gathered for the
/// call, and whether the batch runs one record a call (after a failed call).
struct CallScratch {
    bool one_by_one = false;             // batch handler: one call per record (after a failed batch call)
    std::vector<std::size_t> call_items; // batch handler: the records of the call
    std::vector<std::size_t> call_slots; // and their Stage slots
    std::vector<Context> call_contexts;
};

/// What the handler calls of the last transaction tell the circuit breaker.
struct CallTallies {
    std::size_t calls_ok = 0;        // handler calls (records) of the last transaction that returned normally
    std::size_t calls_recovered = 0; // of them, those of records that had failed before
    // While the circuit breaker blames keys: those of the calls_ok calls.
    bool watch_keys = false;
    std::vector<std::uint64_t> ok_keys;
};

/// A worker: one PostgreSQL connection (its calls bounded by
/// ConsumerConfig::db_timeout through the session's watch) and, per batch,
/// its share of the records and their outcome.
struct Worker : pg::Session, BatchOutcome {
    // The session's settings as open_for_writes_sql() leaves them
    // (pg::session_state(), read at prepare()), and whether a handler may
    // have changed them since: until a claim transaction's COMMIT reads them
    // unchanged (pg::commit_armed()), every claim transaction puts them back
    // first.
    std::string clean_session;
    bool session_dirty = true;
    // Several transactions per unit (ConsumerConfig::transaction_per_record,
    // batches_per_unit): the records whose transaction the last COMMIT's
    // text began, with their claim (see ClaimTransaction::commit()); that
    // transaction is open on the server.
    struct Chained {
        std::vector<std::size_t> first; // into the batch: Attempt::first
        std::vector<EventId> claimed;
    };
    std::optional<Chained> chained;
    // Several transactions per unit: the records before this position of
    // `items` are done or held (for good: holds only grow within a batch),
    // so the search for the next transaction's records starts here.
    std::size_t settled = 0;
    // A COMMIT that carried the next transaction's claim failed: whether it
    // committed is not known, so its records run again with a COMMIT of
    // their own, and what failed is then told apart.
    bool chain_failed = false;
    // ConsumerConfig::optimistic_claims: claims still to make with ON
    // CONFLICT before one is made as new again (claims_before_optimism after
    // one met a claimed id).
    std::size_t claims_on_conflict = 0;
    CallScratch scratch;
    CallTallies tallies;
    RunningCall call; // the handler call running now

    /// Ready for the next batch: no records, no holds but `holds`, no outcome.
    void reset(const Holds& initial);
};

} // namespace idemkafka::detail
