#pragma once
// One statement group in a connection and transaction of its own, for the
// `ensure_schema(conninfo)` conveniences.

#include <string>
#include <utility>

#include <pqxx/pqxx>

#include "idemkafka/error.hpp"
#include "pg/connect.hpp"

namespace idemkafka::detail {

/// Connects, runs `work(tx)`, commits. A failed connection becomes DatabaseError;
/// whatever `work` throws propagates (the transaction is rolled back).
template <class Work> void in_own_transaction(const std::string& conninfo, Work&& work)
{
    try {
        const auto conn = pg::connect(conninfo);
        pqxx::work tx(*conn);
        std::forward<Work>(work)(tx);
        tx.commit();
    } catch (const pqxx::broken_connection& e) {
        throw DatabaseError(std::string("cannot connect to PostgreSQL: ") + e.what());
    }
}

} // namespace idemkafka::detail
