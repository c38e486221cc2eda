#pragma once
// A polled record on its way through the consumer (Item), and the Stage
// slots decoded records hold. Private to the library.

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/ledger.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/dead_letter.hpp"
#include "idemkafka/event_id.hpp"
#include "kafka/client.hpp"
#include "observe/log_context.hpp"
#include "observe/trace.hpp"

namespace idemkafka::detail {

enum class ItemState {
    pending, // to be claimed and handled
    poison,  // to be dead-lettered
    done,    // finished: committed, a duplicate, or dead-lettered
};

/// The Stage slots of the records in memory, handed out and taken back on
/// the poll thread only.
class SlotPool {
public:
    explicit SlotPool(std::size_t slots)
    {
        free_.reserve(slots); // release() never allocates
        for (std::size_t i = slots; i-- > 0;)
            free_.push_back(i);
    }
    std::size_t available() const noexcept { return free_.size(); }
    std::optional<std::size_t> acquire()
    {
        if (free_.empty())
            return std::nullopt;
        const auto slot = free_.back();
        free_.pop_back();
        return slot;
    }
    void release(std::size_t slot) noexcept { free_.push_back(slot); }

private:
    std::vector<std::size_t> free_;
};

/// A Stage slot a record holds: given back when the record is destroyed or
/// let go (parked). Move-only, like the record.
class SlotLease {
public:
    SlotLease() = default;
    SlotLease(SlotPool& pool, std::size_t slot) noexcept : pool_(&pool), slot_(slot) {}
    SlotLease(SlotLease&& other) noexcept : pool_(std::exchange(other.pool_, nullptr)), slot_(other.slot_) {}
    SlotLease& operator=(SlotLease&& other) noexcept
    {
        if (this != &other) {
            reset();
            pool_ = std::exchange(other.pool_, nullptr);
            slot_ = other.slot_;
        }
        return *this;
    }
    SlotLease(const SlotLease&) = delete;
    SlotLease& operator=(const SlotLease&) = delete;
    ~SlotLease() { reset(); }

    void reset() noexcept
    {
        if (pool_)
            pool_->release(slot_);
        pool_ = nullptr;
    }
    explicit operator bool() const noexcept { return pool_ != nullptr; }

private:
    SlotPool* pool_ = nullptr;
    std::size_t slot_ = 0;
};

/// One polled record on its way through a unit of work.
struct Item {
    kafka::MessagePtr msg; // owns what `record` points into (null for a record not from Kafka)
    Record record;
    EventId id;
    ItemState state = ItemState::pending;
    PartitionState* part = nullptr;
    DeadLetterReason reason = DeadLetterReason::decode_error;
    std::string error; // why it is poison; after a handler failure, that failure
    bool key_window_open = true;
    bool reconcile = false;   // beyond the dedup horizon: the reconcile hook decides
    bool retry_later = false; // held for another try before any transaction
    std::size_t slot = 0;     // of the decoded event in the Stage
    SlotLease lease;          // holds `slot` (the engine's records; not touched by workers)
    int attempts = -1;        // for the dead letter; -1: from the failure count
    int retry_failures = 0;   // with retry_later: failures so far, for the backoff
    // Set by the poll thread (never read by a worker): a rewind of its
    // partition to or before it overtook it while its unit ran, so it comes
    // again from Kafka and its outcome must not count.
    bool dropped = false;

    /// Marks the record for the dead letter. Counted when the record is handed
    /// to the workers: one decoded and then dropped by a rewind is not counted twice.
    void poison(DeadLetterReason why, std::string what)
    {
        state = ItemState::poison;
        reason = why;
        error = std::move(what);
    }

    /// The fields of a log line about this record: coordinates, event id
    /// (when decoded) and `what` (when not empty).
    LogFields log_fields(std::string_view what = {}) const
    {
        auto fields = coordinates(record.topic, record.partition, record.offset);
        if (!id.is_nil())
            fields.push_back({log_field::event_id, id.to_string()});
        if (auto parent = trace_parent_of(record.headers))
            fields.push_back({log_field::trace_id, std::string(trace_id_of(*parent))});
        return what.empty() ? fields : error_field(what, std::move(fields));
    }

    /// "topic/partition@offset" of this record.
    std::string where() const { return coords(record.topic, record.partition, record.offset); }

    /// Key and payload bytes, for the in-flight gauge.
    std::size_t bytes() const noexcept
    {
        return (record.key ? record.key->size() : 0) + (record.value ? record.value->size() : 0);
    }
};

/// True when `holds` stop this record: a hold of its partition, or of its
/// key (Ordering::key parking).
inline bool held(const Holds& holds, const Item& it)
{
    return holds.covers(it.part, it.record.offset, it.record.key);
}

/// True when this record is still to run: pending and not stopped by `holds`.
inline bool to_run(const Holds& holds, const Item& it)
{
    return it.state == ItemState::pending && !held(holds, it);
}

} // namespace idemkafka::detail
