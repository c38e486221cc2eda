#include "retention/registry.hpp"

#include <fmt/format.h>

#include "pg/exec.hpp"
#include "retention/time.hpp"

namespace idemkafka::detail::retention {
namespace {

constexpr const char* columns =
    "consumer_group, retention_ms, (extract(epoch FROM registered_at) * 1000)::bigint, registered_by";

RegisteredRetention row_of(const pqxx::row& row)
{
    RegisteredRetention r;
    r.consumer_group = row[0].as<std::string>();
    r.retention = std::chrono::milliseconds(row[1].as<std::int64_t>());
    r.registered_at = from_ms(row[2].as<std::int64_t>());
    r.registered_by = row[3].as<std::string>();
    return r;
}

} // namespace

std::string registry_of(const ProcessedEventStore& store)
{
    return quote_identifier(store.schema()) + "." + quote_identifier(retention_registry_name(store.table()));
}

bool registry_exists(pqxx::transaction_base& tx, const ProcessedEventStore& store)
{
    return pg::relation_exists(tx, registry_of(store));
}

std::optional<RegisteredRetention> longest_registered(pqxx::transaction_base& tx, const ProcessedEventStore& store,
                                                      bool lock)
{
    if (!registry_exists(tx, store))
        return std::nullopt;
    return longest_in_registry(tx, store, lock);
}

std::optional<RegisteredRetention> longest_in_registry(pqxx::transaction_base& tx, const ProcessedEventStore& store,
                                                       bool lock)
{
    const std::string reg = registry_of(store);
    if (lock)
        tx.exec(fmt::format("LOCK TABLE {} IN SHARE MODE", reg));
    const auto r =
        tx.exec(fmt::format("SELECT {} FROM {} ORDER BY retention_ms DESC, consumer_group LIMIT 1", columns, reg));
    if (r.empty())
        return std::nullopt;
    return row_of(r[0]);
}

std::vector<RegisteredRetention> registrations(pqxx::transaction_base& tx, const ProcessedEventStore& store)
{
    std::vector<RegisteredRetention> out;
    if (!registry_exists(tx, store))
        return out;
    for (const auto& row : tx.exec(
             fmt::format("SELECT {} FROM {} ORDER BY retention_ms DESC, consumer_group", columns, registry_of(store))))
        out.push_back(row_of(row));
    return out;
}

std::optional<std::chrono::milliseconds> register_retention(pqxx::transaction_base& tx,
                                                            const ProcessedEventStore& store, const std::string& group,
                                                            std::chrono::milliseconds retention)
{
    const std::string reg = registry_of(store);
    const auto r = pg::exec_params(
        tx,
        fmt::format("WITH earlier AS (SELECT retention_ms FROM {0} WHERE consumer_group = $1) "
                    "INSERT INTO {0} (consumer_group, retention_ms) VALUES ($1, $2) ON CONFLICT (consumer_group) "
                    "DO UPDATE SET retention_ms = EXCLUDED.retention_ms, registered_at = now(), "
                    "registered_by = current_user RETURNING (SELECT retention_ms FROM earlier)",
                    reg),
        group, static_cast<std::int64_t>(retention.count()));
    if (r.empty() || r[0][0].is_null())
        return std::nullopt;
    return std::chrono::milliseconds(r[0][0].as<std::int64_t>());
}

} // namespace idemkafka::detail::retention
