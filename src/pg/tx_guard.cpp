#include "pg/tx_guard.hpp"

#include "pg/exec.hpp"

#include <cstring>

#include <libpq-fe.h>

#include <fmt/format.h>

namespace idemkafka::detail::pg {
namespace {

// libpqxx keeps its connection's PGconn to itself; its (protected, static)
// large-object helper hands it out for a transaction, in both 6.x and 7.x.
struct RawConnection : pqxx::largeobject {
    static PGconn* of(const pqxx::dbtransaction& tx) noexcept
    {
        try {
            return raw_connection(tx);
        } catch (...) {
            return nullptr;
        }
    }
};

} // namespace

TxState state_of(const pqxx::dbtransaction& tx) noexcept
{
    PGconn* conn = RawConnection::of(tx);
    if (!conn)
        return TxState::unknown;
    switch (PQtransactionStatus(conn)) {
    case PQTRANS_INTRANS:
        return TxState::open;
    case PQTRANS_INERROR:
        return TxState::aborted;
    case PQTRANS_IDLE:
        return TxState::ended;
    default:
        return TxState::unknown;
    }
}

const char* to_string(TxState state) noexcept
{
    switch (state) {
    case TxState::open:
        return "open";
    case TxState::aborted:
        return "aborted";
    case TxState::ended:
        return "ended";
    case TxState::unknown:
        break;
    }
    return "unknown";
}

std::string last_error(const pqxx::dbtransaction& tx)
{
    PGconn* conn = RawConnection::of(tx);
    std::string text = conn ? PQerrorMessage(conn) : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
        text.pop_back();
    for (auto& c : text)
        if (c == '\n')
            c = ' ';
    return text;
}

std::string left_unusable(const pqxx::dbtransaction& tx, TxState state)
{
    const auto last = last_error(tx);
    return fmt::format("transaction {}; a database error was caught and not rethrown{}{}", to_string(state),
                       last.empty() ? "" : ": ", last);
}

bool is_lock_timeout(const pqxx::sql_error& e)
{
    return e.sqlstate() == "55P03";
}

#if PQXX_VERSION_MAJOR < 7
void set_session(pqxx::connection& conn, const std::string& name, const std::string& value)
{
    // Kept by libpqxx 6 across its automatic reconnects.
    conn.set_variable(name, value);
}
#else
void set_session(pqxx::connection& conn, const std::string& name, const std::string& value)
{
    pqxx::nontransaction tx(conn);
    tx.exec("SET " + tx.quote_name(name) + " = " + tx.quote(value));
    tx.commit();
}
#endif

void guard_session(pqxx::connection& conn)
{
    set_session(conn, "default_transaction_read_only", "on");
}

namespace {

// synchronous_commit = off (a database or role default, a handler's SET) lets COMMIT return
// before its WAL is flushed: a server crash would then lose a transaction whose offset Kafka
// already has. Raised to local for the transaction; a stronger level is kept.
constexpr const char* durable_commit =
    "CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) END";

// What a handler can leave on the session that open_for_writes_sql() puts back,
// as one text. First in the arm statement's select list: read before it raises
// synchronous_commit for the COMMIT.
constexpr const char* session_settings =
    "concat_ws('|', session_user, current_user, current_setting('search_path'), "
    "current_setting('statement_timeout'), current_setting('synchronous_commit'), "
    "current_setting('default_transaction_isolation'), current_setting('idle_in_transaction_session_timeout'), "
    "current_setting('lock_timeout'), current_setting('session_replication_role'), "
    "current_setting('transaction_timeout', true))";

// For the transaction only: session_replication_role origin where it was replica.
constexpr const char* origin_role = "CASE WHEN current_setting('session_replication_role') = 'replica' THEN "
                                    "set_config('session_replication_role', 'origin', true) END";

// The transaction declared read-write: with its BEGIN where the text begins it.
const char* read_write(bool begin) noexcept
{
    return begin ? "BEGIN READ WRITE" : "SET TRANSACTION READ WRITE";
}

} // namespace

std::string reopen_for_writes_sql(bool begin)
{
    // synchronous_commit and session_replication_role: in the claim statement (commit_guard_cte()),
    // prepared once, where a SELECT of their own here would be parsed and planned at every transaction.
    return read_write(begin);
}

bool read_only_by_default(const pqxx::dbtransaction& tx) noexcept
{
    PGconn* conn = RawConnection::of(tx);
    const char* reported = conn ? PQparameterStatus(conn, "default_transaction_read_only") : nullptr;
    return reported && std::strcmp(reported, "on") == 0;
}

std::string open_for_writes_sql(std::chrono::milliseconds lock_timeout, int server_version, bool begin)
{
    // What a handler's session-level SET committed goes back to the session's own defaults
    // (its connection options, role and database settings): RESET is allowed to any user,
    // ROLE and SESSION AUTHORIZATION included. session_replication_role only a superuser can
    // set (or reset): set back only when a handler did, since its commit guard trigger does
    // not fire under replica. idle_in_transaction_session_timeout is the library's: 0 (a
    // server default shorter than a handler call would end the batch at every attempt; a
    // frozen member's session is ended by the group, see end_frozen_members).
    return fmt::format("{}; RESET SESSION AUTHORIZATION; RESET ROLE; RESET search_path; "
                       "RESET statement_timeout; {}RESET synchronous_commit; RESET default_transaction_isolation; "
                       "SET idle_in_transaction_session_timeout = 0; SET default_transaction_read_only = on; "
                       "SET lock_timeout = {}; SELECT {}, {}",
                       read_write(begin), server_version >= 170000 ? "RESET transaction_timeout; " : "",
                       lock_timeout.count(), durable_commit, origin_role);
}

void open_for_writes(pqxx::dbtransaction& tx, std::chrono::milliseconds lock_timeout, bool begin)
{
    tx.exec(open_for_writes_sql(lock_timeout, tx.conn().server_version(), begin));
}

namespace {

constexpr const char* guard_table = "pg_temp.idemkafka_commit_guard";
constexpr const char* commit_setting = "idemkafka.commit";
// Prepared in SQL (libpqxx 6 prepares its own statements only when it runs
// them itself): run with EXECUTE in a text of several.
constexpr const char* arm_statement = "idemkafka_arm_commit";
constexpr const char* session_statement = "idemkafka_session_state";
// The session's settings against the clean ones, at the start of a
// transaction commit_armed_then() begins.
constexpr const char* clean_statement = "idemkafka_session_clean";
// What the arm raises where the transaction is not the claim's.
constexpr const char* ended_constraint = "idemkafka_claims_transaction_ended";
// What the clean check raises where the session's settings changed.
constexpr const char* changed_constraint = "idemkafka_session_changed";

} // namespace

void install_commit_guard(pqxx::connection& conn)
{
    // Session objects: nothing in the database's schemas, nothing to migrate,
    // gone with the session. One row, updated once per guarded transaction,
    // by the claim statement, with the transaction's id (which queues the
    // trigger's event: the trigger fires once per such transaction, at COMMIT
    // or PREPARE TRANSACTION). Heap-only updates: the table stays one page,
    // nothing is truncated at COMMIT. The arm reads the row: where its id is
    // the transaction's, it sets the transaction-local setting the trigger
    // asks for; where not, it raises (a function called only then: a
    // PL/pgSQL call costs more than the arm's whole select).
    pqxx::nontransaction tx(conn);
    tx.exec(fmt::format(R"(CREATE OR REPLACE FUNCTION pg_temp.idemkafka_commit_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
  IF current_setting('{setting}', true) IS DISTINCT FROM 'on' THEN
    RAISE EXCEPTION '{ended}: COMMIT, END, COMMIT AND CHAIN, PREPARE TRANSACTION and tx.commit() are refused in the transaction of a handler call, which idemkafka commits itself with the claims; the whole transaction is rolled back';
  END IF;
  RETURN NULL;
END
$guard$;
CREATE OR REPLACE FUNCTION pg_temp.idemkafka_transaction_ended() RETURNS text
LANGUAGE plpgsql AS $ended$
BEGIN
  RAISE EXCEPTION '{constraint}: the transaction is not the one the claims began' USING ERRCODE = 'check_violation';
END
$ended$;
CREATE OR REPLACE FUNCTION pg_temp.idemkafka_session_changed() RETURNS boolean
LANGUAGE plpgsql AS $changed$
BEGIN
  RAISE EXCEPTION '{changed}: the session''s settings changed since the last transaction began' USING ERRCODE = 'check_violation';
END
$changed$;
CREATE TEMPORARY TABLE IF NOT EXISTS idemkafka_commit_guard (xid bigint NOT NULL);
INSERT INTO {table} SELECT 0 WHERE NOT EXISTS (SELECT FROM {table});
DROP TRIGGER IF EXISTS idemkafka_commit_guard ON {table};
CREATE CONSTRAINT TRIGGER idemkafka_commit_guard AFTER UPDATE OF xid ON {table}
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.idemkafka_commit_guard();
PREPARE {arm} AS SELECT CASE WHEN xid = txid_current() THEN set_config('{setting}', 'on', true)
  ELSE pg_temp.idemkafka_transaction_ended() END, {durable} FROM {table};
PREPARE {state} AS SELECT {session};
PREPARE {clean} (text) AS SELECT CASE WHEN {session} = $1 AND current_setting('default_transaction_read_only') = 'on'
  THEN true ELSE pg_temp.idemkafka_session_changed() END)",
                        fmt::arg("setting", commit_setting), fmt::arg("ended", transaction_ended),
                        fmt::arg("table", guard_table), fmt::arg("constraint", ended_constraint),
                        fmt::arg("arm", arm_statement), fmt::arg("durable", durable_commit),
                        fmt::arg("state", session_statement), fmt::arg("session", session_settings),
                        fmt::arg("changed", changed_constraint), fmt::arg("clean", clean_statement)));
    tx.commit();
}

std::string commit_guard_cte()
{
    // Each condition is true whatever the settings (set_config returns the value it sets), so
    // all are evaluated, on the guard's one row, before its update queues the guard's trigger
    // event: session_replication_role is origin by then, so that the trigger fires.
    return fmt::format("WITH idemkafka_guard AS (UPDATE {} SET xid = txid_current() "
                       "WHERE set_config('default_transaction_read_only', 'off', true) = 'off' "
                       "AND coalesce({}, 'origin') = 'origin' AND coalesce({}, 'local') = 'local') ",
                       guard_table, origin_role, durable_commit);
}

void guard_transaction(pqxx::dbtransaction& tx)
{
    tx.exec(commit_guard_cte() + "SELECT 1");
}

std::string session_state(pqxx::connection& conn)
{
    pqxx::nontransaction tx(conn);
    return tx.exec(std::string("EXECUTE ") + session_statement)[0][0].as<std::string>();
}

std::optional<std::string> commit_armed(pqxx::dbtransaction& tx)
{
    // One text, one round trip: the arm (the session's settings are read after
    // the COMMIT, where what a handler set for the transaction only is gone),
    // which raises where the transaction is not the claim's, so that the
    // COMMIT after it in the text is not run.
    try {
        return tx.exec(fmt::format("EXECUTE {}; COMMIT; EXECUTE {}", arm_statement, session_statement))[0][0]
            .as<std::string>();
    } catch (const pqxx::check_violation& e) {
        if (std::strstr(e.what(), ended_constraint) == nullptr)
            throw;
        return std::nullopt;
    }
}

ChainedCommit commit_armed_then(pqxx::dbtransaction& tx, const std::string& clean_session, const std::string& next)
{
    // The clean check runs only after the COMMIT went through (a text's
    // statements stop at the first error), in the next transaction: its
    // error (raised by nothing else) is the one failure that tells the
    // COMMIT's outcome. libpqxx does not tell which transaction an error
    // left aborted (the connection's status reads idle after it).
    try {
        return {ChainedCommit::End::begun,
                tx.exec(fmt::format("EXECUTE {}; COMMIT; BEGIN READ WRITE; EXECUTE {}({}); {}", arm_statement,
                                    clean_statement, tx.quote(clean_session), next))};
    } catch (const pqxx::check_violation& e) {
        if (std::strstr(e.what(), ended_constraint) != nullptr)
            return {ChainedCommit::End::replaced, {}};
        if (std::strstr(e.what(), changed_constraint) != nullptr)
            return {ChainedCommit::End::session_changed, {}};
        throw;
    }
}

bool replaced(const pqxx::dbtransaction& tx) noexcept
{
    PGconn* conn = RawConnection::of(tx);
    const char* reported = conn ? PQparameterStatus(conn, "default_transaction_read_only") : nullptr;
    return reported && std::strcmp(reported, "off") != 0;
}

} // namespace idemkafka::detail::pg
