#pragma once
/// \file
/// Retention of the dedup claims without losing dedup: the dedup-horizon
/// guard and Maintenance (schema migration, partitions created ahead and
/// dropped when expired, or a batched purge). Its settings, RetentionConfig,
/// are in config.hpp.
///
/// Partitioned mode ranges `processed_event` BY RANGE (event_id). A UUIDv7's
/// leading 48 bits are its creation time in milliseconds and PostgreSQL compares
/// uuid values bytewise, so a range of ids is a range of creation times, and a
/// redelivery of an id always lands in the partition of its first claim and
/// conflicts there, however late it arrives. See docs/retention.md.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <pqxx/connection>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/dead_letter.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka {

/// What the horizon guard says about one event.
enum class HorizonAction {
    process,     ///< hand the event to the handler (claim first, as always)
    dead_letter, ///< dead letter with HorizonDecision::reason, do not claim
    reconcile,   ///< call RetentionConfig::reconcile in the transaction before the claim
};

/// The verdict of HorizonGuard::check().
struct HorizonDecision {
    HorizonAction action = HorizonAction::process; ///< what the consumer does with the record
    /// Dead-letter reason when action == dead_letter
    /// (DeadLetterReason::beyond_dedup_horizon or non_v7_event_id), empty otherwise.
    std::optional<DeadLetterReason> reason;
    /// The id is a UUIDv7, so its age is known.
    bool has_timestamp = false;
    /// now - creation time of the id; negative for an id from the future, zero
    /// without a timestamp.
    std::chrono::milliseconds age{0};
    /// The id is at least dedup_horizon() old: its claim may be gone already.
    bool beyond_horizon = false;
    /// The downstream Idempotency-Key is still remembered: age <
    /// downstream_key_window. Always true when no window is configured; false
    /// when a window is configured and the age is unknown (not a UUIDv7).
    bool key_window_open = true;
};

/// Pure logic, no I/O: decides from an event id and the current time whether
/// the event is within the dedup horizon. Thread-safe (immutable).
class IDEMKAFKA_API HorizonGuard {
public:
    /// Throws ConfigError if `config` does not validate.
    explicit HorizonGuard(const RetentionConfig& config);

    /// Classifies `id` as seen at `now`. Beyond the horizon means age >=
    /// dedup_horizon(); the key window is open while age < downstream_key_window.
    /// Non-v7 ids: in partitioned mode per RetentionConfig::non_v7, in purge mode
    /// processed (their age is unknown, their claim lasts `retention` after
    /// processing). Never throws.
    HorizonDecision check(const EventId& id, std::chrono::system_clock::time_point now) const noexcept;
    /// Same, at system_clock::now().
    HorizonDecision check(const EventId& id) const noexcept;

    /// retention - horizon_margin.
    std::chrono::milliseconds horizon() const noexcept { return horizon_; }

private:
    RetentionMode mode_;
    std::chrono::milliseconds horizon_;
    std::chrono::milliseconds key_window_;
    HorizonPolicy beyond_;
    NonV7Policy non_v7_;
};

/// The lower bound of the ids created at `unix_ms`: the first 48 bits are the
/// timestamp, every other bit zero. Every UUIDv7 created in that millisecond
/// sorts at or after it and before partition_bound(unix_ms + 1). `unix_ms` is
/// clamped to [0, 2^48 - 1]. Never throws.
IDEMKAFKA_API EventId partition_bound(std::int64_t unix_ms) noexcept;

/// The deterministic name of the range partition of `table` whose lower bound is
/// `from_unix_ms` (UTC): `<table>_pYYYYMMDD_HHMM`, with the table part shortened
/// and suffixed with a hash when the result would exceed 63 bytes. Never throws
/// for a table quote_identifier() accepts.
IDEMKAFKA_API std::string partition_name(std::string_view table, std::int64_t from_unix_ms);
/// `<table>_default`, shortened the same way.
IDEMKAFKA_API std::string default_partition_name(std::string_view table);
/// `<table>_retention`, shortened the same way: the claims table's retention
/// registry (each consumer group's retention; see Maintenance::register_group()).
IDEMKAFKA_API std::string retention_registry_name(std::string_view table);

/// What Maintenance::migrate() did.
struct MigrationReport {
    bool created = false;   ///< the table did not exist and was created
    bool converted = false; ///< a plain table became the default partition of a partitioned one
    RetentionMode mode = RetentionMode::partitioned; ///< the table's layout afterwards
    std::vector<std::string> partitions_created;     ///< partitions created, by name
    std::vector<std::string> notes;                  ///< one line per other change or skipped step
};

/// One consumer group's registration in a claims table's retention registry
/// (Maintenance::register_group()).
struct RegisteredRetention {
    std::string consumer_group;          ///< the group
    std::chrono::milliseconds retention; ///< its RetentionConfig::retention at its latest registration
    std::chrono::system_clock::time_point registered_at{}; ///< when it last registered
    std::string registered_by;                             ///< the PostgreSQL role that registered it
};

/// What one maintenance run did (or, in a dry run, would do).
struct MaintenanceReport {
    /// False when another instance held the maintenance lock: nothing was done.
    bool acted = false;
    bool dry_run = false; ///< only reported what it would do
    /// The table's actual layout.
    RetentionMode mode = RetentionMode::partitioned;
    /// The time the run used as "now".
    std::chrono::system_clock::time_point now{};
    /// Claims older than this were expired: now - retention.
    std::chrono::system_clock::time_point cutoff{};
    /// The retention the run kept claims for: the longest of its own
    /// RetentionConfig::retention and every group's registered one.
    std::chrono::milliseconds retention{0};
    /// The group whose registered retention that is; empty when it is the run's own.
    std::string retention_group;
    std::vector<std::string> partitions_created; ///< partitions created, by name
    std::vector<std::string> partitions_dropped; ///< expired partitions dropped, by name
    /// Expired partitions that could not be dropped (their DROP waited longer
    /// than lock_timeout for a transaction on the claims table, or failed);
    /// each is logged at warning level and tried again at the next run.
    std::vector<std::string> partitions_kept;
    /// Rows moved from the default partition into newly created partitions.
    std::uint64_t rows_moved = 0;
    /// Rows purged (purge mode, and the default partition in partitioned mode);
    /// in a dry run, rows that would be.
    std::uint64_t rows_purged = 0;
    std::size_t purge_batches = 0; ///< purge statements run
    /// The purge stopped at purge_max_batches (or on cancel) with rows left.
    bool purge_incomplete = false;
    /// One human-readable line per action, skip or mismatch, in order.
    std::vector<std::string> actions;
};

/// One partition of a partitioned claims table.
struct PartitionInfo {
    std::string name;        ///< the partition's table name
    bool is_default = false; ///< the default partition (ids outside every range)
    /// \name Range
    //@{
    /// Creation-time range [from, to) of the ids it holds; nullopt for
    /// MINVALUE/MAXVALUE and for the default partition.
    std::optional<std::chrono::system_clock::time_point> from, to;
    //@}
    /// PostgreSQL's text of the bound, e.g. `FOR VALUES FROM ('...') TO ('...')`.
    std::string bound;
    std::int64_t rows = 0; ///< rows in it now (an estimate for large tables)
};

/// Claims of one consumer group.
struct GroupInfo {
    std::string consumer_group; ///< the group's name
    std::int64_t rows = 0;      ///< its claims
    /// \name Claim times
    //@{
    /// Creation times of its oldest and newest claims; nullopt without claims.
    std::optional<std::chrono::system_clock::time_point> oldest_claim, newest_claim;
    //@}
};

/// What Maintenance::status() found.
struct RetentionStatus {
    bool exists = false; ///< the claims table exists
    /// The table's actual layout (meaningful when exists).
    RetentionMode mode = RetentionMode::partitioned;
    std::int64_t rows = 0;         ///< claims in all groups
    std::vector<GroupInfo> groups; ///< per consumer group
    /// The retention registry, longest retention first: maintenance keeps every
    /// claim for the longest of these and its own retention.
    std::vector<RegisteredRetention> registered;
    /// Partitioned mode: range partitions ordered by bound, the default one last.
    std::vector<PartitionInfo> partitions;
    /// \name Claim times
    //@{
    /// Creation times of the oldest and newest claims; nullopt without claims.
    std::optional<std::chrono::system_clock::time_point> oldest_claim, newest_claim;
    //@}
    std::chrono::system_clock::time_point now{}; ///< the time the status used as "now"
    /// retention - horizon_margin.
    std::chrono::milliseconds dedup_horizon{0};
    /// Events created before this are beyond the horizon (now - dedup_horizon).
    std::chrono::system_clock::time_point horizon_cutoff{};
    /// \name Partition range
    //@{
    /// Partitioned: lower bound of the oldest range partition (ids created before
    /// it are kept only in the default partition, by processed_at) and upper
    /// bound of the newest (`partitions_to`).
    std::optional<std::chrono::system_clock::time_point> partitions_from, partitions_to;
    //@}
};

/// Schema migration and retention of one claims table. A Maintenance object is
/// not thread-safe, except cancel(); several processes may run maintenance on
/// the same table at once: a session advisory lock lets only one of them act.
class IDEMKAFKA_API Maintenance {
public:
    /// The source of "now" (system_clock::now when empty).
    using WallClock = std::function<std::chrono::system_clock::time_point()>;

    /// Throws ConfigError if `config` does not validate. `clock` (default
    /// system_clock::now) is the notion of "now" for expiry and partitions ahead;
    /// `log` (default: none) receives progress lines.
    Maintenance(ProcessedEventStore store, RetentionConfig config, LogSink log = {}, WallClock clock = {});

    /// How migrate() treats an existing table whose layout differs from
    /// RetentionConfig::mode.
    enum class Existing { keep, convert };

    /// Creates the schema and the table in RetentionConfig::mode if missing
    /// (partitioned: with its default partition and the partitions from now -
    /// retention to partitions_ahead ahead; purge: with an index on
    /// processed_at). An existing table keeps its layout, or with
    /// Existing::convert a plain one becomes the default partition of a new
    /// partitioned table. A table of an earlier schema version is upgraded in
    /// place first, in the same transaction. Each lock on a table is waited for
    /// at most RetentionConfig::lock_timeout (claims queued behind a
    /// conversion's request wait no longer); past it the transaction rolls back
    /// and runs again after a pause (1 s, doubling; 5 attempts, a warning line
    /// each). Idempotent; safe to run twice and concurrently. Throws
    /// ConfigError for a conversion it cannot do (partitioned to plain, or a
    /// table partitioned by something other than event_id) or a table of a
    /// newer schema version (both versions named), and DatabaseError when
    /// PostgreSQL fails.
    MigrationReport migrate(pqxx::connection& conn, Existing existing = Existing::keep);

    /// One maintenance run. Partitioned table: creates missing partitions from now -
    /// retention to partitions_ahead ahead, drops partitions whose every id is older
    /// than retention, purges the default partition by processed_at. Plain table:
    /// purges rows with processed_at older than retention in bounded batches.
    /// Expiry uses the longest of this object's retention and every retention
    /// registered on the table (register_group()): several consumer groups
    /// may share the table, and none loses a claim its own retention keeps.
    /// Each DROP and purge batch reads the registry again under a lock that
    /// keeps a group from registering meanwhile. Returns
    /// with acted == false if another session holds the maintenance lock. With
    /// `dry_run` nothing changes; the report says what would. Throws DatabaseError if
    /// the table does not exist or PostgreSQL fails (a partition that cannot be
    /// created or dropped within lock_timeout is reported, not thrown).
    MaintenanceReport run_once(pqxx::connection& conn, bool dry_run = false);

    /// Records this object's retention as `consumer_group`'s in the table's
    /// retention registry, replacing the group's earlier registration (a
    /// retention lowered takes effect; a warning is logged). Every consumer
    /// registers its group at start, before its first claim. Returns the
    /// group's earlier retention, if any. Throws DatabaseError when the
    /// registry does not exist (the table is older than schema version 2: run
    /// migrate()) or PostgreSQL fails.
    std::optional<std::chrono::milliseconds> register_group(pqxx::connection& conn, const std::string& consumer_group);

    /// Removes `consumer_group` from the table's retention registry (a group
    /// retired for good: its claims then expire by the others' retention).
    /// Returns whether it was registered. Throws DatabaseError when PostgreSQL fails.
    bool forget_group(pqxx::connection& conn, const std::string& consumer_group);

    /// Rows per consumer group, partitions with their time ranges, oldest and
    /// newest claim, the effective dedup horizon. Counts are exact (they scan the
    /// table). Throws DatabaseError when PostgreSQL fails.
    RetentionStatus status(pqxx::connection& conn) const;

    /// Makes a running or later run_once() stop after its current batch. Thread-safe.
    void cancel() noexcept { cancel_.store(true); }

    /// The table this object maintains. Never throws.
    const ProcessedEventStore& store() const noexcept { return store_; }
    /// The validated configuration. Never throws.
    const RetentionConfig& config() const noexcept { return config_; }

private:
    ProcessedEventStore store_;
    RetentionConfig config_;
    LogSink log_;
    WallClock clock_;
    std::atomic<bool> cancel_{false};
};

/// Runs Maintenance::run_once() on a thread of its own every
/// maintenance_interval (the first run at once), with a connection of its own
/// (reconnected after a failure). Failures are logged, never thrown. Several
/// consumer instances may each have one: only one acts at a time.
class IDEMKAFKA_API MaintenanceRunner {
public:
    /// Starts the thread. Throws ConfigError if `config` does not validate.
    MaintenanceRunner(std::string conninfo, ProcessedEventStore store, const RetentionConfig& config, LogSink log = {},
                      Maintenance::WallClock clock = {});
    /// stop().
    ~MaintenanceRunner();
    MaintenanceRunner(const MaintenanceRunner&) = delete;
    MaintenanceRunner& operator=(const MaintenanceRunner&) = delete;

    /// Interrupts a purge after its current batch and joins the thread. Idempotent; never throws.
    void stop() noexcept;
    /// Runs completed, whether or not they acted. Thread-safe; never throws.
    std::uint64_t runs() const noexcept;
    /// Runs that failed (logged, retried at the next interval). Thread-safe; never throws.
    std::uint64_t failures() const noexcept;
    /// Expired partitions the latest run could not drop (partitions_kept of
    /// its report); 0 before the first run. Thread-safe; never throws.
    std::uint64_t expired_partitions_kept() const noexcept;
    /// The report of the latest completed run, if any. Thread-safe; throws only std::bad_alloc.
    std::optional<MaintenanceReport> last_report() const;

private:
    struct IDEMKAFKA_LOCAL Impl; // the thread, its connection and the counters (src/retention/runner.cpp)
    std::unique_ptr<Impl> impl_;
};

} // namespace idemkafka
