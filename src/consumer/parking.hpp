#pragma once
// Per-key parking (Ordering::key): a record whose handler failed waits out
// its retry backoff in memory with the later records of its key, while the
// partition's other keys go on. The partition's committed position stays at
// the lowest parked record (PartitionState::parked) until it is finished.
// Private to the library.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "consumer/item.hpp"
#include "core/ledger.hpp"

namespace idemkafka::detail {

class Parking {
public:
    /// At most `max_records` records and `max_bytes` key and payload bytes
    /// are parked at once.
    Parking(std::size_t max_records, std::size_t max_bytes) : max_records_(max_records), max_bytes_(max_bytes) {}

    /// Parks `key` of `ps` until `until` (the later deadline wins): its
    /// records polled meanwhile wait with it.
    void hold(PartitionState* ps, const KeyId& key, Clock::time_point until);
    /// True when `key` of `ps` is parked now.
    bool parked(PartitionState* ps, std::optional<std::string_view> key) const;
    /// True when more records or bytes are parked than the bound allows.
    bool over() const noexcept { return records_ > max_records_ || bytes_ > max_bytes_; }
    /// The partition with the most parked records (null when none is parked).
    PartitionState* fullest() const;
    /// Adds `it` to the records of its key, which must be parked; the
    /// ledger keeps the position at or before it.
    void add(Item&& it);
    /// Moves the records of every key whose backoff is over to the end of
    /// `out`, each key's in offset order, as fresh (undecoded) items. The
    /// ledger still counts them as parked until they are finished.
    void take_due(Clock::time_point now, std::vector<Item>& out);
    /// Forgets the parked records of `ps` from `offset` on (a rewind brings
    /// them again from Kafka); their keys stay parked until their deadline.
    void drop_from(PartitionState* ps, std::int64_t offset);
    /// Forgets everything of `ps` (revoked, or taken over by a partition hold).
    void drop(PartitionState* ps);

    std::size_t records() const noexcept { return records_; }
    std::size_t bytes() const noexcept { return bytes_; }
    /// Keys parked now, over every partition.
    std::size_t keys() const noexcept { return keys_; }
    bool empty() const noexcept { return by_partition_.empty(); }

private:
    struct Key {
        Clock::time_point until{};
        std::map<std::int64_t, Item> records; // by offset
    };
    using Keys = std::map<KeyId, Key>;

    void forget(const Item& it) noexcept;

    std::size_t max_records_;
    std::size_t max_bytes_;
    std::size_t records_ = 0;
    std::size_t bytes_ = 0;
    std::size_t keys_ = 0;
    std::map<PartitionState*, Keys> by_partition_;
};

} // namespace idemkafka::detail
