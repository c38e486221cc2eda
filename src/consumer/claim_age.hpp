#pragma once
// The oldest_claim_age_seconds gauge: how old the oldest claim of a consumer
// group is, measured on a connection and thread of its own, never on a worker's.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <pqxx/pqxx>

#include "pg/watch.hpp"

#include "core/periodic.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka::detail {

/// The first statement of oldest_claim_ms() below: `$1` the consumer group.
std::string oldest_claim_sql(const ProcessedEventStore& store);

/// The creation time (Unix ms) of `group`'s oldest claim in `store`'s table, or
/// nullopt when the group has none. The claim with the smallest event id is the
/// oldest one for UUIDv7 ids (their first 48 bits are the creation time and
/// uuid compares bytewise). `ORDER BY event_id LIMIT 1` finds it with an index
/// only scan of the primary key (event_id, consumer_group) from its start, the
/// group checked on the index entries, stopping at the group's first one (per
/// partition, merged, on a partitioned table). That is a few pages when groups'
/// claims interleave; a group whose claims all follow many older claims of
/// other groups walks past those (about 0.3-0.6 s per million on the
/// development machine), which an index led by consumer_group would avoid at a
/// cost on every claim. When the smallest id is not a UUIDv7 its position says
/// nothing about age, and the group's oldest `processed_at` is used instead (an
/// index scan in purge mode, a scan of the group's rows otherwise). Each
/// statement runs under a statement_timeout of `timeout`. Throws pqxx errors.
std::optional<std::int64_t> oldest_claim_ms(pqxx::connection& conn, const ProcessedEventStore& store,
                                            const std::string& group, std::chrono::milliseconds timeout);

/// Sets `gauge` to oldest_claim_ms() (-1 when the group has no claim) every
/// `interval`, the first time at once, on a thread and connection of its own
/// (reconnected after a failure). A failed refresh keeps the last value and is
/// logged once until a refresh succeeds again; nothing is thrown.
class ClaimAgeMonitor {
public:
    ClaimAgeMonitor(std::string conninfo, ProcessedEventStore store, std::string group,
                    std::chrono::milliseconds interval, Metrics::Gauge& gauge, LogSink log);
    /// stop().
    ~ClaimAgeMonitor();
    ClaimAgeMonitor(const ClaimAgeMonitor&) = delete;
    ClaimAgeMonitor& operator=(const ClaimAgeMonitor&) = delete;

    /// Joins the thread (a running query finishes first, within its timeout). Idempotent.
    void stop() noexcept;

private:
    void refresh() noexcept;
    void say(LogLevel level, const std::string& line) noexcept;

    std::string conninfo_;
    ProcessedEventStore store_;
    std::string group_;
    std::chrono::milliseconds interval_;
    Metrics::Gauge& gauge_;
    LogSink log_;
    pg::Session conn_; // the thread's; reconnected after a failure
    bool failing_ = false;
    PeriodicThread thread_; // last: stopped before the members it uses go
};

} // namespace idemkafka::detail
