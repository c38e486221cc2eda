#include "pg/connect.hpp"

#include <cstdlib>
#include <set>
#include <utility>

#include <libpq-fe.h>

#include <fmt/format.h>

#include "idemkafka/error.hpp"

namespace idemkafka::detail::pg {
namespace {

struct Default {
    const char* key;
    const char* value;
    const char* env; // the PG* variable libpq reads for it, or nullptr
};

constexpr Default defaults[] = {
    {"connect_timeout", "10", "PGCONNECT_TIMEOUT"},
    {"keepalives", "1", nullptr},
    {"keepalives_idle", "10", nullptr},
    {"keepalives_interval", "5", nullptr},
    {"keepalives_count", "3", nullptr},
    {"tcp_user_timeout", "20000", nullptr},
};

bool is_uri(const std::string& conninfo)
{
    return conninfo.rfind("postgresql://", 0) == 0 || conninfo.rfind("postgres://", 0) == 0;
}

} // namespace

std::string with_connection_defaults(const std::string& conninfo)
{
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
    if (!options) {
        PQfreemem(error);
        return conninfo;
    }
    std::set<std::string> known, set;
    for (const PQconninfoOption* o = options; o->keyword; ++o) {
        known.insert(o->keyword);
        if (o->val && *o->val)
            set.insert(o->keyword);
    }
    PQconninfoFree(options);

    std::string out = conninfo;
    const bool uri = is_uri(conninfo);
    bool has_query = uri && conninfo.find('?') != std::string::npos;
    for (const auto& d : defaults) {
        if (!known.count(d.key) || set.count(d.key)) // an older libpq without it, or the user's
            continue;
        if (d.env && std::getenv(d.env))
            continue;
        if (uri) {
            out += has_query ? '&' : '?';
            has_query = true;
            out += std::string(d.key) + '=' + d.value;
        } else {
            out += ' ';
            out += std::string(d.key) + '=' + d.value;
        }
    }
    return out;
}

std::unique_ptr<pqxx::connection> connect(const std::string& conninfo)
{
    return std::make_unique<pqxx::connection>(with_connection_defaults(conninfo));
}

namespace {

int server_pid(pqxx::connection& conn)
{
    pqxx::nontransaction tx(conn);
    return tx.exec("SELECT pg_backend_pid()")[0][0].as<int>();
}

} // namespace

void require_own_session(pqxx::connection& conn, const std::string& conninfo)
{
    const int pid = server_pid(conn);
    if (pid == conn.backendpid())
        return; // the server's session itself: no pooler in between
    // A pooler (PgBouncer gives its clients a cancel key, and so a pid, of its
    // own). In session mode `conn` keeps server session `pid` until it closes;
    // in transaction mode the session went back to the pool when that
    // statement ended, and a new client's first statement gets it again
    // (PgBouncer reuses the most recently released session first).
    const auto probe = connect(conninfo);
    const int other = server_pid(*probe);
    const int again = server_pid(conn);
    if (other != pid && again == pid)
        return;
    throw ConfigError(fmt::format(
        "postgres: the connection goes through a pooler in transaction pooling mode (PgBouncer pool_mode = "
        "transaction or statement): its PostgreSQL session (pid {}) went to another client between two statements. "
        "idemkafka "
        "keeps state on its sessions (prepared statements, the commit guard's temporary table, "
        "default_transaction_read_only = on, lock_timeout, advisory locks) that would reach the pool's other "
        "clients; connect to PostgreSQL directly or through a pool in session mode (pool_mode = session)",
        pid));
}

} // namespace idemkafka::detail::pg
