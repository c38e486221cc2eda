#include "retention/session_lock.hpp"

#include "pg/exec.hpp"

namespace idemkafka::detail::retention {

SessionLock::~SessionLock()
{
    if (!held_)
        return;
    try {
        pqxx::nontransaction tx(conn_);
        pg::exec_params(tx, "SELECT pg_advisory_unlock(hashtext('idemkafka.maintenance'), hashtext($1))", key_);
    } catch (...) {
        // A broken connection has released the lock already.
    }
}

bool SessionLock::try_lock()
{
    pqxx::nontransaction tx(conn_);
    held_ =
        pg::exec_params(tx, "SELECT pg_try_advisory_lock(hashtext('idemkafka.maintenance'), hashtext($1))", key_)[0][0]
            .as<bool>();
    return held_;
}

} // namespace idemkafka::detail::retention
