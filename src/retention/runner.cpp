// MaintenanceRunner: maintenance of one claims table on a thread of its own,
// every maintenance_interval, on a connection it reopens after a failure.

#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "core/duration_text.hpp"
#include "core/periodic.hpp"
#include "idemkafka/retention.hpp"
#include "observe/log_context.hpp"
#include "pg/connect.hpp"
#include "pg/watch.hpp"

namespace idemkafka {

struct MaintenanceRunner::Impl {
    Impl(std::string conninfo_in, ProcessedEventStore store, const RetentionConfig& config, LogSink sink,
         Maintenance::WallClock clock)
        : conninfo(std::move(conninfo_in)),
          // The connection string's password is masked in every line, also where
          // libpq quotes it back without its key.
          maintenance(std::move(store), config, detail::with_context(sink, {}, detail::secrets_of(conninfo)),
                      std::move(clock)),
          log(detail::with_context(std::move(sink), {}, detail::secrets_of(conninfo))),
          interval(config.maintenance_interval)
    {
    }

    void run() noexcept;

    std::string conninfo;
    Maintenance maintenance;
    LogSink log;
    std::chrono::milliseconds interval;
    detail::pg::Session conn; // the thread's; reconnected after a failure
    mutable std::mutex mutex; // last
    std::optional<MaintenanceReport> last;
    std::atomic<std::uint64_t> runs{0}, failures{0}, kept{0};
    detail::PeriodicThread thread; // last: stopped before the members it uses go
};

MaintenanceRunner::MaintenanceRunner(std::string conninfo, ProcessedEventStore store, const RetentionConfig& config,
                                     LogSink log, Maintenance::WallClock clock)
    : impl_(std::make_unique<Impl>(std::move(conninfo), std::move(store), config, std::move(log), std::move(clock)))
{
    Impl* impl = impl_.get();
    impl->thread.start(impl->interval, [impl] { impl->run(); });
}

MaintenanceRunner::~MaintenanceRunner()
{
    stop();
}

void MaintenanceRunner::stop() noexcept
{
    impl_->maintenance.cancel();                   // a purge stops after its current batch
    impl_->conn.watch.arm(detail::pg::stop_grace); // a statement blocked on a frozen server ends
    impl_->thread.stop();
}

std::uint64_t MaintenanceRunner::runs() const noexcept
{
    return impl_->runs.load();
}

std::uint64_t MaintenanceRunner::failures() const noexcept
{
    return impl_->failures.load();
}

std::uint64_t MaintenanceRunner::expired_partitions_kept() const noexcept
{
    return impl_->kept.load();
}

std::optional<MaintenanceReport> MaintenanceRunner::last_report() const
{
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->last;
}

void MaintenanceRunner::Impl::run() noexcept
{
    auto say = [this](LogLevel level, std::string line, detail::LogFields fields = {}) {
        detail::emit(log, level, std::move(line), "maintenance", std::move(fields));
    };
    try {
        if (!conn.db) {
            conn.connect(conninfo);
            detail::pg::require_own_session(*conn.db, conninfo); // its lock is a session's
        }
        MaintenanceReport report = maintenance.run_once(*conn.db);
        const bool changed =
            !report.partitions_created.empty() || !report.partitions_dropped.empty() || report.rows_purged > 0;
        if (report.acted)
            say(changed ? LogLevel::info : LogLevel::debug,
                fmt::format("maintenance of {}: {} partitions created, {} dropped, {} rows purged",
                            maintenance.store().qualified_name(), report.partitions_created.size(),
                            report.partitions_dropped.size(), report.rows_purged));
        if (report.acted)
            kept.store(report.partitions_kept.size());
        {
            std::lock_guard<std::mutex> lock(mutex);
            last = std::move(report);
        }
        runs.fetch_add(1);
    } catch (const std::exception& e) {
        failures.fetch_add(1);
        conn.disconnect();
        say(LogLevel::warning,
            fmt::format("maintenance of {} failed, retried in {}: {}", maintenance.store().qualified_name(),
                        detail::duration_text(interval), e.what()),
            {{log_field::error, e.what()}});
    } catch (...) {
        failures.fetch_add(1);
        conn.disconnect();
    }
}

} // namespace idemkafka
