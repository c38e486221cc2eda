// The PostgreSQL sessions of the group's members: the marker every library
// session holds, this member's own sessions (a lost one is ended on the
// reconnect), and ending the sessions of members frozen inside a transaction.

#include "consumer/member_sessions.hpp"

#include <algorithm>
#include <chrono>

#include "consumer/claim_transaction.hpp"
#include "core/fnv1a.hpp"
#include "pg/arrays.hpp"
#include "pg/exec.hpp"

namespace idemkafka::detail {

MemberMarker MemberMarker::of(const std::string& schema, const std::string& table, const std::string& group)
{
    std::string scope = schema;
    scope += '\0';
    scope += table;
    scope += '\0';
    scope += group;
    const auto h = fnv1a64(scope);
    return {static_cast<int>(h & 0x7fffffffu), static_cast<int>((h >> 31) & 0x7fffffffu)};
}

std::optional<Backend> OwnSessions::replace(const void* slot, Backend b)
{
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, fresh] = by_slot_.try_emplace(slot, b);
    if (fresh)
        return std::nullopt;
    return std::exchange(it->second, b);
}

std::vector<std::int64_t> OwnSessions::pids() const
{
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::int64_t> out;
    out.reserve(by_slot_.size());
    for (const auto& [slot, b] : by_slot_)
        out.push_back(b.pid);
    return out;
}

std::size_t OwnSessions::size() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return by_slot_.size();
}

namespace {

// A session's start in microseconds since the epoch, the same expression
// when it is recorded and when it is compared.
constexpr const char* started_us_sql = "(extract(epoch FROM backend_start) * 1000000)::bigint";

} // namespace

// The marker's locks are tried, never waited for: a session holding one of
// them exclusively (any role that can connect may) must not keep the
// consumer from starting; without the marker only the frozen-member search
// of the other members misses this session.
void ClaimTransaction::mark_member(pg::Session& w)
{
    const auto row = [&] {
        pqxx::nontransaction tx(*w.db);
        return pg::exec_params(tx,
                               fmt::format("SELECT pg_try_advisory_lock_shared($1, $2) AND "
                                           "pg_try_advisory_lock_shared($3, $4), pg_backend_pid(), "
                                           "(SELECT {} FROM pg_stat_activity WHERE pid = pg_backend_pid())",
                                           started_us_sql),
                               MemberMarker::space_a, marker_.key_a, MemberMarker::space_b, marker_.key_b)[0];
    }();
    if (!row[0].as<bool>())
        say(s_.log, LogLevel::warning, {},
            "another PostgreSQL session holds this group's member marker (advisory locks ({}, {}) and ({}, {})) "
            "exclusively: this session is not marked, so other members cannot end it should this member freeze "
            "inside a transaction",
            MemberMarker::space_a, marker_.key_a, MemberMarker::space_b, marker_.key_b);
    const Backend now{row[1].as<std::int64_t>(), row[2].is_null() ? 0 : row[2].as<std::int64_t>()};
    if (const auto lost = own_.replace(&w, now))
        end_lost_session(w, *lost);
}

// A connection cut on the client's side only (packets that vanished, a
// deadline of db_timeout, tcp_user_timeout) leaves its server session alive
// until the server notices, maybe for hours: idle in its transaction, it
// holds the claims of the batch it ran (or the stored positions it took
// over), and the new session's claim of the same records would wait
// lock_timeout on them. It is this member's own, so it is ended at once,
// named by its pid and its start (a pid alone may belong to a new session
// by now).
void ClaimTransaction::end_lost_session(pg::Session& w, const Backend& lost)
{
    try {
        pqxx::nontransaction tx(*w.db);
        const auto rows = pg::exec_params(
            tx,
            fmt::format("SELECT state, pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND {} = $2",
                        started_us_sql),
            lost.pid, lost.started_us);
        if (rows.empty())
            return; // gone already
        const auto state = rows[0][0].is_null() ? std::string("unknown") : rows[0][0].as<std::string>();
        if (rows[0][1].as<bool>()) {
            s_.metrics.lost_sessions_ended.add();
            say(s_.log, LogLevel::warning, {{"pid", std::to_string(lost.pid)}},
                "ended this member's earlier PostgreSQL session {} ({}), whose connection was lost while the server "
                "kept it: the row locks of its open transaction (claims, stored positions) are released",
                lost.pid, state);
        } else {
            say(s_.log, LogLevel::warning, {{"pid", std::to_string(lost.pid)}},
                "could not end this member's earlier PostgreSQL session {} ({}): claims it holds wait for the "
                "server to notice the lost connection, or for lock_timeout",
                lost.pid, state);
        }
    } catch (const std::exception& e) {
        say(s_.log, LogLevel::warning, error_field(e.what()),
            "looking for this member's earlier PostgreSQL session {} failed: {}", lost.pid, e.what());
    }
}

namespace {

// How long a member's session may sit idle in a transaction before another
// member of the group may end it: max.poll.interval.ms, after which a member
// that stopped polling has lost its partitions anyway; never less than
// ConsumerConfig::frozen_member_floor.
std::chrono::milliseconds frozen_after(const ConsumerConfig& cfg)
{
    if (cfg.frozen_member_timeout.count() > 0)
        return cfg.frozen_member_timeout;
    if (auto it = cfg.kafka.find("max.poll.interval.ms"); it != cfg.kafka.end())
        try {
            return std::max(ConsumerConfig::frozen_member_floor, std::chrono::milliseconds(std::stoll(it->second)));
        } catch (const std::exception&) {
            // librdkafka refuses the value itself
        }
    return std::chrono::milliseconds(300000);
}

// A session of this database holding both locks of the marker.
constexpr const char* marked_sql =
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted AND "
    "l.database = a.datid AND l.classid = $1::int::oid AND l.objid = $2::int::oid AND l.objsubid = 2) AND "
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted AND "
    "l.database = a.datid AND l.classid = $3::int::oid AND l.objid = $4::int::oid AND l.objsubid = 2)";

} // namespace

// A claim that waited past lock_timeout may be waiting on a member frozen
// inside its transaction (SIGSTOP, a paused VM, a process stuck in a
// handler's infinite loop while its poll thread is stuck too): its claims
// hold their row locks for as long as it lives, and nothing on the server
// ends an idle transaction. A session marked as a member of this group on
// this claims table (MemberMarker) idle in a transaction for longer than
// frozen_member_timeout (max.poll.interval.ms: such a member has lost its
// partitions) is ended here: its transaction rolls back, claims and effects
// together, and its records are processed by their new owner. A long
// handler call of a live member that does no SQL that long is ended too: its
// record is retried (counted, logged by that member).
void ClaimTransaction::end_frozen_members(pg::Session& w)
{
    if (!w.db)
        return;
    const std::string own = int_array(own_.pids());
    const auto stale = frozen_after(s_.cfg);
    try {
        const pg::Watch::Armed armed(w.watch, s_.cfg.db_timeout);
        pqxx::nontransaction tx(*w.db);
        const auto ended =
            pg::exec_params(tx,
                            fmt::format("SELECT a.pid, (extract(epoch FROM now() - a.state_change) * 1000)::bigint, "
                                        "pg_terminate_backend(a.pid) FROM pg_stat_activity a "
                                        "WHERE a.datname = current_database() AND a.pid <> ALL($5::int[]) "
                                        "AND a.state IN ('idle in transaction', 'idle in transaction (aborted)') "
                                        "AND a.state_change < now() - $6::bigint * interval '1 millisecond' AND {}",
                                        marked_sql),
                            MemberMarker::space_a, marker_.key_a, MemberMarker::space_b, marker_.key_b, own,
                            static_cast<std::int64_t>(stale.count()));
        for (const auto& row : ended)
            frozen_member_ended(row[0].as<int>(), row[1].as<std::int64_t>(), row[2].as<bool>(), stale);
    } catch (const std::exception& e) {
        say(s_.log, LogLevel::warning, error_field(e.what()),
            "looking for frozen members' sessions failed (the batch runs again after a backoff): {}", e.what());
    }
}

void ClaimTransaction::frozen_member_ended(int pid, std::int64_t idle_ms, bool ended, std::chrono::milliseconds stale)
{
    if (ended) {
        s_.metrics.frozen_members_ended.add();
        say(s_.log, LogLevel::warning, {{"pid", std::to_string(pid)}},
            "ended PostgreSQL session {} of a member of this group, idle in its transaction for {} ms (over "
            "frozen_member_timeout, {} ms): a member frozen with claims; its transaction rolls back and its "
            "records are processed by their owner",
            pid, idle_ms, stale.count());
    } else {
        say(s_.log, LogLevel::warning, {{"pid", std::to_string(pid)}},
            "could not end PostgreSQL session {} of a frozen member of this group (idle in its transaction "
            "for {} ms): the claims it holds wait for it; grant pg_signal_backend or use the same role",
            pid, idle_ms);
    }
}

} // namespace idemkafka::detail
