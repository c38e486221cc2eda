#pragma once
// What user code left of a transaction. A handler may catch a database error
// and return as if nothing happened; the server-side transaction is then
// aborted (libpqxx 7) or already rolled back (libpqxx 6, which sends ROLLBACK
// on the first failed statement). Neither may be committed as if the handler
// had succeeded, and no later statement may commit outside the transaction.

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
/// error would commit its later writes outside the claim transaction. With
/// that libpqxx, library connections default to read-only transactions
/// (guard_session) and each library transaction declares itself read-write
/// (open_for_writes): such a write then fails instead of committing.
constexpr bool rollback_on_failed_statement = PQXX_VERSION_MAJOR < 7;

/// Sets a session setting of `conn` (kept across libpqxx 6's reconnects).
void set_session(pqxx::connection& conn, const std::string& name, const std::string& value);

/// 55P03: a statement waited for a lock longer than lock_timeout.
bool is_lock_timeout(const pqxx::sql_error& e);

/// Makes read-only the default of `conn`'s transactions (libpqxx < 7 only).
void guard_session(pqxx::connection& conn);

/// Declares `tx` read-write; its first statement (libpqxx < 7 only).
void open_for_writes(pqxx::dbtransaction& tx);

} // namespace idemkafka::detail::pg
