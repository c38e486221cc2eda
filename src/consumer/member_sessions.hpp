#pragma once
// The PostgreSQL sessions of a consumer group's members: how a session shows
// that it is one (the member marker), and which sessions are this member's
// own. Pure bookkeeping, no I/O; the statements that use them are in
// member_sessions.cpp. Private to the library.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace idemkafka::detail {

/// Every library session of a member holds two shared session-level
/// advisory locks, (space_a, key_a) and (space_b, key_b): pg_locks then shows
/// which sessions are members of the group on this claims table. The keys
/// are 62 bits of a hash of schema, table and group, so the same group name
/// on another claims table (another schema, another service) is not taken
/// for a member, and a chance collision needs both keys. Non-negative int4
/// keys: pg_locks shows them as the same oids.
struct MemberMarker {
    static constexpr int space_a = 0x696b6d62; // "ikmb"
    static constexpr int space_b = 0x696b6d63; // "ikmc"
    int key_a = 0;
    int key_b = 0;

    static MemberMarker of(const std::string& schema, const std::string& table, const std::string& group);
};

/// A server session: its backend pid and when it started (microseconds
/// since the epoch), which together name it even after the pid is reused.
struct Backend {
    std::int64_t pid = 0;
    std::int64_t started_us = 0;
};

/// This member's own sessions, one per connection slot (a worker): a
/// reconnect replaces its slot's session, so the list never grows beyond
/// the slots. Thread-safe.
class OwnSessions {
public:
    /// `slot`'s session is now `b`; returns the one it replaces, if any.
    std::optional<Backend> replace(const void* slot, Backend b);
    /// The pids of the current sessions.
    std::vector<std::int64_t> pids() const;
    std::size_t size() const;

private:
    mutable std::mutex mu_;
    std::map<const void*, Backend> by_slot_;
};

} // namespace idemkafka::detail
