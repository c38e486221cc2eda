#pragma once
// The dispatcher: which waiting records each free worker takes as its next
// unit of work, which lanes the busy units hold, and the Stage slots of the
// records decoded. Private to the library.

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "consumer/item.hpp"
#include "consumer/waiting_room.hpp"
#include "core/ledger.hpp"
#include "idemkafka/consumer.hpp"

namespace idemkafka::detail {

/// The units of work of the workers, and the lanes they hold.
///
/// A lane is a partition (Ordering::key: a key in its partition). Records
/// of one lane run in poll order, one unit at a time: a record whose lane
/// is in a busy unit waits in the waiting room until that unit is merged.
/// With Ordering::partition a partition's lane is PartitionState::unit
/// (1 + the worker, 0 when free); with Ordering::key and several workers the
/// busy lanes are a set here (one worker's next unit starts when no other
/// runs, so it finds every lane free). A unit holds at most unit_cap()
/// records and its worker's share of the known lanes.
///
/// A busy unit belongs to its worker until finish(): the poll thread only
/// marks its records dropped (drop_from) and reads it. Poll thread only.
///
/// The Stage slots: a record is decoded into a slot of its own (decode()),
/// which it holds (Item::lease) until it is destroyed or parked. There are
/// as many as the waiting room's limit and unit_cap() per worker
/// (reserve_slots()); a record decoded while it waits (decode_ahead()) must
/// leave the slots the free workers' next units need. The pool outlives the
/// units' records; the waiting room, whose records hold slots too, is to go
/// before the dispatcher.
class Dispatcher {
public:
    using Lane = std::pair<PartitionState*, KeyId>;

    /// What hand_out() needs of the engine.
    struct Hands {
        std::function<bool(std::size_t)> ready; ///< worker n can take a unit (it has a connection)
        std::function<void(Item&)> decode;      ///< decodes a record into its Stage slot (Item::slot)
        std::function<void(std::size_t)> start; ///< runs worker n's unit, just filled and marked busy
    };

    /// `unit_cap`: records per unit (max_batch spread over the workers).
    Dispatcher(Ordering ordering, std::size_t workers, std::size_t unit_cap, Hands hands);

    /// At start: the Stage slots of the records decoded, waiting or in units.
    void reserve_slots(std::size_t records) { slots_.emplace(records); }

    /// Gives the record a Stage slot and decodes it there; false when no slot
    /// is free.
    bool decode(Item& it);
    /// A record that waits may be decoded now (while the workers run): that
    /// leaves the slots the free workers' next units need. Records that
    /// wait without one are decoded when they are handed out.
    bool decode_ahead() const noexcept { return slots_->available() > free_workers() * unit_cap_; }

    /// The time budget of a unit, from its dispatch.
    void set_budget(std::chrono::milliseconds budget) noexcept { budget_ = budget; }

    std::size_t workers() const noexcept { return units_.size(); }
    std::size_t unit_cap() const noexcept { return unit_cap_; }
    std::size_t busy_units() const noexcept { return busy_count_; }
    std::size_t free_workers() const noexcept { return units_.size() - busy_count_; }
    bool busy(std::size_t n) const noexcept { return busy_[n]; }
    std::vector<Item>& unit(std::size_t n) noexcept { return units_[n]; }
    Clock::time_point deadline(std::size_t n) const noexcept { return deadlines_[n]; }

    /// A freed worker does not make a unit due by itself: the next unit
    /// fills (or waits max_batch_wait) first, as the circuit's probe does.
    void await_fill() noexcept { freed_ = false; }

    /// The waiting room or the free workers changed: dispatch again.
    void changed() noexcept { dirty_ = true; }
    bool dirty() const noexcept { return dirty_; } ///< changed since the last hand_out()

    /// Records wait for a free worker, and a unit is worth handing out now:
    /// a full one, the waiting room full, max_batch_wait over, a worker just
    /// freed, or a stop.
    bool due(const WaitingRoom& room, Clock::time_point now, std::chrono::milliseconds max_wait, bool stopping) const;

    /// Hands each free, ready worker its next unit from the waiting room:
    /// the waiting records whose lane is in no busy unit, in poll order, up
    /// to `cap` records and the worker's share of the lanes. `one` (the
    /// circuit's probe): a single unit, and only while no other runs.
    /// Returns the units handed out.
    std::size_t hand_out(WaitingRoom& room, std::size_t cap, bool one, Clock::time_point now);

    /// Worker n's unit ended (merged or dropped): its lanes are free again,
    /// `freed(partition)` for each partition lane. Before its holds are
    /// applied: a parked key's records may run again at once.
    template <class Freed> void release_lanes(std::size_t n, Freed&& freed)
    {
        const std::size_t mark = n + 1;
        const bool by_key = ordering_ == Ordering::key;
        if (by_key && units_.size() == 1)
            return; // no key lanes kept
        for (const auto& it : units_[n]) {
            if (by_key) {
                key_lanes_.erase(lane_of(it));
            } else if (it.part->unit == mark) {
                it.part->unit = 0;
                --busy_partitions_;
                freed(*it.part);
            }
        }
    }

    /// After release_lanes() and the merge: worker n is idle. Returns true
    /// when no unit a revoke abandoned is left.
    bool finish(std::size_t n);

    /// A rewind of `ps` to `offset`: records of busy units from there on come
    /// again from Kafka, so their outcome must not count when merged.
    void drop_from(const PartitionState* ps, std::int64_t offset);

    /// Worker n's unit was abandoned by a revoke: the states of revoked
    /// partitions live until it is finished.
    void retire(std::size_t n) { retire_waits_.insert(n); }

    /// Records in busy units, and their bytes.
    std::pair<std::size_t, std::size_t> in_units() const;

    /// The lane of a record.
    Lane lane_of(const Item& it) const;
    /// Lanes in busy units and those of the waiting records, each once.
    std::size_t lanes_known(const WaitingRoom& room) const;

private:
    void fill(std::size_t n, WaitingRoom& room, std::size_t cap, std::size_t lanes_per_unit);

    Ordering ordering_;
    std::size_t unit_cap_;
    Hands hands_;
    std::chrono::milliseconds budget_{120000};
    std::optional<SlotPool> slots_;        // before every record that may hold one of them
    std::vector<std::vector<Item>> units_; // per worker: its unit, empty when idle
    std::vector<Clock::time_point> deadlines_;
    std::vector<bool> busy_; // handed a unit not finished yet
    std::size_t busy_count_ = 0;
    std::size_t busy_partitions_ = 0;    // Ordering::partition: partitions marked busy
    std::set<Lane> key_lanes_;           // Ordering::key, several workers: lanes in busy units
    bool dirty_ = false;                 // the waiting room or the free workers changed since hand_out()
    bool freed_ = false;                 // a unit was finished since the last hand_out()
    std::set<std::size_t> retire_waits_; // units abandoned by a revoke, not finished yet
};

} // namespace idemkafka::detail
