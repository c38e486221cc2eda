#pragma once
// The records of a batch, as the engine, the claim transaction and the
// dead-letterer see them. Private to the library.

#include <cstddef>
#include <string>

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

/// One polled record on its way through a batch.
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

} // namespace idemkafka::detail
