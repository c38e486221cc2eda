#include "idemkafka/store.hpp"

#include <utility>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "pg/claims.hpp"
#include "pg/exec.hpp"
#include "pg/transaction.hpp"

namespace idemkafka {

std::string quote_identifier(std::string_view name)
{
    if (name.empty())
        throw ConfigError("identifier must not be empty");
    if (name.find('\0') != std::string_view::npos)
        throw ConfigError("identifier must not contain a NUL byte");
    // PostgreSQL would silently truncate a longer name; two configured names
    // differing only past byte 63 must not end up as the same table.
    if (name.size() > 63)
        throw ConfigError(fmt::format("identifier is {} bytes long; PostgreSQL allows at most 63", name.size()));
    std::string out;
    out.reserve(name.size() + 2);
    out.push_back('"');
    for (char c : name) {
        if (c == '"')
            out.push_back('"');
        out.push_back(c);
    }
    out.push_back('"');
    return out;
}

ProcessedEventStore::ProcessedEventStore(std::string schema, std::string table)
    : schema_(std::move(schema)), table_(std::move(table))
{
    try {
        schema_q_ = quote_identifier(schema_);
    } catch (const ConfigError& e) {
        throw ConfigError(std::string("schema: ") + e.what());
    }
    try {
        table_q_ = quote_identifier(table_);
    } catch (const ConfigError& e) {
        throw ConfigError(std::string("table: ") + e.what());
    }
    qualified_ = schema_q_ + "." + table_q_;
}

void ProcessedEventStore::ensure_schema(const std::string& conninfo) const
{
    detail::in_own_transaction(conninfo, [this](pqxx::work& tx) { ensure_schema(tx); });
}

std::vector<EventId> ProcessedEventStore::claim(pqxx::transaction_base& tx, std::string_view group,
                                                const std::vector<EventId>& ids) const
{
    if (ids.empty())
        return {};
    return detail::pg::claimed_ids(
        detail::pg::exec_params(tx, detail::pg::claim_sql(*this), detail::pg::uuid_array(ids), std::string(group)));
}

} // namespace idemkafka
