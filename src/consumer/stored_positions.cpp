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
StoredPositions::Committed committed_offsets(kafka::GroupMember& consumer, const std::vector<TopicPartition>& tps,
                                             const std::vector<OffsetCommit>* known)
{
    StoredPositions::Committed committed;
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
    reported_.clear();
    std::size_t unknown = 0;
    for (const auto& st : *stored)
        if (!place(consumer, st, committed, target))
            ++unknown;
    if (unknown > 0) {
        emit(log_, LogLevel::warning,
             fmt::format("{} partition(s) without a stored position wait: Kafka's committed offsets (or their "
                         "watermarks) could not be read; asked again after a backoff",
                         unknown),
             "consumer", {{"partitions", std::to_string(unknown)}});
        return std::nullopt;
    }
    return target;
}

std::optional<std::int64_t> StoredPositions::stored_start(const OffsetStore::Stored& st, PartitionState* ps)
{
    std::optional<std::int64_t> next = st.next_offset;
    if (!next && ps && ps->stored.began_at >= 0 && ps->position() > ps->stored.began_at) {
        // Taken again after a reconnect: this member processed records
        // of the partition, and stored their positions with them, but
        // the server has none (a failover to a standby without any of
        // them). Kafka's committed offset may have moved past them: they
        // are processed again from where this member began.
        next = ps->stored.began_at;
        lost_every_position(*ps);
    }
    if (ps) {
        ps->stored.epoch = st.epoch;
        ps->stored.verified = true;
        ps->stored.next = next.value_or(-1);
    }
    return next;
}

bool StoredPositions::place(kafka::GroupMember& consumer, const OffsetStore::Stored& st, const Committed& committed,
                            std::map<TopicPartition, std::int64_t>& target)
{
    auto* ps = ledger_.find(st.topic, st.partition);
    const std::optional<std::int64_t> next = stored_start(st, ps);
    const TopicPartition tp{st.topic, st.partition};
    std::int64_t kafka_offset = offset_invalid;
    bool kafka_known = false;
    for (const auto& [c, offset] : committed)
        if (c == tp && offset != kafka::offset_unknown) {
            kafka_offset = offset;
            kafka_known = true;
        }
    if (!next) {
        // Never stored: where Kafka says, as an offset of our own. Left
        // to librdkafka's own fetch of the committed offset at the
        // assignment, a refused fetch (a stale coordinator) leaves the
        // partition assigned and never fetched, without a word.
        const auto start = kafka_known ? start_without_position(consumer, tp, kafka_offset) : std::nullopt;
        if (!start) {
            if (ps)
                ps->stored.verified = false;
            return false;
        }
        target[tp] = *start;
        return true;
    }
    target[tp] = *next;
    if (*next == kafka_offset)
        return true;
    // The database decides, also when it is behind Kafka: every kind of
    // progress is stored before Kafka hears of it, so behind means
    // commits PostgreSQL lost (a failover to a standby without them, a
    // restored backup) or an offset reset in Kafka. The records in
    // between come again; those whose claims survived are duplicates.
    if (ps) {
        ps->lag.start_offset = *next; // for the lag gauge
        ps->lag.start_known = true;
    }
    reported_.insert(tp);
    report_start(st.topic, st.partition, *next, kafka_offset);
    return true;
}

// Where a partition without a stored position starts: Kafka's committed
// offset, or without one the end auto.offset.reset names, asked of the
// partition's leader; nullopt when that did not answer.
std::optional<std::int64_t> StoredPositions::start_without_position(kafka::GroupMember& consumer,
                                                                    const TopicPartition& tp, std::int64_t kafka_offset)
{
    std::optional<std::int64_t> start;
    if (kafka_offset >= 0) {
        start = kafka_offset;
    } else if (const auto marks = consumer.query_watermarks(tp, std::chrono::milliseconds(5000))) {
        start = consumer.reset_to_latest() ? marks->second : marks->first;
    }
    if (!start)
        return std::nullopt;
    if (auto* ps = ledger_.find(tp.topic, tp.partition)) {
        ps->lag.start_offset = *start; // for the lag gauge
        ps->lag.start_known = true;
    }
    emit(log_, LogLevel::info,
         fmt::format("{}/{} has no stored position: starts at {} ({})", tp.topic, tp.partition, *start,
                     kafka_offset >= 0 ? "Kafka's committed offset"
                                       : (consumer.reset_to_latest() ? "no committed offset: the end, auto.offset.reset"
                                                                     : "no committed offset: the beginning, "
                                                                       "auto.offset.reset")),
         "consumer", coordinates(tp.topic, tp.partition, *start));
    return start;
}

// The offset table's part of acquire(), on the poll thread's own connection:
// new epochs and the stored positions; nullopt when PostgreSQL failed. A
// lock timeout may be a member frozen in a transaction that wrote positions
// (its row locks stay for as long as it lives): its session is ended once it
// has been idle past frozen_member_timeout, and the takeover tried again.
std::optional<std::vector<OffsetStore::Stored>> StoredPositions::take_over(const std::vector<TopicPartition>& tps)
{
    std::vector<std::pair<std::string, std::int32_t>> wanted;
    wanted.reserve(tps.size());
    for (const auto& tp : tps)
        wanted.emplace_back(tp.topic, tp.partition);
    for (int attempt = 1;; ++attempt) {
        bool lock_timeout = false;
        try {
            return take_over_once(wanted);
        } catch (const pqxx::sql_error& e) {
            lock_timeout = pg::is_lock_timeout(e);
            take_over_failed(e, lock_timeout);
        } catch (const std::exception& e) {
            take_over_failed(e, false);
        }
        if (!lock_timeout || attempt == 2 || !own_.db)
            return std::nullopt;
        const auto ended = metrics_.frozen_members_ended.get();
        claims_.end_frozen_members(own_);
        if (metrics_.frozen_members_ended.get() == ended)
            return std::nullopt; // nobody ended: the next attempt comes after a backoff
    }
}

std::vector<OffsetStore::Stored>
StoredPositions::take_over_once(const std::vector<std::pair<std::string, std::int32_t>>& wanted)
{
    if (!own_.db) {
        own_.connect(cfg_.postgres);
        try {
            const pg::Watch::Armed armed(own_.watch, cfg_.db_timeout);
            pg::require_own_session(*own_.db, cfg_.postgres);
            pg::set_session(*own_.db, "lock_timeout", std::to_string(cfg_.lock_timeout.count())); // ms
            pg::guard_session(*own_.db);
            // Its takeovers lock rows of the offset table: frozen inside one, it
            // must be found by the other members' frozen-member search.
            claims_.mark_member(own_);
        } catch (...) {
            own_.disconnect(); // set up again, whole, at the next attempt
            throw;
        }
    }
    // On the poll thread: a frozen server must not stop the polling.
    const pg::Watch::Armed armed(own_.watch, locking_bound(cfg_));
    pqxx::work tx(*own_.db);
    pg::open_for_writes(tx, cfg_.lock_timeout);
    std::vector<OffsetStore::Stored> stored = store_.acquire(tx, cfg_.group_id, wanted);
    tx.commit();
    return stored;
}

// Counts and logs a failed takeover; a lost connection is closed.
void StoredPositions::take_over_failed(const std::exception& e, bool lock_timeout)
{
    if (lock_timeout)
        metrics_.lock_timeouts.add();
    emit(log_, LogLevel::warning,
         fmt::format("cannot read stored positions, partitions wait for PostgreSQL{}: {}",
                     lock_timeout ? " (a lock timeout on the offset table: another member's transaction holds its "
                                    "rows; a frozen member's session is ended past frozen_member_timeout)"
                                  : "",
                     e.what()),
         "consumer", {{log_field::error, e.what()}});
    if (own_.watch.take_fired())
        metrics_.db_timeouts.add();
    if (own_.db && !own_.db->is_open())
        own_.disconnect();
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
                     ps.tp.topic, ps.tp.partition, ps.stored.began_at, ps.position(), ps.stored.began_at),
         "consumer",
         {{log_field::topic, ps.tp.topic},
          {log_field::partition, std::to_string(ps.tp.partition)},
          {"began_at", std::to_string(ps.stored.began_at)},
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
        if (!ps.stored.verified)
            unverified.push_back(tp);
    std::map<PartitionState*, std::int64_t> rewinds;
    if (unverified.empty())
        return rewinds;
    const auto target = acquire(consumer, unverified);
    if (!target)
        return rewinds;
    // Every partition goes to its start unless it is there: one assigned
    // while PostgreSQL was away was given a placeholder (see
    // Engine::Impl::assigned()).
    for (const auto& tp : unverified) {
        auto* ps = ledger_.find(tp.topic, tp.partition);
        auto t = target->find(tp);
        if (!ps || t == target->end() || ps->position() == t->second)
            continue;
        if (ps->position() > t->second && !reported_.count(tp)) {
            // Level with Kafka's committed offset but behind what this member
            // processed: PostgreSQL lost commits whose offsets had not reached
            // Kafka yet (acquire() tells only positions behind Kafka's).
            emit(log_, LogLevel::warning,
                 fmt::format("{}/{}: the stored position {} is behind this member's position {}: PostgreSQL lost "
                             "commits (a failover to a standby without them); the {} records in between are "
                             "processed again (those whose claims survived are skipped as duplicates)",
                             tp.topic, tp.partition, t->second, ps->position(), ps->position() - t->second),
                 "consumer",
                 {{log_field::topic, tp.topic},
                  {log_field::partition, std::to_string(tp.partition)},
                  {"stored", std::to_string(t->second)},
                  {"position", std::to_string(ps->position())}});
        }
        rewinds[ps] = t->second;
    }
    return rewinds;
}

StoredPositions::Stored StoredPositions::store(Worker& w, const std::set<PartitionState*>& moved)
{
    std::vector<OffsetStore::Position> positions;
    for (auto* ps : moved)
        if (ps->position() >= 0)
            positions.push_back({ps->tp.topic, ps->tp.partition, ps->position(), ps->stored.epoch});
    if (!w.db) {
        // Lost in this batch (by another worker, too): the engine reconnects;
        // the positions go with the partition's next batch.
        emit(log_, LogLevel::warning,
             "positions not stored: no PostgreSQL connection (records are redelivered and deduplicated)", "consumer");
        return Stored::failed;
    }
    try {
        const pg::Watch::Armed armed(w.watch, locking_bound(cfg_));
        pg::KeptWork::Scope scope(w.kept); // rolled back unless committed
        pqxx::work& tx = w.kept.on(*w.db);
        pg::open_for_writes(tx, cfg_.lock_timeout, w.kept.begins()); // BEGIN in the same round trip
        claims_.write_positions(tx, positions);
        w.kept.commit();
        scope.done();
        for (auto* ps : moved)
            ps->stored.next = std::max(ps->stored.next, ps->position());
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
