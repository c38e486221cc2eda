#include "idemkafka/outbox.hpp"

#include <thread>
#include <utility>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/store.hpp"
#include "observe/trace.hpp"
#include "outbox/row_format.hpp"
#include "pg/exec.hpp"
#include "pg/transaction.hpp"

namespace idemkafka {
namespace {

using detail::outbox::check_topic;
using detail::outbox::encode_headers;
using detail::outbox::to_hex;

std::string prefixed(std::string_view prefix, const ConfigError& e)
{
    return std::string(prefix) + e.what();
}

} // namespace

// ---- Outbox ------------------------------------------------------------------

Outbox::Outbox(std::string schema, std::string table) : schema_(std::move(schema)), table_(std::move(table))
{
    try {
        schema_q_ = quote_identifier(schema_);
    } catch (const ConfigError& e) {
        throw ConfigError(prefixed("schema: ", e));
    }
    try {
        qualified_ = schema_q_ + "." + quote_identifier(table_);
    } catch (const ConfigError& e) {
        throw ConfigError(prefixed("table: ", e));
    }
    insert_sql_ = fmt::format("INSERT INTO {} (event_id, topic, key, payload, headers) VALUES ($1::uuid, $2, "
                              "CASE WHEN $3::boolean THEN decode($4, 'hex') END, decode($5, 'hex'), "
                              "CASE WHEN $6::boolean THEN decode($7, 'hex') END)",
                              qualified_);
}

void Outbox::ensure_schema(const std::string& conninfo) const
{
    detail::in_own_transaction(conninfo, [this](pqxx::work& tx) { ensure_schema(tx); });
}

EventId Outbox::enqueue(pqxx::transaction_base& tx, std::string_view topic, std::optional<std::string_view> key,
                        std::string_view payload, const std::vector<Header>& headers,
                        std::optional<EventId> event_id) const
{
    check_topic(topic);
    if (event_id && event_id->is_nil())
        throw InvalidEventId("enqueue: the event id is the nil UUID");
    const EventId id = event_id ? *event_id : new_event_id();
    std::vector<Header> traced;
    const auto& all = detail::with_trace(headers, traced); // inside a handler: the record's trace context
    detail::pg::exec_params(tx, insert_sql_, id.to_string(), std::string(topic), key.has_value(),
                            key ? to_hex(*key) : std::string(), to_hex(payload), !all.empty(),
                            to_hex(encode_headers(all)));
    return id;
}

std::int64_t Outbox::pending(pqxx::transaction_base& tx) const
{
    return tx.exec(fmt::format("SELECT count(*) FROM {} WHERE sent_at IS NULL", qualified_))[0][0].as<std::int64_t>();
}

std::uint64_t Outbox::purge_sent(pqxx::connection& conn, std::chrono::milliseconds older_than,
                                 const OutboxPurgeLimits& limits) const
{
    if (older_than.count() < 0)
        throw ConfigError("purge_sent: older_than must not be negative");
    if (limits.batch == 0 || limits.max_batches == 0)
        throw ConfigError("purge_sent: batch and max_batches must be at least 1");
    // An id array keeps each statement to its own small set of rows, found
    // through the sent_at index.
    const std::string sql =
        fmt::format("DELETE FROM {0} WHERE id = ANY(ARRAY(SELECT id FROM {0} WHERE sent_at < now() - $1::bigint * "
                    "interval '1 millisecond' LIMIT $2))",
                    qualified_);
    std::uint64_t total = 0;
    try {
        for (std::size_t b = 0; b < limits.max_batches; ++b) {
            if (b > 0 && limits.pause.count() > 0)
                std::this_thread::sleep_for(limits.pause);
            pqxx::work tx(conn);
            const auto n = static_cast<std::uint64_t>(
                detail::pg::exec_params(tx, sql, static_cast<std::int64_t>(older_than.count()),
                                        static_cast<std::int64_t>(limits.batch))
                    .affected_rows());
            tx.commit();
            total += n;
            if (n < limits.batch)
                break;
        }
    } catch (const pqxx::failure& e) {
        throw DatabaseError(
            fmt::format("purging sent rows of {} failed after {} rows: {}", qualified_, total, e.what()));
    }
    return total;
}

// ---- options -----------------------------------------------------------------

void OutboxRelayOptions::validate() const
{
    auto require = [](bool ok, const char* what) {
        if (!ok)
            throw ConfigError(what);
    };
    require(batch_size >= 1 && batch_size <= 100000, "batch_size: must be between 1 and 100000");
    require(poll_interval.count() > 0, "poll_interval: must be positive");
    require(publish_timeout.count() > 0, "publish_timeout: must be positive");
    require(retry_backoff.count() > 0, "retry_backoff: must be positive");
    require(retry_backoff_max >= retry_backoff, "retry_backoff_max: must not be below retry_backoff");
    require(max_held_keys >= 1, "max_held_keys: must be at least 1");
    require(retention.count() >= 0, "retention: must not be negative (zero turns the purge off)");
    require(retention.count() == 0 || purge_interval.count() > 0, "purge_interval: must be positive");
    require(purge_limits.batch >= 1, "purge_limits.batch: must be at least 1");
    require(purge_limits.max_batches >= 1, "purge_limits.max_batches: must be at least 1");
    require(purge_limits.pause.count() >= 0, "purge_limits.pause: must not be negative");
}

Outbox OutboxConfig::outbox() const
{
    return Outbox(schema, table);
}

void OutboxConfig::validate() const
{
    try {
        (void)outbox();
    } catch (const ConfigError& e) {
        throw ConfigError(prefixed("outbox.", e));
    }
    try {
        relay_options.validate();
    } catch (const ConfigError& e) {
        throw ConfigError(prefixed("outbox.relay_options.", e));
    }
    // Only `kafka` is checked here; the brokers are the consumer's own.
    PublisherConfig pc;
    pc.brokers = "unused";
    pc.kafka = kafka;
    try {
        pc.validate();
    } catch (const ConfigError& e) {
        throw ConfigError(prefixed("outbox.", e));
    }
}

} // namespace idemkafka
