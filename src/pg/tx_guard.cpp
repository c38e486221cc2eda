#include "pg/tx_guard.hpp"

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

void guard_session(pqxx::connection& conn)
{
    set_session(conn, "default_transaction_read_only", "on");
}

void open_for_writes(pqxx::dbtransaction& tx)
{
    tx.exec("SET TRANSACTION READ WRITE");
}
#else
void set_session(pqxx::connection& conn, const std::string& name, const std::string& value)
{
    pqxx::nontransaction tx(conn);
    tx.exec("SET " + tx.quote_name(name) + " = " + tx.quote(value));
    tx.commit();
}

void guard_session(pqxx::connection&) {}
void open_for_writes(pqxx::dbtransaction&) {}
#endif

} // namespace idemkafka::detail::pg
