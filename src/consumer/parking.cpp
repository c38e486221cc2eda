#include "consumer/parking.hpp"

#include <algorithm>
#include <utility>

namespace idemkafka::detail {

void Parking::hold(PartitionState* ps, const KeyId& key, Clock::time_point until)
{
    auto [k, fresh] = by_partition_[ps].try_emplace(key);
    keys_ += fresh ? 1 : 0;
    k->second.until = std::max(k->second.until, until);
}

bool Parking::parked(PartitionState* ps, std::optional<std::string_view> key) const
{
    auto p = by_partition_.find(ps);
    return p != by_partition_.end() && p->second.count(key_id(key)) > 0;
}

void Parking::add(Item&& it)
{
    auto [slot, new_key] = by_partition_[it.part].try_emplace(key_id(it.record.key));
    keys_ += new_key ? 1 : 0; // parked() said so already; counted all the same
    auto& k = slot->second;
    PartitionLedger::park(*it.part, it.record.offset);
    records_ += 1;
    bytes_ += it.bytes();
    // A fresh item: the record is decoded again when it runs again.
    Item fresh;
    fresh.record = it.record; // points into msg, which moves with it
    fresh.msg = std::move(it.msg);
    fresh.part = it.part;
    auto [pos, added] = k.records.emplace(fresh.record.offset, std::move(fresh));
    if (!added) {
        // The same record twice (cannot happen: a rewind drops what it brings
        // again); keep one and the counts right.
        records_ -= 1;
        bytes_ -= pos->second.bytes();
    }
}

void Parking::forget(const Item& it) noexcept
{
    records_ -= 1;
    bytes_ -= it.bytes();
}

void Parking::take_due(Clock::time_point now, std::vector<Item>& out)
{
    for (auto p = by_partition_.begin(); p != by_partition_.end();) {
        auto& keys = p->second;
        for (auto k = keys.begin(); k != keys.end();) {
            if (k->second.until > now) {
                ++k;
                continue;
            }
            for (auto& [offset, it] : k->second.records) {
                forget(it);
                out.push_back(std::move(it));
            }
            k = keys.erase(k);
            --keys_;
        }
        p = keys.empty() ? by_partition_.erase(p) : std::next(p);
    }
}

void Parking::drop_from(PartitionState* ps, std::int64_t offset)
{
    auto p = by_partition_.find(ps);
    if (p == by_partition_.end())
        return;
    for (auto& [key, k] : p->second) {
        auto first = k.records.lower_bound(offset);
        for (auto r = first; r != k.records.end(); ++r)
            forget(r->second);
        k.records.erase(first, k.records.end());
    }
}

void Parking::drop(PartitionState* ps)
{
    auto p = by_partition_.find(ps);
    if (p == by_partition_.end())
        return;
    for (auto& [key, k] : p->second)
        for (auto& [offset, it] : k.records)
            forget(it);
    keys_ -= p->second.size();
    by_partition_.erase(p);
}

PartitionState* Parking::fullest() const
{
    PartitionState* out = nullptr;
    std::size_t most = 0;
    for (const auto& [ps, keys] : by_partition_) {
        std::size_t n = 0;
        for (const auto& [key, k] : keys)
            n += k.records.size();
        if (n > most) {
            most = n;
            out = ps;
        }
    }
    return out;
}

} // namespace idemkafka::detail
