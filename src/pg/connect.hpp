#pragma once
// The library's PostgreSQL connections: a connection string with bounds for a
// server that does not answer, unless the string (or the environment) sets
// them. Private to the library.

#include <memory>
#include <string>

#include <pqxx/pqxx>

namespace idemkafka::detail::pg {

/// The defaults the library adds to a connection string, each only when
/// neither the string nor its PG* environment variable sets it:
///   connect_timeout=10        seconds per host to connect
///   keepalives=1, keepalives_idle=10, keepalives_interval=5,
///   keepalives_count=3        a silent server noticed in about 25 s
///   tcp_user_timeout=20000    data unacknowledged for 20 s ends the
///                             connection (a host gone, packets dropped)
/// A URI gets them as query parameters, a key/value string as pairs. A
/// string libpq cannot parse is returned as it is (connecting reports it).
std::string with_connection_defaults(const std::string& conninfo);

/// A connection to `conninfo` with_connection_defaults().
std::unique_ptr<pqxx::connection> connect(const std::string& conninfo);

/// Makes sure `conn` (opened from `conninfo`) has a PostgreSQL session of its
/// own for as long as it is open, before the library leaves state on it
/// (prepared statements, the commit guard's temporary table, session
/// settings, advisory locks): a connection pooler in transaction or statement
/// pooling mode (PgBouncer's pool_mode = transaction) hands the server session
/// to other clients between transactions, and that state would reach them.
/// A pooler shows as a backend pid libpq was told that is not the server's;
/// then a second connection must not get the same server session, and `conn`
/// must keep its own. Throws ConfigError naming the pooling mode when it does
/// not; pqxx errors when PostgreSQL fails. One round trip without a pooler.
void require_own_session(pqxx::connection& conn, const std::string& conninfo);

} // namespace idemkafka::detail::pg
