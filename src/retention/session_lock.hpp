#pragma once
// The maintenance lock: a session-level advisory lock per claims table, so
// that one session at a time maintains it. Private to the library.

#include <string>
#include <utility>

#include <pqxx/pqxx>

namespace idemkafka::detail::retention {

class SessionLock {
public:
    SessionLock(pqxx::connection& conn, std::string key) : conn_(conn), key_(std::move(key)) {}
    /// Releases the lock if held; never throws.
    ~SessionLock();
    SessionLock(const SessionLock&) = delete;
    SessionLock& operator=(const SessionLock&) = delete;

    /// Takes the lock without waiting; false when another session holds it.
    bool try_lock();

private:
    pqxx::connection& conn_;
    std::string key_;
    bool held_ = false;
};

} // namespace idemkafka::detail::retention
