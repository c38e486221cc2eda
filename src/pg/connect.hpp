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

} // namespace idemkafka::detail::pg
