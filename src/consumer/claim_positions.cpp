// offsets_in_database in the claim transaction: the positions a commit
// stores next to its claims, and the partitions whose write the offset
// table refused (a stale epoch: another member owns them now).

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"

namespace idemkafka::detail {

// Next offset per partition of the worker: past every record of this batch
// that is not held (all of them are finished when the transaction commits),
// up to `upto`.
std::vector<OffsetStore::Position> positions_of(const BatchOutcome& w, const std::vector<Item>& items,
                                                std::vector<std::pair<PartitionState*, std::int64_t>>* of,
                                                std::size_t upto)
{
    std::map<PartitionState*, OffsetStore::Position> by_part;
    for (std::size_t i : w.items) {
        const auto& it = items[i];
        if (i > upto)
            break; // w.items is in batch order
        if (held(w.holds, it))
            continue;
        auto& p = by_part[it.part];
        if (p.topic.empty()) {
            p.topic = std::string(it.record.topic);
            p.partition = it.record.partition;
            p.epoch = it.part->stored.epoch;
        }
        p.next_offset = std::max(p.next_offset, it.record.offset + 1);
    }
    std::vector<OffsetStore::Position> out;
    for (auto& [ps, p] : by_part) {
        if (of)
            of->emplace_back(ps, p.next_offset);
        out.push_back(std::move(p));
    }
    return out;
}

void ClaimTransaction::write_positions(pqxx::transaction_base& tx, const std::vector<OffsetStore::Position>& positions)
{
    const auto fenced = s_.offsets->write(tx, s_.cfg.group_id, positions);
    if (fenced.empty())
        return;
    s_.metrics.fenced_writes.add(fenced.size());
    {
        std::lock_guard<std::mutex> lock(fenced_mu_);
        for (const auto& p : fenced)
            fenced_.push_back({p.topic, p.partition});
    }
    for (const auto& p : fenced)
        say(s_.log, LogLevel::error,
            {{log_field::topic, p.topic},
             {log_field::partition, std::to_string(p.partition)},
             {"epoch", std::to_string(p.epoch)}},
            "position write for {}/{} refused: epoch {} is stale, another member owns the partition now; rolling back "
            "this transaction",
            p.topic, p.partition, p.epoch);
    throw Fenced{};
}

std::vector<TopicPartition> ClaimTransaction::take_fenced()
{
    std::lock_guard<std::mutex> lock(fenced_mu_);
    return std::exchange(fenced_, {});
}

} // namespace idemkafka::detail
