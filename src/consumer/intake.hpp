#pragma once
// What happens to a polled record before any transaction: decoding into the
// Stage, the checks that send a record to the dead letter without running
// the handler (null, empty or too large payload, no usable event id), dead
// letters settled earlier in the assignment, and the dedup-horizon guard.
// Private to the library.

#include <atomic>
#include <optional>
#include <vector>

#include "consumer/item.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/retention.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail {

class Intake {
public:
    Intake(const ConsumerConfig& cfg, Stage& stage, Metrics& metrics, LogSink log)
        : cfg_(cfg), stage_(stage), metrics_(metrics), log_(std::move(log))
    {
    }

    /// The claims table's layout as found at start-up: the guard follows it
    /// (a plain table kept from before has no reason to refuse non-v7 ids).
    void set_layout(RetentionMode layout);

    /// Decodes `batch` into the Stage's slots from `first_slot` on, one per
    /// record; records that cannot run are marked for the dead letter
    /// (counted later, by screen()).
    void decode(std::vector<Item>& batch, std::size_t first_slot);

    /// Decodes one record into its Stage slot (Item::slot).
    void decode(Item& it);

    /// Before the record runs (on the worker that runs it; thread-safe): a record
    /// whose dead letter was written in this assignment is done; one whose
    /// dead letter was refused goes to the dead letter again, as it was (its
    /// handler does not run again); a poison record is counted; the others
    /// pass the dedup-horizon guard, which may mark them for the dead letter
    /// or for the reconcile hook (Item::reconcile).
    /// A record whose failures already reached max_attempts (counted by an
    /// earlier owner of its partition, whose dead letter did not get through)
    /// goes to the dead letter without another handler call.
    void screen(Item& it, PartitionLedger& ledger);

    /// Share groups: a record's failure count is its delivery count less one
    /// (lock expiries and members' deaths included), not handler failures
    /// alone, so reaching max_attempts is no reason by itself to dead-letter.
    void count_deliveries() noexcept { failures_are_handlers_ = false; }

private:
    void exhausted(Item& it, int failures);
    void apply_horizon(Item& it);
    void explain_default_once(DeadLetterReason reason);

    const ConsumerConfig& cfg_;
    Stage& stage_;
    Metrics& metrics_;
    LogSink log_;
    std::optional<HorizonGuard> guard_;
    bool failures_are_handlers_ = true;
    std::atomic<bool> non_v7_explained_{false};
    std::atomic<bool> horizon_explained_{false};
};

} // namespace idemkafka::detail
