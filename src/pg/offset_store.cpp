#include "idemkafka/offset_store.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/store.hpp"
#include "pg/arrays.hpp"
#include "pg/exec.hpp"

namespace idemkafka {

OffsetStore::OffsetStore(const std::string& schema, const std::string& table)
{
    try {
        schema_q_ = quote_identifier(schema);
    } catch (const ConfigError& e) {
        throw ConfigError(std::string("schema: ") + e.what());
    }
    try {
        qualified_ = schema_q_ + "." + quote_identifier(table);
    } catch (const ConfigError& e) {
        throw ConfigError(std::string("offsets_table: ") + e.what());
    }
}

namespace {

using detail::int_array;
using detail::text_array;

OffsetStore::Stored stored_of(const pqxx::row& row)
{
    OffsetStore::Stored s;
    s.topic = row["topic"].c_str();
    s.partition = row["partition"].as<std::int32_t>();
    if (!row["next_offset"].is_null())
        s.next_offset = row["next_offset"].as<std::int64_t>();
    s.epoch = row["epoch"].as<std::int64_t>();
    s.updated_at = row["updated_at"].c_str();
    return s;
}

} // namespace

std::vector<OffsetStore::Stored>
OffsetStore::acquire(pqxx::transaction_base& tx, std::string_view group,
                     const std::vector<std::pair<std::string, std::int32_t>>& partitions) const
{
    std::vector<std::string> topics;
    std::vector<std::int64_t> parts;
    for (const auto& [t, p] : partitions) {
        topics.push_back(t);
        parts.push_back(p);
    }
    const auto r = detail::pg::exec_params(
        tx,
        fmt::format("INSERT INTO {0} AS o (consumer_group, topic, partition, epoch)"
                    " SELECT $1, t, p, 1 FROM unnest($2::text[], $3::int[]) AS v(t, p)"
                    " ON CONFLICT (consumer_group, topic, partition)"
                    " DO UPDATE SET epoch = o.epoch + 1"
                    " RETURNING o.topic, o.partition, o.next_offset, o.epoch, o.updated_at::text AS updated_at",
                    qualified_),
        std::string(group), text_array(topics), int_array(parts));
    std::vector<Stored> out;
    for (const auto& row : r)
        out.push_back(stored_of(row));
    return out;
}

std::vector<OffsetStore::Position> OffsetStore::write(pqxx::transaction_base& tx, std::string_view group,
                                                      const std::vector<Position>& positions) const
{
    if (positions.empty())
        return {};
    std::vector<std::string> topics;
    std::vector<std::int64_t> parts, offsets, epochs;
    for (const auto& p : positions) {
        topics.push_back(p.topic);
        parts.push_back(p.partition);
        offsets.push_back(p.next_offset);
        epochs.push_back(p.epoch);
    }
    const auto r = detail::pg::exec_params(
        tx,
        fmt::format("UPDATE {} AS o SET next_offset = GREATEST(o.next_offset, v.n), updated_at = now()"
                    " FROM unnest($2::text[], $3::int[], $4::bigint[], $5::bigint[]) AS v(t, p, n, e)"
                    " WHERE o.consumer_group = $1 AND o.topic = v.t AND o.partition = v.p AND o.epoch = v.e"
                    " RETURNING o.topic, o.partition",
                    qualified_),
        std::string(group), text_array(topics), int_array(parts), int_array(offsets), int_array(epochs));
    if (static_cast<std::size_t>(r.size()) == positions.size())
        return {};
    std::vector<Position> fenced;
    for (const auto& p : positions) {
        bool written = false;
        for (const auto& row : r)
            if (p.topic == row[0].c_str() && p.partition == row[1].as<std::int32_t>())
                written = true;
        if (!written)
            fenced.push_back(p);
    }
    return fenced;
}

std::vector<std::pair<std::string, OffsetStore::Stored>> OffsetStore::read(pqxx::transaction_base& tx,
                                                                           std::string_view group) const
{
    const auto r = detail::pg::exec_params(
        tx,
        fmt::format("SELECT consumer_group, topic, partition, next_offset, epoch, updated_at::text AS updated_at"
                    " FROM {} WHERE $1 = '' OR consumer_group = $1 ORDER BY consumer_group, topic, partition",
                    qualified_),
        std::string(group));
    std::vector<std::pair<std::string, Stored>> out;
    for (const auto& row : r)
        out.emplace_back(row["consumer_group"].c_str(), stored_of(row));
    return out;
}

std::optional<std::int64_t> OffsetStore::set(pqxx::transaction_base& tx, std::string_view group, std::string_view topic,
                                             std::int32_t partition, std::int64_t next_offset) const
{
    const auto before = detail::pg::exec_params(
        tx,
        fmt::format("SELECT next_offset FROM {} WHERE consumer_group = $1 AND topic = $2 AND partition = $3 "
                    "FOR UPDATE",
                    qualified_),
        std::string(group), std::string(topic), partition);
    std::optional<std::int64_t> previous;
    if (!before.empty() && !before[0][0].is_null())
        previous = before[0][0].as<std::int64_t>();
    detail::pg::exec_params(tx,
                            fmt::format("INSERT INTO {0} AS o (consumer_group, topic, partition, next_offset, epoch)"
                                        " VALUES ($1, $2, $3, $4, 1)"
                                        " ON CONFLICT (consumer_group, topic, partition)"
                                        " DO UPDATE SET next_offset = EXCLUDED.next_offset, epoch = o.epoch + 1,"
                                        " updated_at = now()",
                                        qualified_),
                            std::string(group), std::string(topic), partition, next_offset);
    return previous;
}

} // namespace idemkafka
