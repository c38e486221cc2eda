// What ended a claim transaction early, by an exception: classify() names
// the fault (abandoned, replaced, fenced, connection, conflict, setup lost,
// lock timeout, other), recover() counts, logs and turns it into the
// attempt's outcome.

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {

// What an exception that ended the transaction means. `in_handler`: a
// handler call was running. Rethrows what is none of the library's (not a
// std::exception): it goes on up as before.
ClaimTransaction::Classified classify(const std::exception_ptr& error, bool in_handler)
{
    using Fault = ClaimTransaction::Fault;
    try {
        std::rethrow_exception(error);
    } catch (const Abandon&) {
        return {Fault::abandoned, {}};
    } catch (const Replaced&) {
        return {Fault::replaced, {}};
    } catch (const Fenced&) {
        return {Fault::fenced, {}};
    } catch (const pqxx::in_doubt_error& e) {
        // The commit may or may not have happened: never guess.
        return {Fault::connection, e.what()};
    } catch (const pqxx::broken_connection& e) {
        return {Fault::connection, e.what()};
    } catch (const pqxx::check_violation& e) {
        // 23514 on the claim: maintenance attached the partition for this id
        // at that moment (handler errors never get here).
        return {Fault::conflict, e.what()};
    } catch (const pqxx::transaction_rollback& e) {
        // 40001 / 40P01: the whole transaction is safe to run again.
        return {Fault::conflict, e.what()};
    } catch (const pqxx::sql_error& e) {
        if (!in_handler && (e.sqlstate() == "42P01" || e.sqlstate() == "26000"))
            return {Fault::setup_lost, e.what()};
        if (pg::is_lock_timeout(e))
            return {Fault::lock_timeout, e.what()};
        return {Fault::other, e.what()};
    } catch (const std::exception& e) {
        return {Fault::other, e.what()};
    }
}

// Does what classify() found: counts, logs, and names the attempt's outcome.
ClaimTransaction::Outcome ClaimTransaction::recover(const Classified& c, Worker& w, const Attempt& a, Failure& failure)
{
    switch (c.fault) {
    case Fault::abandoned:
        return Outcome::abandoned;
    case Fault::replaced:
        // A handler ended the transaction and began another, on a server that
        // does not report it at once (before PostgreSQL 14): which handler is
        // unknown. Nothing commits; the batch runs again after a backoff.
        s_.metrics.handler_aborted_transactions.add();
        s_.metrics.db_failures.add();
        say(s_.log, LogLevel::error, {},
            "{}: a handler of this batch ended the transaction and began another (ROLLBACK; BEGIN?); both are rolled "
            "back and the batch runs again after a backoff. PostgreSQL 14 or later names the record",
            pg::transaction_ended);
        return Outcome::db_failed;
    case Fault::fenced:
        w.fenced = true;
        return Outcome::abandoned;
    case Fault::connection:
        // Nothing is committed to Kafka; redelivery and dedup settle it.
        lost_connection(w, c.what.c_str());
        return Outcome::db_failed;
    case Fault::conflict:
        // In a handler call it may be that record's doing; at the claim or at
        // COMMIT it is nobody's. Run it again.
        failure = {a.current, c.what, true, a.current != nobody && w.scratch.call_items.size() > 1};
        return Outcome::conflict;
    case Fault::setup_lost:
        // The session lost what prepare() gave it (the guard table, the claim
        // statement): libpqxx 6 reconnected by itself, or a handler ran
        // DISCARD. A new connection gets them again.
        s_.metrics.db_failures.add();
        say(s_.log, LogLevel::error, error_field(c.what),
            "the PostgreSQL session lost the library's setup; reconnecting: {}", c.what);
        w.lost_connection = true;
        return Outcome::db_failed;
    case Fault::lock_timeout:
        s_.metrics.lock_timeouts.add();
        say(s_.log, LogLevel::warning, error_field(c.what),
            "a statement waited for a lock longer than lock_timeout ({} ms){}; the batch is rolled back and runs "
            "again after a backoff: {}",
            s_.cfg.lock_timeout.count(),
            a.current == nobody ? " at the claim (another member's batch holds these event ids?)" : " in a handler",
            c.what);
        if (a.current == nobody)
            end_frozen_members(w);
        return Outcome::db_failed;
    case Fault::other:
        break;
    }
    return db_error(w, c.what);
}

// Any other PostgreSQL error outside the handlers: the batch is rolled back
// and runs again after a backoff.
ClaimTransaction::Outcome ClaimTransaction::db_error(Worker& w, const std::string& what)
{
    s_.metrics.db_failures.add();
    say(s_.log, LogLevel::error, error_field(what),
        "PostgreSQL error outside the handler, batch rolled back and retried after a backoff: {}", what);
    if (w.db && !w.db->is_open())
        lost_connection(w, what.c_str());
    return Outcome::db_failed;
}

void ClaimTransaction::lost_connection(Worker& w, const char* why)
{
    if (w.watch.take_fired()) {
        s_.metrics.db_timeouts.add();
        say(s_.log, LogLevel::error, error_field(why),
            "PostgreSQL did not answer within db_timeout ({} ms, a claim {} ms more): the connection was cut (a "
            "frozen or unreachable server?); the batch's outcome is unknown until PostgreSQL answers again, so "
            "nothing of it is committed to Kafka and its records are redelivered and deduplicated",
            s_.cfg.db_timeout.count(), s_.cfg.lock_timeout.count());
    }
    s_.metrics.db_failures.add();
    say(s_.log, LogLevel::error, error_field(why),
        "PostgreSQL connection lost ({}); offsets of the batch are not committed, records will be redelivered", why);
    w.lost_connection = true;
}

} // namespace idemkafka::detail
