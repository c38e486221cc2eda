#pragma once
// offsets_in_database: the positions this member keeps in PostgreSQL next
// to the claims, and its ownership epoch per partition, which fences a
// previous owner's late writes. Private to the library.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "consumer/claim_transaction.hpp"
#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/offset_store.hpp"
#include "kafka/group_member.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail {

class StoredPositions {
public:
    StoredPositions(const ConsumerConfig& cfg, const OffsetStore& store, PartitionLedger& ledger,
                    ClaimTransaction& claims, Metrics& metrics, LogSink log)
        : cfg_(cfg), store_(store), ledger_(ledger), claims_(claims), metrics_(metrics), log_(std::move(log))
    {
    }

    /// Takes `tps` over in the offset table (a new epoch for each, recorded
    /// in the ledger, which marks them verified) and returns where each must
    /// start, as an offset of its own: the stored position (one behind
    /// Kafka's is counted and logged: lost commits), else Kafka's committed
    /// offset, else the end auto.offset.reset names; never left to
    /// librdkafka's own fetch of the committed offset. Nothing when
    /// PostgreSQL is unavailable, or Kafka's committed offsets of a partition
    /// without a stored position cannot be read. On a connection of its own
    /// (opened when first needed): at an assignment the workers' connections
    /// may be busy with a running batch. `committed`: Kafka's committed
    /// offsets of `tps` when the caller has read them already, else read here.
    std::optional<std::map<TopicPartition, std::int64_t>> acquire(kafka::GroupMember& consumer,
                                                                  const std::vector<TopicPartition>& tps,
                                                                  const std::vector<OffsetCommit>* committed = nullptr);

    /// Partitions assigned while PostgreSQL was away (paused since): acquires
    /// them now and returns where each must be rewound to.
    std::map<PartitionState*, std::int64_t> verify(kafka::GroupMember& consumer);

    /// Closes the connection acquire() uses, so that the next one opens a new
    /// one: after the workers lost theirs it is most likely dead too (a
    /// failover), and a first attempt on it would only fail.
    void reconnect() noexcept { own_.disconnect(); }

    /// Kafka's committed offsets, by partition (offset_unknown: none known).
    using Committed = std::vector<std::pair<TopicPartition, std::int64_t>>;

    enum class Stored { yes, fenced, failed };
    /// Writes the merged positions of `moved` in a transaction of their own
    /// (per-key ordering over several workers). `fenced`: the table refused
    /// our epoch for some (see ClaimTransaction::take_fenced()).
    Stored store(Worker& w, const std::set<PartitionState*>& moved);

private:
    std::optional<std::vector<OffsetStore::Stored>> take_over(const std::vector<TopicPartition>& tps);
    std::vector<OffsetStore::Stored> take_over_once(const std::vector<std::pair<std::string, std::int32_t>>& wanted);
    void take_over_failed(const std::exception& e, bool lock_timeout);

    // acquire()'s work for one partition taken over, `st`: where its stored
    // position says it starts (a reconnect's lost positions too), noted in
    // the ledger's state of it (`ps`, null: none) ...
    std::optional<std::int64_t> stored_start(const OffsetStore::Stored& st, PartitionState* ps);
    // ... and where it starts, added to `target`; false when that is unknown
    // (Kafka's committed offset of a partition never stored not read).
    bool place(kafka::GroupMember& consumer, const OffsetStore::Stored& st, const Committed& committed,
               std::map<TopicPartition, std::int64_t>& target);
    std::optional<std::int64_t> start_without_position(kafka::GroupMember& consumer, const TopicPartition& tp,
                                                       std::int64_t kafka_offset);
    void report_start(const std::string& topic, std::int32_t partition, std::int64_t stored, std::int64_t kafka_offset);
    void lost_every_position(const PartitionState& ps);

    const ConsumerConfig& cfg_;
    const OffsetStore& store_;
    PartitionLedger& ledger_;
    ClaimTransaction& claims_;
    Metrics& metrics_;
    LogSink log_;
    pg::Session own_;                   // for acquire()
    std::set<TopicPartition> reported_; // the last acquire()'s starts logged as differing from Kafka's
};

} // namespace idemkafka::detail
