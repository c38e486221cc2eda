#include "consumer/claim_age.hpp"
#include "observe/log_context.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "idemkafka/event_id.hpp"
#include "pg/connect.hpp"
#include "pg/exec.hpp"

namespace idemkafka::detail {

std::string oldest_claim_sql(const ProcessedEventStore& store)
{
    // PostgreSQL has no min(uuid). The column is selected as it is: an output
    // column `event_id::text AS event_id` would make ORDER BY sort the text,
    // and the plan a scan and a sort instead of an index walk.
    return fmt::format("SELECT event_id FROM {} WHERE consumer_group = $1 ORDER BY event_id LIMIT 1",
                       store.qualified_name());
}

std::optional<std::int64_t> oldest_claim_ms(pqxx::connection& conn, const ProcessedEventStore& store,
                                            const std::string& group, std::chrono::milliseconds timeout)
{
    pqxx::read_transaction tx(conn);
    tx.exec(fmt::format("SET LOCAL statement_timeout = {}", std::max<long long>(1, timeout.count())));
    const auto first = pg::exec_params(tx, oldest_claim_sql(store), group);
    if (first.empty())
        return std::nullopt;
    EventId id;
    if (EventId::try_parse(first[0][0].c_str(), id) && id.version() == 7)
        return static_cast<std::int64_t>(id.unix_ms());
    const auto oldest = pg::exec_params(
        tx,
        fmt::format("SELECT (extract(epoch FROM min(processed_at)) * 1000)::bigint FROM {} WHERE consumer_group = $1",
                    store.qualified_name()),
        group);
    if (oldest.empty() || oldest[0][0].is_null())
        return std::nullopt;
    return oldest[0][0].as<std::int64_t>();
}

ClaimAgeMonitor::ClaimAgeMonitor(std::string conninfo, ProcessedEventStore store, std::string group,
                                 std::chrono::milliseconds interval, Metrics::Gauge& gauge, LogSink log)
    : conninfo_(std::move(conninfo)), store_(std::move(store)), group_(std::move(group)), interval_(interval),
      gauge_(gauge), log_(std::move(log))
{
    thread_.start(interval_, [this] { refresh(); });
}

ClaimAgeMonitor::~ClaimAgeMonitor()
{
    stop();
}

void ClaimAgeMonitor::stop() noexcept
{
    conn_.watch.arm(pg::stop_grace); // a refresh blocked on a frozen server ends
    thread_.stop();
}

void ClaimAgeMonitor::say(LogLevel level, const std::string& line) noexcept
{
    detail::emit(log_, level, line, "consumer", {{log_field::group, group_}});
}

void ClaimAgeMonitor::refresh() noexcept
{
    // A refresh may take this long; a slow walk of the index (many older claims
    // of other groups) then leaves the previous value rather than loading the server.
    const auto timeout = std::clamp(interval_, std::chrono::milliseconds(1000), std::chrono::milliseconds(10000));
    try {
        if (!conn_.db)
            conn_.connect(conninfo_);
        // statement_timeout bounds a busy server; a frozen one enforces nothing.
        const pg::Watch::Armed armed(conn_.watch, timeout + pg::stop_grace);
        const auto oldest = oldest_claim_ms(*conn_.db, store_, group_, timeout);
        gauge_.set(oldest ? *oldest : -1);
        if (failing_)
            say(LogLevel::info,
                fmt::format("oldest claim of {} in {} measured again", group_, store_.qualified_name()));
        failing_ = false;
    } catch (const std::exception& e) {
        if (conn_.db && !conn_.db->is_open())
            conn_.disconnect();
        if (!failing_)
            say(LogLevel::warning, fmt::format("cannot measure the oldest claim of {} in {} (the gauge keeps "
                                               "its last value, retried every {} ms): {}",
                                               group_, store_.qualified_name(), interval_.count(), e.what()));
        failing_ = true;
    } catch (...) {
        conn_.disconnect();
        failing_ = true;
    }
}

} // namespace idemkafka::detail
