#include "consumer/stored_positions.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "pg/connect.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {
namespace {

using kafka::offset_invalid;

// Kafka's committed offsets of `tps`: `known` when the caller has them, else
// asked of the group; empty when unknown (the stored positions decide).
std::vector<std::pair<TopicPartition, std::int64_t>> committed_offsets(kafka::GroupMember& consumer,
                                                                       const std::vector<TopicPartition>& tps,
                                                                       const std::vector<OffsetCommit>* known)
{
    std::vector<std::pair<TopicPartition, std::int64_t>> committed;
    if (known) {
        for (const auto& c : *known)
            committed.push_back({c.tp, c.offset});
    } else {
        for (const auto& tp : tps)
            committed.push_back({tp, offset_invalid});
        if (!consumer.committed(committed, std::chrono::milliseconds(10000)))
            committed.clear(); // unknown: the stored positions decide
    }
    return committed;
}

} // namespace

std::optional<std::map<TopicPartition, std::int64_t>> StoredPositions::acquire(kafka::GroupMember& consumer,
                                                                               const std::vector<TopicPartition>& tps,
                                                                               const std::vector<OffsetCommit>* known)
{
    const auto stored = take_over(tps);
    if (!stored)
        return std::nullopt;
    const auto committed = committed_offsets(consumer, tps, known);
    std::map<TopicPartition, std::int64_t> target;
    for (const auto& st : *stored) {
        auto* ps = ledger_.find(st.topic, st.partition);
        std::optional<std::int64_t> next = st.next_offset;
        if (!next && ps && ps->began_at >= 0 && ps->position() > ps->began_at) {
            // Taken again after a reconnect: this member processed records
            // of the partition, and stored their positions with them, but
            // the server has none (a failover to a standby without any of
            // them). Kafka's committed offset may have moved past them: they
            // are processed again from where this member began.
            next = ps->began_at;
            lost_every_position(*ps);
        }
        if (ps) {
            ps->epoch = st.epoch;
            ps->position_verified = true;
            ps->stored_next = next.value_or(-1);
        }
        if (!next)
            continue; // never stored: Kafka's committed offset decides
        std::int64_t kafka_offset = offset_invalid;
        for (const auto& [tp, offset] : committed)
            if (tp.topic == st.topic && tp.partition == st.partition && offset != kafka::offset_unknown)
                kafka_offset = offset;
        if (*next == kafka_offset)
            continue;
        // The database decides, also when it is behind Kafka: every kind of
        // progress is stored before Kafka hears of it, so behind means
        // commits PostgreSQL lost (a failover to a standby without them, a
        // restored backup) or an offset reset in Kafka. The records in
        // between come again; those whose claims survived are duplicates.
        target[{st.topic, st.partition}] = *next;
        if (ps) {
            ps->start_offset = *next; // for the lag gauge
            ps->start_known = true;
        }
        report_start(st.topic, st.partition, *next, kafka_offset);
    }
    return target;
}

// The offset table's part of acquire(), on the poll thread's own connection:
// new epochs and the stored positions; nullopt when PostgreSQL failed.
std::optional<std::vector<OffsetStore::Stored>> StoredPositions::take_over(const std::vector<TopicPartition>& tps)
{
    std::vector<std::pair<std::string, std::int32_t>> wanted;
    wanted.reserve(tps.size());
    for (const auto& tp : tps)
        wanted.emplace_back(tp.topic, tp.partition);
    try {
        if (!own_.db) {
            own_.connect(cfg_.postgres);
            const pg::Watch::Armed armed(own_.watch, cfg_.db_timeout);
            pg::require_own_session(*own_.db, cfg_.postgres);
            pg::set_session(*own_.db, "lock_timeout", std::to_string(cfg_.lock_timeout.count())); // ms
            pg::guard_session(*own_.db);
        }
        // On the poll thread: a frozen server must not stop the polling.
        const pg::Watch::Armed armed(own_.watch, locking_bound(cfg_));
        pqxx::work tx(*own_.db);
        pg::open_for_writes(tx, cfg_.lock_timeout);
        std::optional<std::vector<OffsetStore::Stored>> stored = store_.acquire(tx, cfg_.group_id, wanted);
        tx.commit();
        return stored;
    } catch (const std::exception& e) {
        emit(log_, LogLevel::warning,
             fmt::format("cannot read stored positions, partitions wait for PostgreSQL: {}", e.what()), "consumer",
             {{log_field::error, e.what()}});
        if (own_.watch.take_fired())
            metrics_.db_timeouts.add();
        if (own_.db && !own_.db->is_open())
            own_.disconnect();
        return std::nullopt;
    }
}

// Counts and warns of a partition that acquire() found without any stored
// position though this member had processed it.
void StoredPositions::lost_every_position(const PartitionState& ps)
{
    metrics_.positions_lost.add();
    emit(log_, LogLevel::warning,
         fmt::format("{}/{}: PostgreSQL has no stored position, though this member processed the partition from "
                     "offset {} on (it is at {}): PostgreSQL lost the positions it stored (a failover to a standby "
                     "without them), or none was stored yet; the records from offset {} on are processed again "
                     "(those whose claims survived are skipped as duplicates)",
                     ps.tp.topic, ps.tp.partition, ps.began_at, ps.position(), ps.began_at),
         "consumer",
         {{log_field::topic, ps.tp.topic},
          {log_field::partition, std::to_string(ps.tp.partition)},
          {"began_at", std::to_string(ps.began_at)},
          {"position", std::to_string(ps.position())}});
}

// Logs where a partition starts from its stored position: behind Kafka's
// committed offset is counted and warned about (lost commits or a reset).
void StoredPositions::report_start(const std::string& topic, std::int32_t partition, std::int64_t stored,
                                   std::int64_t kafka_offset)
{
    if (kafka_offset >= 0 && stored < kafka_offset) {
        metrics_.positions_behind_kafka.add();
        metrics_.records_behind_kafka.add(static_cast<std::uint64_t>(kafka_offset - stored));
        emit(log_, LogLevel::warning,
             fmt::format("{}/{}: the stored position {} is behind Kafka's committed offset {}: PostgreSQL lost "
                         "commits (a failover to a standby without them, a restored backup) or the group's "
                         "offsets were reset in Kafka; the {} records in between are processed again (those "
                         "whose claims survived are skipped as duplicates). To skip records, move the stored "
                         "position: idemkafka-admin offsets set",
                         topic, partition, stored, kafka_offset, kafka_offset - stored),
             "consumer",
             {{log_field::topic, topic},
              {log_field::partition, std::to_string(partition)},
              {"stored", std::to_string(stored)},
              {"committed", std::to_string(kafka_offset)}});
    } else {
        emit(log_, LogLevel::info,
             fmt::format("{}/{} starts at stored position {} (Kafka committed {})", topic, partition, stored,
                         kafka_offset),
             "consumer", coordinates(topic, partition, stored));
    }
}

std::map<PartitionState*, std::int64_t> StoredPositions::verify(kafka::GroupMember& consumer)
{
    std::vector<TopicPartition> unverified;
    for (const auto& [tp, ps] : ledger_)
        if (!ps.position_verified)
            unverified.push_back(tp);
    std::map<PartitionState*, std::int64_t> rewinds;
    if (unverified.empty())
        return rewinds;
    const auto target = acquire(consumer, unverified);
    if (!target)
        return rewinds;
    for (const auto& tp : unverified) {
        auto* ps = ledger_.find(tp.topic, tp.partition);
        if (!ps)
            continue;
        if (auto t = target->find(tp); t != target->end()) {
            if (ps->position() != t->second)
                rewinds[ps] = t->second;
        } else if (ps->stored_next >= 0 && ps->position() > ps->stored_next) {
            // Level with Kafka's committed offset but behind what this member
            // processed: PostgreSQL lost commits whose offsets had not reached
            // Kafka yet (acquire() tells only positions behind Kafka's).
            emit(log_, LogLevel::warning,
                 fmt::format("{}/{}: the stored position {} is behind this member's position {}: PostgreSQL lost "
                             "commits (a failover to a standby without them); the {} records in between are "
                             "processed again (those whose claims survived are skipped as duplicates)",
                             tp.topic, tp.partition, ps->stored_next, ps->position(), ps->position() - ps->stored_next),
                 "consumer",
                 {{log_field::topic, tp.topic},
                  {log_field::partition, std::to_string(tp.partition)},
                  {"stored", std::to_string(ps->stored_next)},
                  {"position", std::to_string(ps->position())}});
            rewinds[ps] = ps->stored_next;
        }
    }
    return rewinds;
}

StoredPositions::Stored StoredPositions::store(Worker& w, const std::set<PartitionState*>& moved)
{
    std::vector<OffsetStore::Position> positions;
    for (auto* ps : moved)
        if (ps->position() >= 0)
            positions.push_back({ps->tp.topic, ps->tp.partition, ps->position(), ps->epoch});
    if (!w.db) {
        // Lost in this batch (by another worker, too): the engine reconnects;
        // the positions go with the partition's next batch.
        emit(log_, LogLevel::warning,
             "positions not stored: no PostgreSQL connection (records are redelivered and deduplicated)", "consumer");
        return Stored::failed;
    }
    try {
        const pg::Watch::Armed armed(w.watch, locking_bound(cfg_));
        pqxx::work tx(*w.db);
        pg::open_for_writes(tx, cfg_.lock_timeout);
        claims_.write_positions(tx, positions);
        tx.commit();
        for (auto* ps : moved)
            ps->stored_next = std::max(ps->stored_next, ps->position());
        return Stored::yes;
    } catch (const Fenced&) {
        return Stored::fenced;
    } catch (const std::exception& e) {
        emit(log_, LogLevel::warning,
             fmt::format("storing positions failed (records are redelivered and deduplicated): {}", e.what()),
             "consumer", {{log_field::error, e.what()}});
        if (w.watch.take_fired())
            metrics_.db_timeouts.add();
        if (!w.db->is_open())
            w.disconnect();
        return Stored::failed;
    }
}

} // namespace idemkafka::detail
