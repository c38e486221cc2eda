#pragma once
// What user code left of a transaction. A handler may catch a database error
// and return as if nothing happened; the server-side transaction is then
// aborted (libpqxx 7) or already rolled back (libpqxx 6, which sends ROLLBACK
// on the first failed statement). Neither may be committed as if the handler
// had succeeded, and no later statement may commit outside the transaction.

#include <chrono>
#include <optional>
#include <string>

#include <pqxx/pqxx>

namespace idemkafka::detail::pg {

/// The server-side state of a transaction's connection, as libpq last saw it
/// (no round trip).
enum class TxState {
    open,    ///< in a transaction block, usable
    aborted, ///< in a failed transaction block: only ROLLBACK works
    ended,   ///< not in a transaction block: it was committed or rolled back
    unknown, ///< connection lost, or a command still running
};

/// State of `tx`'s connection now.
TxState state_of(const pqxx::dbtransaction& tx) noexcept;

/// "aborted" / "ended" / ...
const char* to_string(TxState state) noexcept;

/// The connection's last error message, trimmed; empty when the last command
/// succeeded.
std::string last_error(const pqxx::dbtransaction& tx);

/// Why `tx`, in `state` after user code returned normally, cannot be committed:
/// "transaction aborted; a database error was caught and not rethrown: <the
/// connection's last error>".
std::string left_unusable(const pqxx::dbtransaction& tx, TxState state);

/// libpqxx before 7 ends the transaction with ROLLBACK on the first failed
/// statement, and runs the next parameterized or prepared statement of the
/// same transaction object in autocommit mode: a handler that caught the
/// error would commit its later writes outside the claim transaction. On any
/// libpqxx, a handler that ran ROLLBACK (or whose COMMIT the commit guard
/// refused) would do the same with its next statement. So library connections
/// default to read-only transactions (guard_session) and each library
/// transaction declares itself read-write (open_for_writes): such a write
/// then fails instead of committing.
constexpr bool rollback_on_failed_statement = PQXX_VERSION_MAJOR < 7;

/// Sets a session setting of `conn` (kept across libpqxx 6's reconnects).
void set_session(pqxx::connection& conn, const std::string& name, const std::string& value);

/// 55P03: a statement waited for a lock longer than lock_timeout.
bool is_lock_timeout(const pqxx::sql_error& e);

/// Makes read-only the default of `conn`'s transactions.
void guard_session(pqxx::connection& conn);

/// Declares `tx` read-write, its first statement, and in the same round trip
/// puts back what a handler may have left on the session in an earlier
/// transaction (a session-level SET, or RESET ALL, committed with it): ROLE,
/// SESSION AUTHORIZATION, search_path, statement_timeout, synchronous_commit,
/// default_transaction_isolation (and transaction_timeout from PostgreSQL 17)
/// go back to the session's defaults; read-only as the default of later
/// transactions (guard_session) and lock_timeout are set again. For the
/// transaction only: synchronous_commit at least local,
/// idle_in_transaction_session_timeout 0, session_replication_role origin
/// where it was replica. A session SET is transactional: rolled back with the
/// transaction, kept when it commits.
/// `begin`: the server transaction of `tx` is not begun (KeptWork::begins()),
/// the same text begins it: BEGIN READ WRITE in one statement.
void open_for_writes(pqxx::dbtransaction& tx, std::chrono::milliseconds lock_timeout, bool begin = false);

/// The statements open_for_writes() runs on a server of `server_version`
/// (PQserverVersion), for a text of several statements that must begin with
/// them (no "; " at the end); with `begin`, the first begins the transaction.
/// idle_in_transaction_session_timeout is set to 0 for the session.
std::string open_for_writes_sql(std::chrono::milliseconds lock_timeout, int server_version, bool begin);

/// The transaction declared read-write, for a session whose settings are known
/// to be as open_for_writes_sql() leaves them: what commit_armed() read after
/// the session's last claim transaction equalled session_state() read when
/// the session was set up, and read_only_by_default(). Only before the claim
/// statement (prefixed with commit_guard_cte()), which does the rest of what
/// open_for_writes_sql() does for the transaction only: synchronous_commit at
/// least local, session_replication_role origin. Same form; with `begin`,
/// BEGIN READ WRITE.
std::string reopen_for_writes_sql(bool begin);

/// The session's settings that open_for_writes_sql() puts back, as one text:
/// the roles, search_path, statement_timeout, synchronous_commit,
/// default_transaction_isolation, idle_in_transaction_session_timeout,
/// lock_timeout, session_replication_role, transaction_timeout. Read outside
/// a transaction (one round trip), as commit_armed() reads them after its
/// COMMIT. Needs install_commit_guard().
std::string session_state(pqxx::connection& conn);

/// The server reports (PostgreSQL 14 and later, no round trip) read-only as
/// the default of the session's transactions, as guard_session() sets it.
/// False before PostgreSQL 14.
bool read_only_by_default(const pqxx::dbtransaction& tx) noexcept;

/// The commit guard. The claims of a transaction are taken before its first
/// handler call, so a COMMIT run by a handler (COMMIT, END, COMMIT AND CHAIN,
/// PREPARE TRANSACTION, tx.commit()) would commit the claims of records whose
/// handlers never ran. install_commit_guard() gives `conn`'s session a
/// one-row temporary table whose deferred constraint trigger refuses any
/// COMMIT that commit_armed() did not allow: the claim statement (prefixed with
/// commit_guard_cte()) updates the row, so such a COMMIT fails and the whole
/// transaction rolls back. Run before guard_session (it creates objects);
/// again on a new session.
void install_commit_guard(pqxx::connection& conn);

/// The start of the claim statement: the guard row updated with the
/// transaction's id, and, for the transaction only, default_transaction_read_only
/// set to "off" (the session's is "on"), which PostgreSQL 14 and later report
/// to the client when it changes back (see replaced()), synchronous_commit
/// raised to local where it is off and session_replication_role set to origin
/// where it is replica, before the update queues the guard's trigger event.
/// The claims themselves may be inserted before those two are set (PostgreSQL
/// runs a WITH's update after the main statement): the library puts no trigger
/// on the claims table, and nothing before COMMIT depends on synchronous_commit.
std::string commit_guard_cte();

/// Arms the guard, and the marker replaced() reads, in a transaction that does
/// not run the claim statement first (the reconcile hook's): one statement.
void guard_transaction(pqxx::dbtransaction& tx);

/// Commits `tx`'s server transaction through the guard, after its last handler
/// call, in one round trip: the arm (the setting the guard's trigger asks for,
/// synchronous_commit raised to local again where a handler set it off), then
/// COMMIT, then the session's settings read as session_state() reads them,
/// which it returns. nullopt, nothing committed, when `tx`'s transaction is
/// not the one the claim statement began (a handler ran ROLLBACK; BEGIN or
/// ROLLBACK AND CHAIN): the arm raises on the guard row's id, the
/// COMMIT after it is not run, and the transaction must be rolled back. The
/// pqxx::work stays open on libpqxx's side (see KeptWork): its next server
/// transaction begins with the next BEGIN.
std::optional<std::string> commit_armed(pqxx::dbtransaction& tx);

/// How commit_armed_then() ended.
struct ChainedCommit {
    enum class End {
        begun,           ///< committed, the next transaction begun and `claim` its claim's result
        replaced,        ///< nothing committed: as commit_armed()'s nullopt
        session_changed, ///< committed; the session's settings are not the clean ones, so the next
                         ///< transaction stopped before its claim (aborted on the server: to be
                         ///< rolled back)
    };
    End ended;
    pqxx::result claim;
};

/// commit_armed(), and in the same round trip the next server transaction
/// begun (BEGIN READ WRITE), the session's settings checked against
/// `clean_session` (session_state()'s text of a clean session, and the
/// default read-only), and `next` run (a claim statement's text). A failure
/// of `next` (or of anything else after the COMMIT) throws as a failure of
/// the COMMIT would: whether it committed is not told. On `begun` the
/// pqxx::work's server transaction is the next one.
ChainedCommit commit_armed_then(pqxx::dbtransaction& tx, const std::string& clean_session, const std::string& next);

/// True when the transaction the claim statement began has ended since, as
/// the server last reported (no round trip): the transaction-local
/// default_transaction_read_only of commit_guard_cte() went back to the
/// session's value. False also when the server does not report the setting
/// (before PostgreSQL 14); commit_armed() still catches the case there.
bool replaced(const pqxx::dbtransaction& tx) noexcept;

/// The text of the guard's refusal, which the failure of such a handler
/// call carries.
inline constexpr const char* transaction_ended = "transaction ended inside the handler";

} // namespace idemkafka::detail::pg
