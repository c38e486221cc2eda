#pragma once
// The parts of Maintenance that work on an open connection: creating range
// partitions (moving their rows out of the default partition), dropping
// expired ones, and purging expired claims in small batches. Private to the
// library.

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"
#include "observe/log_context.hpp"
#include "retention/catalog.hpp"

namespace idemkafka::detail::retention {

/// A line of maintenance's log (component "maintenance"); never throws.
template <class... Args>
void say(const LogSink& log, LogLevel level, fmt::format_string<Args...> f, Args&&... args) noexcept
{
    if (!log)
        return;
    try {
        emit(log, level, fmt::format(f, std::forward<Args>(args)...), "maintenance");
    } catch (...) {
    }
}

class MaintenanceOps {
public:
    MaintenanceOps(const ProcessedEventStore& store, const RetentionConfig& cfg, const LogSink& log,
                   const std::atomic<bool>& cancel)
        : store_(store), cfg_(cfg), log_(log), cancel_(cancel)
    {
    }

    template <class... Args> void say(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const noexcept
    {
        retention::say(log_, level, f, std::forward<Args>(args)...);
    }

    // Every action goes both to the report and to the log, so a long run shows
    // its progress as it happens.
    void note(std::vector<std::string>& lines, LogLevel level, std::string line) const
    {
        say(level, "{}", line);
        lines.push_back(std::move(line));
    }

    // Creates the range partitions covering [now - retention, now + partitions_ahead
    // windows) that do not overlap existing ones.
    void create_partitions(pqxx::connection& conn, std::chrono::system_clock::time_point now, bool dry_run,
                           std::vector<std::string>& created, std::uint64_t& moved,
                           std::vector<std::string>& actions) const;

    // Returns false (and the row count in `rows`) when too many rows would have to move.
    bool create_partition(pqxx::connection& conn, const Partition* def, const std::string& name, const EventId& lo,
                          const EventId& hi, bool dry_run, std::uint64_t& rows) const;

    // Drops the range partitions whose every id is older than `cutoff`.
    void drop_expired(pqxx::connection& conn, std::chrono::system_clock::time_point now,
                      std::chrono::system_clock::time_point cutoff, bool dry_run, std::vector<std::string>& dropped,
                      std::vector<std::string>& kept, std::vector<std::string>& actions) const;

    // Deletes the rows of `target` that expired before `cutoff`, purge_batch
    // rows per short transaction, with a pause in between.
    void purge(pqxx::connection& conn, const std::string& target, const std::string& label,
               std::chrono::system_clock::time_point now, std::chrono::system_clock::time_point cutoff, bool dry_run,
               MaintenanceReport& report) const;

    // `cutoff`, or earlier when a group registered a longer retention since the
    // run began: read under a SHARE lock on the retention registry that `tx`
    // holds until it ends, so no group registers before its DROP or DELETE
    // commits.
    std::chrono::system_clock::time_point locked_cutoff(pqxx::work& tx, std::chrono::system_clock::time_point now,
                                                        std::chrono::system_clock::time_point cutoff) const;

private:
    const ProcessedEventStore& store_;
    const RetentionConfig& cfg_;
    const LogSink& log_;
    const std::atomic<bool>& cancel_;
};

} // namespace idemkafka::detail::retention
