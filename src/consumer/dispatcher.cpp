// Handing out units of work: which waiting records a free worker takes (its
// lanes, its share, free Stage slots), and the lanes the busy units hold.

#include "consumer/dispatcher.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace idemkafka::detail {

Dispatcher::Dispatcher(Ordering ordering, std::size_t workers, std::size_t unit_cap, Hands hands)
    : ordering_(ordering), unit_cap_(unit_cap), hands_(std::move(hands)), units_(workers), deadlines_(workers),
      busy_(workers, false)
{
}

bool Dispatcher::due(const WaitingRoom& room, Clock::time_point now, std::chrono::milliseconds max_wait,
                     bool stopping) const
{
    if (!dirty_ || room.empty() || busy_count_ == units_.size())
        return false;
    // A full unit, the waiting room full, the fill wait over, or a worker
    // just freed (hand it what there is rather than leave PostgreSQL idle).
    return freed_ || room.size() >= unit_cap_ || room.full() || now >= room.since() + max_wait || stopping;
}

std::size_t Dispatcher::hand_out(WaitingRoom& room, std::size_t cap, bool one, Clock::time_point now)
{
    dirty_ = false;
    if (one && busy_count_ > 0)
        return 0; // the probe runs alone
    // A unit takes at most its worker's share of the lanes: a slow call
    // holds back the later records of every lane in its unit, so one unit
    // must not take them all while other workers are free.
    // (With one worker its share is every lane: nothing to count.)
    std::size_t lanes_per_unit = SIZE_MAX;
    if (units_.size() > 1)
        lanes_per_unit = std::max<std::size_t>(1, (lanes_known(room) + units_.size() - 1) / units_.size());
    std::size_t sent = 0;
    for (std::size_t n = 0; n < units_.size() && !room.empty(); ++n) {
        if (busy_[n] || !hands_.ready(n))
            continue;
        fill(n, room, cap, lanes_per_unit);
        if (units_[n].empty())
            break; // every waiting record is behind a busy lane
        deadlines_[n] = now + budget_;
        busy_[n] = true;
        ++busy_count_;
        hands_.start(n);
        ++sent;
        if (one)
            break;
    }
    if (sent)
        freed_ = false;
    room.passed_over(now); // what is left waits behind busy lanes: a finish frees them
    return sent;
}

bool Dispatcher::decode(Item& it)
{
    const auto slot = slots_->acquire();
    if (!slot)
        return false;
    it.slot = *slot;
    it.lease = SlotLease(*slots_, *slot);
    hands_.decode(it);
    return true;
}

Dispatcher::Lane Dispatcher::lane_of(const Item& it) const
{
    if (ordering_ == Ordering::key)
        return {it.part, key_id(it.record.key)};
    return {it.part, KeyId()};
}

std::size_t Dispatcher::lanes_known(const WaitingRoom& room) const
{
    if (ordering_ == Ordering::partition) {
        std::vector<const PartitionState*> waiting; // partitions of waiting records in no busy unit
        waiting.reserve(room.size());
        for (const auto& it : room)
            if (it.part->unit == 0)
                waiting.push_back(it.part);
        std::sort(waiting.begin(), waiting.end(), std::less<>());
        return busy_partitions_ +
               static_cast<std::size_t>(std::unique(waiting.begin(), waiting.end()) - waiting.begin());
    }
    std::set<Lane> known(key_lanes_);
    for (const auto& it : room)
        known.insert(lane_of(it));
    return known.size();
}

void Dispatcher::fill(std::size_t n, WaitingRoom& room, std::size_t cap, std::size_t lanes_per_unit)
{
    auto& unit = units_[n];
    const std::size_t mark = n + 1; // PartitionState::unit of this unit's partitions
    const bool by_key = ordering_ == Ordering::key;
    const bool shared = units_.size() > 1; // other units may hold lanes
    std::size_t partitions = 0;            // Ordering::partition: lanes this unit took
    std::set<Lane> mine;                   // Ordering::key with several workers: lanes this unit took
    bool full = false;                     // the unit is complete: what follows waits, in order
    room.hand_out([&](Item& it) {
        if (full || unit.size() >= cap)
            return false;
        auto* ps = it.part;
        Lane lane;
        bool fits = true;
        if (!by_key) {
            fits = ps->unit == mark || (ps->unit == 0 && partitions < lanes_per_unit);
        } else if (shared) {
            lane = lane_of(it);
            fits = mine.count(lane) || (!key_lanes_.count(lane) && mine.size() < lanes_per_unit);
        }
        if (!fits)
            return false;
        if (!it.lease && !decode(it)) {
            full = true; // no slot left (they come back as units end)
            return false;
        }
        if (!by_key && ps->unit == 0) {
            ps->unit = mark;
            ++partitions;
            ++busy_partitions_;
        } else if (by_key && shared) {
            mine.insert(std::move(lane));
        }
        unit.push_back(std::move(it));
        return true;
    });
    key_lanes_.insert(mine.begin(), mine.end());
}

bool Dispatcher::finish(std::size_t n)
{
    units_[n].clear();
    busy_[n] = false;
    --busy_count_;
    dirty_ = freed_ = true;
    retire_waits_.erase(n);
    return retire_waits_.empty();
}

void Dispatcher::drop_from(const PartitionState* ps, std::int64_t offset)
{
    for (std::size_t n = 0; n < units_.size(); ++n)
        if (busy_[n])
            for (auto& it : units_[n])
                if (it.part == ps && it.record.offset >= offset)
                    it.dropped = true;
}

std::pair<std::size_t, std::size_t> Dispatcher::in_units() const
{
    std::size_t records = 0;
    std::size_t bytes = 0;
    for (const auto& unit : units_) {
        records += unit.size();
        for (const auto& it : unit)
            bytes += it.bytes();
    }
    return {records, bytes};
}

} // namespace idemkafka::detail
