#include "idemkafka/retention.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <ctime>
#include <limits>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "core/duration_text.hpp"
#include "core/fnv1a.hpp"
#include "core/periodic.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/schema.hpp"
#include "observe/log_context.hpp"
#include "pg/connect.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"
#include "pg/watch.hpp"
#include "schema/ddl.hpp"
#include "schema/migration.hpp"

namespace idemkafka {
namespace {

using std::chrono::milliseconds;
using TimePoint = std::chrono::system_clock::time_point;

// 48 bits of milliseconds: the most a UUIDv7 timestamp can hold.
constexpr std::int64_t max_uuid_ms = (std::int64_t{1} << 48) - 1;
// PostgreSQL's identifier limit (NAMEDATALEN - 1).
constexpr std::size_t max_identifier = 63;
constexpr std::size_t max_partitions = 1000;

std::int64_t to_ms(TimePoint t)
{
    return std::chrono::duration_cast<milliseconds>(t.time_since_epoch()).count();
}

TimePoint from_ms(std::int64_t ms)
{
    return TimePoint(milliseconds(ms));
}

std::int64_t floor_div(std::int64_t a, std::int64_t b)
{
    const std::int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

std::int64_t clamp_ms(std::int64_t ms)
{
    return std::clamp<std::int64_t>(ms, 0, max_uuid_ms);
}

std::int64_t bound_ms(const EventId& id)
{
    std::int64_t ms = 0;
    for (std::size_t i = 0; i < 6; ++i)
        ms = (ms << 8) | id.bytes()[i];
    return ms;
}

std::string iso_utc(TimePoint t)
{
    const std::int64_t ms = to_ms(t);
    const auto secs = static_cast<std::time_t>(floor_div(ms, 1000));
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    const std::int64_t frac = ms - floor_div(ms, 1000) * 1000;
    return frac ? fmt::format("{}.{:03}Z", buf, frac) : fmt::format("{}Z", buf);
}

using detail::fnv1a;

// `<table><suffix>`, or when that exceeds PostgreSQL's limit (it would be
// truncated silently, and two long tables could then share partition names)
// a prefix of the table cut at a UTF-8 character boundary, a hash of the whole
// table name, and the suffix.
std::string derived_name(std::string_view table, std::string_view suffix)
{
    if (table.size() + suffix.size() <= max_identifier)
        return std::string(table) + std::string(suffix);
    std::size_t keep = max_identifier - suffix.size() - 9;
    while (keep > 0 && (static_cast<unsigned char>(table[keep]) & 0xC0) == 0x80)
        --keep;
    return fmt::format("{}_{:08x}{}", table.substr(0, keep), fnv1a(table), suffix);
}

std::string uuid_literal(const EventId& id)
{
    return "'" + id.to_string() + "'";
}

// SET LOCAL takes no parameters; the value is a number we format ourselves.
std::string set_lock_timeout(milliseconds d)
{
    return fmt::format("SET LOCAL lock_timeout = '{}ms'", std::max<std::int64_t>(d.count(), 1));
}

using detail::pg::is_lock_timeout;

struct TableKind {
    bool exists = false;
    bool partitioned = false;
    std::string partkey; // pg_get_partkeydef, e.g. "RANGE (event_id)"
};

TableKind table_kind(pqxx::transaction_base& tx, const std::string& qualified)
{
    const auto r = detail::pg::exec_params(tx,
                                           "SELECT c.relkind::text, coalesce(pg_get_partkeydef(c.oid), '') "
                                           "FROM pg_class c WHERE c.oid = to_regclass($1)",
                                           qualified);
    TableKind k;
    if (r.empty())
        return k;
    k.exists = true;
    k.partitioned = r[0][0].as<std::string>() == "p";
    k.partkey = r[0][1].as<std::string>();
    return k;
}

bool keyed_by_event_id(const TableKind& k)
{
    return k.partkey == "RANGE (event_id)";
}

// Creates an index on processed_at of `target` unless one leads with it already;
// returns whether it did. The purge finds its batches through it instead of
// scanning the table once per batch.
bool ensure_processed_at_index(pqxx::transaction_base& tx, const std::string& target, const std::string& index_name)
{
    const auto idx = detail::pg::exec_params(tx,
                                             "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                                             "AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass($1) "
                                             "AND a.attname = 'processed_at'",
                                             target);
    if (!idx.empty())
        return false;
    tx.exec(detail::ddl::processed_at_index(index_name, target));
    return true;
}

struct Partition {
    std::string schema;
    std::string name;
    std::string bound; // pg_get_expr(relpartbound)
    bool is_default = false;
    std::optional<EventId> lo; // nullopt: MINVALUE
    std::optional<EventId> hi; // nullopt: MAXVALUE
    bool parsed = false;       // the bound is a single-column uuid range we understood

    std::string qualified() const { return quote_identifier(schema) + "." + quote_identifier(name); }
};

// Parses one side of "FOR VALUES FROM ('…') TO ('…')".
bool parse_bound_value(std::string_view text, std::optional<EventId>& out)
{
    if (text == "MINVALUE" || text == "MAXVALUE") {
        out.reset();
        return true;
    }
    if (text.size() < 2 || text.front() != '\'' || text.back() != '\'')
        return false;
    EventId id;
    if (!EventId::try_parse(text.substr(1, text.size() - 2), id))
        return false;
    out = id;
    return true;
}

void parse_bound(Partition& p)
{
    if (p.bound == "DEFAULT") {
        p.is_default = true;
        return;
    }
    const std::string_view b = p.bound;
    constexpr std::string_view from = "FOR VALUES FROM (", to = ") TO (";
    if (b.substr(0, from.size()) != from || b.empty() || b.back() != ')')
        return;
    const auto mid = b.find(to);
    if (mid == std::string_view::npos)
        return;
    const auto lo_text = b.substr(from.size(), mid - from.size());
    const auto hi_text = b.substr(mid + to.size(), b.size() - 1 - (mid + to.size()));
    p.parsed = parse_bound_value(lo_text, p.lo) && parse_bound_value(hi_text, p.hi);
}

std::vector<Partition> list_partitions(pqxx::transaction_base& tx, const std::string& qualified)
{
    const auto r = detail::pg::exec_params(tx,
                                           "SELECT n.nspname, c.relname, pg_get_expr(c.relpartbound, c.oid) "
                                           "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                           "JOIN pg_namespace n ON n.oid = c.relnamespace "
                                           "WHERE i.inhparent = to_regclass($1)",
                                           qualified);
    std::vector<Partition> out;
    for (const auto& row : r) {
        Partition p;
        p.schema = row[0].as<std::string>();
        p.name = row[1].as<std::string>();
        p.bound = row[2].is_null() ? std::string() : row[2].as<std::string>();
        parse_bound(p);
        out.push_back(std::move(p));
    }
    // Ranges in id order (MINVALUE first), the default partition last.
    std::sort(out.begin(), out.end(), [](const Partition& a, const Partition& b) {
        if (a.is_default != b.is_default)
            return b.is_default;
        if (a.lo.has_value() != b.lo.has_value())
            return !a.lo.has_value();
        if (a.lo && b.lo && *a.lo != *b.lo)
            return *a.lo < *b.lo;
        return a.name < b.name;
    });
    return out;
}

const Partition* find_default(const std::vector<Partition>& parts)
{
    for (const auto& p : parts)
        if (p.is_default)
            return &p;
    return nullptr;
}

// [lo, hi) overlaps an existing range partition. A bound we cannot parse counts
// as overlapping everything: better a missing partition (claims go to the
// default one) than a failed ATTACH every run.
bool overlaps(const std::vector<Partition>& parts, const EventId& lo, const EventId& hi)
{
    for (const auto& p : parts) {
        if (p.is_default)
            continue;
        if (!p.parsed)
            return true;
        const bool starts_before_hi = !p.lo || *p.lo < hi;
        const bool ends_after_lo = !p.hi || lo < *p.hi;
        if (starts_before_hi && ends_after_lo)
            return true;
    }
    return false;
}

class SessionLock {
public:
    SessionLock(pqxx::connection& conn, std::string key) : conn_(conn), key_(std::move(key)) {}
    ~SessionLock()
    {
        if (!held_)
            return;
        try {
            pqxx::nontransaction tx(conn_);
            detail::pg::exec_params(tx, "SELECT pg_advisory_unlock(hashtext('idemkafka.maintenance'), hashtext($1))",
                                    key_);
        } catch (...) {
            // A broken connection has released the lock already.
        }
    }
    SessionLock(const SessionLock&) = delete;
    SessionLock& operator=(const SessionLock&) = delete;

    bool try_lock()
    {
        pqxx::nontransaction tx(conn_);
        held_ = detail::pg::exec_params(
                    tx, "SELECT pg_try_advisory_lock(hashtext('idemkafka.maintenance'), hashtext($1))", key_)[0][0]
                    .as<bool>();
        return held_;
    }

private:
    pqxx::connection& conn_;
    std::string key_;
    bool held_ = false;
};

[[noreturn]] void rethrow_as_database_error(const char* what)
{
    try {
        throw;
    } catch (const Error&) {
        throw;
    } catch (const pqxx::broken_connection& e) {
        throw DatabaseError(fmt::format("{}: connection to PostgreSQL lost: {}", what, e.what()));
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("{}: {}", what, e.what()));
    }
}

} // namespace

// ---- DDL that needs the naming rules above -----------------------------------

namespace detail::ddl {

std::string plain_index_name(const std::string& table)
{
    return derived_name(table, "_processed_at");
}

std::string default_index_name(const std::string& table)
{
    return derived_name(table, "_default_processed_at");
}

std::vector<std::pair<std::int64_t, std::int64_t>> partition_ranges(const RetentionConfig& cfg, std::int64_t now)
{
    const std::int64_t width = cfg.partition_width.count();
    const std::int64_t now_ms = clamp_ms(now);
    const std::int64_t first = floor_div(clamp_ms(now_ms - cfg.retention.count()), width) * width;
    const std::int64_t last =
        floor_div(now_ms, width) * width + static_cast<std::int64_t>(cfg.partitions_ahead) * width;
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (std::int64_t lo_ms = first; lo_ms <= last && lo_ms < max_uuid_ms; lo_ms += width)
        out.emplace_back(lo_ms, std::min(lo_ms + width, max_uuid_ms));
    return out;
}

} // namespace detail::ddl

// ---- names and enums -------------------------------------------------------

std::string_view to_string(RetentionMode mode) noexcept
{
    return mode == RetentionMode::purge ? "purge" : "partitioned";
}

std::string_view to_string(HorizonPolicy policy) noexcept
{
    switch (policy) {
    case HorizonPolicy::reconcile:
        return "reconcile";
    case HorizonPolicy::process:
        return "process";
    case HorizonPolicy::dead_letter:
        break;
    }
    return "dead_letter";
}

std::string_view to_string(NonV7Policy policy) noexcept
{
    return policy == NonV7Policy::process ? "process" : "dead_letter";
}

RetentionMode parse_retention_mode(std::string_view text)
{
    if (text == "partitioned")
        return RetentionMode::partitioned;
    if (text == "purge")
        return RetentionMode::purge;
    throw ConfigError(fmt::format("mode: '{}' is not a retention mode (partitioned or purge)", text));
}

HorizonPolicy parse_horizon_policy(std::string_view text)
{
    if (text == "dead_letter")
        return HorizonPolicy::dead_letter;
    if (text == "reconcile")
        return HorizonPolicy::reconcile;
    if (text == "process")
        return HorizonPolicy::process;
    throw ConfigError(
        fmt::format("beyond_horizon: '{}' is not a horizon policy (dead_letter, reconcile or process)", text));
}

NonV7Policy parse_non_v7_policy(std::string_view text)
{
    if (text == "dead_letter")
        return NonV7Policy::dead_letter;
    if (text == "process")
        return NonV7Policy::process;
    throw ConfigError(fmt::format("non_v7: '{}' is not a policy for non-v7 ids (dead_letter or process)", text));
}

EventId partition_bound(std::int64_t unix_ms) noexcept
{
    const auto ms = static_cast<std::uint64_t>(clamp_ms(unix_ms));
    EventId::Bytes b{};
    for (std::size_t i = 0; i < 6; ++i)
        b[i] = static_cast<std::uint8_t>(ms >> (8 * (5 - i)));
    return EventId(b);
}

std::string partition_name(std::string_view table, std::int64_t from_unix_ms)
{
    const auto secs = static_cast<std::time_t>(floor_div(clamp_ms(from_unix_ms), 1000));
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "_p%Y%m%d_%H%M", &tm);
    return derived_name(table, buf);
}

std::string default_partition_name(std::string_view table)
{
    return derived_name(table, "_default");
}

// ---- configuration ---------------------------------------------------------

void RetentionConfig::validate() const
{
    auto require = [](bool ok, const std::string& what) {
        if (!ok)
            throw ConfigError(what);
    };
    const milliseconds minute = std::chrono::minutes(1);
    require(retention >= minute, "retention: must be at least one minute");
    require(partition_width >= minute, "partition_width: must be at least one minute");
    require(partition_width.count() % minute.count() == 0,
            "partition_width: must be a whole number of minutes (partition names carry the start minute)");
    require(partition_width <= retention, "partition_width: must not exceed retention");
    require(partitions_ahead >= 1, "partitions_ahead: must be at least 1");
    require(static_cast<std::size_t>(retention / partition_width) + partitions_ahead <= max_partitions,
            fmt::format("partition_width: retention / partition_width + partitions_ahead must not exceed {} "
                        "partitions; use wider partitions",
                        max_partitions));
    require(purge_batch >= 1 && purge_batch <= 1000000, "purge_batch: must be between 1 and 1000000");
    require(purge_pause.count() >= 0, "purge_pause: must not be negative");
    require(purge_max_batches >= 1, "purge_max_batches: must be at least 1");
    require(lock_timeout.count() > 0, "lock_timeout: must be positive");
    require(horizon_margin.count() >= 0, "horizon_margin: must not be negative");
    require(horizon_margin < retention, "horizon_margin: must be less than retention (the dedup horizon is "
                                        "retention - horizon_margin)");
    require(downstream_key_window.count() >= 0, "downstream_key_window: must not be negative (0 = not configured)");
    require(beyond_horizon != HorizonPolicy::reconcile || static_cast<bool>(reconcile),
            "reconcile: must be set when beyond_horizon is reconcile");
    require(maintenance_interval.count() > 0, "maintenance_interval: must be positive");
}

// ---- horizon guard ---------------------------------------------------------

HorizonGuard::HorizonGuard(const RetentionConfig& config)
    : mode_(config.mode), horizon_(config.dedup_horizon()), key_window_(config.downstream_key_window),
      beyond_(config.beyond_horizon), non_v7_(config.non_v7)
{
    config.validate();
}

HorizonDecision HorizonGuard::check(const EventId& id, std::chrono::system_clock::time_point now) const noexcept
{
    HorizonDecision d;
    const bool window = key_window_.count() > 0;
    if (id.version() != 7) {
        // Without a timestamp neither horizon can be judged.
        d.key_window_open = !window;
        if (mode_ == RetentionMode::partitioned && non_v7_ == NonV7Policy::dead_letter) {
            d.action = HorizonAction::dead_letter;
            d.reason = DeadLetterReason::non_v7_event_id;
        }
        return d;
    }
    d.has_timestamp = true;
    const auto created = static_cast<std::int64_t>(bound_ms(id));
    d.age = milliseconds(to_ms(now) - created);
    d.beyond_horizon = d.age >= horizon_;
    d.key_window_open = !window || d.age < key_window_;
    if (d.beyond_horizon) {
        switch (beyond_) {
        case HorizonPolicy::dead_letter:
            d.action = HorizonAction::dead_letter;
            d.reason = DeadLetterReason::beyond_dedup_horizon;
            break;
        case HorizonPolicy::reconcile:
            d.action = HorizonAction::reconcile;
            break;
        case HorizonPolicy::process:
            d.action = HorizonAction::process;
            break;
        }
    }
    return d;
}

HorizonDecision HorizonGuard::check(const EventId& id) const noexcept
{
    return check(id, std::chrono::system_clock::now());
}

// ---- maintenance -----------------------------------------------------------

namespace {

// The parts of Maintenance that work on an open connection, kept out of the header.
class MaintenanceOps {
public:
    MaintenanceOps(const ProcessedEventStore& store, const RetentionConfig& cfg, const LogSink& log,
                   const std::atomic<bool>& cancel)
        : store_(store), cfg_(cfg), log_(log), cancel_(cancel)
    {
    }

    template <class... Args> void say(LogLevel level, fmt::format_string<Args...> f, Args&&... args) const noexcept
    {
        if (!log_)
            return;
        try {
            detail::emit(log_, level, fmt::format(f, std::forward<Args>(args)...), "maintenance");
        } catch (...) {
        }
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
    void create_partitions(pqxx::connection& conn, TimePoint now, bool dry_run, std::vector<std::string>& created,
                           std::uint64_t& moved, std::vector<std::string>& actions) const
    {
        std::vector<Partition> parts;
        {
            pqxx::work tx(conn);
            parts = list_partitions(tx, store_.qualified_name());
        }
        const Partition* def = find_default(parts);
        for (const auto& [lo_ms, hi_ms] : detail::ddl::partition_ranges(cfg_, to_ms(now))) {
            const EventId lo = partition_bound(lo_ms), hi = partition_bound(hi_ms);
            if (overlaps(parts, lo, hi))
                continue;
            const std::string name = partition_name(store_.table(), lo_ms);
            const std::string what = fmt::format("partition {} for ids created {} .. {}", name, iso_utc(from_ms(lo_ms)),
                                                 iso_utc(from_ms(hi_ms)));
            try {
                std::uint64_t rows = 0;
                if (!create_partition(conn, def, name, lo, hi, dry_run, rows)) {
                    note(actions, LogLevel::warning,
                         fmt::format("skipped {}: the default partition holds {} rows of its range (more than "
                                     "max_move_rows {}); they age out there first",
                                     what, rows, cfg_.max_move_rows));
                    continue;
                }
                created.push_back(name);
                moved += rows;
                note(actions, LogLevel::info,
                     fmt::format("{} {}{}", dry_run ? "would create" : "created", what,
                                 rows ? fmt::format(", moving {} rows from the default partition", rows) : ""));
                Partition p;
                p.schema = store_.schema();
                p.name = name;
                p.lo = lo;
                p.hi = hi;
                p.parsed = true;
                parts.push_back(std::move(p));
                def = find_default(parts);
            } catch (const pqxx::broken_connection&) {
                throw;
            } catch (const pqxx::sql_error& e) {
                note(actions, LogLevel::warning,
                     fmt::format("could not create {}{}: {}", what,
                                 is_lock_timeout(e) ? " (lock not available within lock_timeout; retried on the "
                                                      "next run)"
                                                    : "",
                                 e.what()));
            }
        }
    }

    // Returns false (and the row count in `rows`) when too many rows would have to move.
    bool create_partition(pqxx::connection& conn, const Partition* def, const std::string& name, const EventId& lo,
                          const EventId& hi, bool dry_run, std::uint64_t& rows) const
    {
        const std::string q = quote_identifier(store_.schema()) + "." + quote_identifier(name);
        pqxx::work tx(conn);
        tx.exec(set_lock_timeout(cfg_.lock_timeout));
        const std::string in_range =
            fmt::format("event_id >= {}::uuid AND event_id < {}::uuid", uuid_literal(lo), uuid_literal(hi));
        rows = 0;
        if (def) {
            // The default partition is locked first, then the parent (by ATTACH, in a
            // mode claims do not conflict with): a claim routed to the default partition
            // waits for us, never the other way round.
            if (!dry_run)
                tx.exec(fmt::format("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE", def->qualified()));
            rows = tx.exec(fmt::format("SELECT count(*) FROM {} WHERE {}", def->qualified(), in_range))[0][0]
                       .as<std::uint64_t>();
            if (rows > cfg_.max_move_rows)
                return false;
        }
        if (dry_run)
            return true;
        // CREATE + ATTACH rather than CREATE ... PARTITION OF: ATTACH takes only a SHARE
        // UPDATE EXCLUSIVE lock on the parent, so claims keep flowing meanwhile.
        tx.exec(detail::ddl::claims_partition_table(q));
        if (rows > 0)
            tx.exec(fmt::format("WITH moved AS (DELETE FROM {0} WHERE {1} RETURNING {3}) INSERT INTO {2} ({3}) "
                                "SELECT {3} FROM moved",
                                def->qualified(), in_range, q, detail::ddl::claim_column_names));
        tx.exec(detail::ddl::claims_attach(store_.qualified_name(), q, lo, hi));
        tx.commit();
        return true;
    }

    void drop_expired(pqxx::connection& conn, TimePoint now, bool dry_run, std::vector<std::string>& dropped,
                      std::vector<std::string>& kept, std::vector<std::string>& actions) const
    {
        std::vector<Partition> parts;
        {
            pqxx::work tx(conn);
            parts = list_partitions(tx, store_.qualified_name());
        }
        const EventId cutoff = partition_bound(to_ms(now) - cfg_.retention.count());
        for (const auto& p : parts) {
            // Only a partition whose every id is older than retention; MAXVALUE or an
            // unparsed bound never qualifies.
            if (p.is_default || !p.parsed || !p.hi || cutoff < *p.hi)
                continue;
            const std::string what =
                fmt::format("partition {} (ids created before {})", p.name, iso_utc(from_ms(bound_ms(*p.hi))));
            if (dry_run) {
                dropped.push_back(p.name);
                note(actions, LogLevel::info, "would drop " + what);
                continue;
            }
            try {
                pqxx::work tx(conn);
                tx.exec(set_lock_timeout(cfg_.lock_timeout));
                tx.exec(fmt::format("DROP TABLE {}", p.qualified()));
                tx.commit();
                dropped.push_back(p.name);
                note(actions, LogLevel::info, "dropped " + what);
            } catch (const pqxx::broken_connection&) {
                throw;
            } catch (const pqxx::sql_error& e) {
                kept.push_back(p.name);
                note(actions, LogLevel::warning,
                     fmt::format("could not drop {}{}: {}", what,
                                 is_lock_timeout(e) ? " (lock not available within lock_timeout; retried on the "
                                                      "next run)"
                                                    : "",
                                 e.what()));
            }
        }
    }

    // A claim expires when it was processed before the cutoff ($1, ms) and,
    // when its event id is a UUIDv7, the id was minted before it too: the
    // horizon guard judges a redelivery by the id's time, so an id from a
    // producer whose clock runs fast keeps its claim for as long as the guard
    // would let the redelivery through (the claim outlives processed_at +
    // retention by the clock's lead).
    static constexpr const char* expired =
        "processed_at < to_timestamp($1::bigint / 1000.0) AND (substr(event_id::text, 15, 1) <> '7' OR "
        "('x' || substr(event_id::text, 1, 8) || substr(event_id::text, 10, 4))::bit(48)::bigint < $1::bigint)";

    // Deletes the rows of `target` that expired before `cutoff`, purge_batch
    // rows per short transaction, with a pause in between.
    void purge(pqxx::connection& conn, const std::string& target, const std::string& label, TimePoint cutoff,
               bool dry_run, MaintenanceReport& report) const
    {
        const std::int64_t cutoff_ms = to_ms(cutoff);
        if (dry_run) {
            pqxx::work tx(conn);
            const auto n = detail::pg::exec_params(tx, fmt::format("SELECT count(*) FROM {} WHERE {}", target, expired),
                                                   cutoff_ms)[0][0]
                               .as<std::uint64_t>();
            report.rows_purged += n;
            note(report.actions, LogLevel::info,
                 fmt::format("would purge {} rows of {} processed before {}", n, label, iso_utc(cutoff)));
            return;
        }
        // ctid = ANY(ARRAY(...)) is a TID scan: each batch touches only its own rows.
        const std::string sql = fmt::format(
            "DELETE FROM {0} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {0} WHERE {1} LIMIT $2))", target, expired);
        std::uint64_t total = 0;
        std::size_t batches = 0;
        bool more = true;
        while (more) {
            if (cancel_.load() || batches >= cfg_.purge_max_batches) {
                report.purge_incomplete = true;
                break;
            }
            std::uint64_t n = 0;
            {
                pqxx::work tx(conn);
                tx.exec(set_lock_timeout(cfg_.lock_timeout));
                n = static_cast<std::uint64_t>(
                    detail::pg::exec_params(tx, sql, cutoff_ms, static_cast<std::int64_t>(cfg_.purge_batch))
                        .affected_rows());
                tx.commit();
            }
            ++batches;
            total += n;
            more = n >= cfg_.purge_batch;
            if (batches % 20 == 0)
                say(LogLevel::info, "purging {}: {} rows deleted in {} batches so far", label, total, batches);
            if (more && cfg_.purge_pause.count() > 0)
                std::this_thread::sleep_for(cfg_.purge_pause);
        }
        report.rows_purged += total;
        report.purge_batches += batches;
        if (total > 0 || report.purge_incomplete) {
            note(report.actions, LogLevel::info,
                 fmt::format("purged {} rows of {} processed before {} in {} batches{}", total, label, iso_utc(cutoff),
                             batches, report.purge_incomplete ? "; more remain for the next run" : ""));
        }
    }

private:
    const ProcessedEventStore& store_;
    const RetentionConfig& cfg_;
    const LogSink& log_;
    const std::atomic<bool>& cancel_;
};

} // namespace

Maintenance::Maintenance(ProcessedEventStore store, RetentionConfig config, LogSink log, WallClock clock)
    : store_(std::move(store)), config_(std::move(config)), log_(std::move(log)), clock_(std::move(clock))
{
    config_.validate();
    if (!clock_)
        clock_ = [] { return std::chrono::system_clock::now(); };
}

void detail::migrate_claims_table(pqxx::work& tx, const ProcessedEventStore& store, const RetentionConfig& cfg,
                                  Maintenance::Existing existing, MigrationReport& report)
{
    using Existing = Maintenance::Existing;
    const std::string& t = store.qualified_name();
    const std::string def =
        quote_identifier(store.schema()) + "." + quote_identifier(default_partition_name(store.table()));
    tx.exec(detail::ddl::create_schema(store.quoted_schema()));
    const TableKind kind = table_kind(tx, t);
    bool has_default = false;
    if (!kind.exists) {
        for (const auto& sql : detail::ddl::claims_table(store.schema(), store.table(), cfg.mode))
            tx.exec(sql);
        has_default = cfg.mode == RetentionMode::partitioned;
        report.created = true;
        report.mode = cfg.mode;
        report.notes.insert(report.notes.begin(), fmt::format("created {} ({})", t, to_string(cfg.mode)));
    } else if (kind.partitioned) {
        if (!keyed_by_event_id(kind))
            throw ConfigError(fmt::format("table: {} is partitioned by {}, not RANGE (event_id); a key "
                                          "other than the event id cannot keep redeliveries in one partition",
                                          t, kind.partkey));
        if (cfg.mode == RetentionMode::purge && existing == Existing::convert)
            throw ConfigError(fmt::format("mode: {} is partitioned; converting it back to a plain table is "
                                          "not supported (its partitions already expire on their own)",
                                          t));
        report.mode = RetentionMode::partitioned;
        if (!find_default(list_partitions(tx, t))) {
            tx.exec(detail::ddl::claims_default_partition(store.schema(), store.table()));
            report.notes.push_back(fmt::format("added the default partition {}", def));
        }
        has_default = true;
    } else if (cfg.mode == RetentionMode::partitioned && existing == Existing::convert) {
        // The plain table (upgraded to this schema version first: it must have
        // the parent's columns) becomes the default partition as it is (no
        // validation scan: with no other partition it accepts everything).
        // Creating the range partitions then moves the claims of their ranges
        // out of it (up to max_move_rows each); the rest ages out there by
        // processed_at.
        tx.exec(fmt::format("ALTER TABLE {} RENAME TO {}", t, quote_identifier(default_partition_name(store.table()))));
        tx.exec(detail::ddl::claims_table(store.schema(), store.table(), RetentionMode::partitioned)[0]);
        tx.exec(fmt::format("ALTER TABLE {} ATTACH PARTITION {} DEFAULT", t, def));
        tx.exec(detail::ddl::version_comment(t, detail::ddl::claims_kind));
        has_default = true;
        report.converted = true;
        report.mode = RetentionMode::partitioned;
        report.notes.push_back(fmt::format("converted {} to partitioned: its rows are now in the default "
                                           "partition {} and expire by processed_at",
                                           t, def));
    } else {
        report.mode = RetentionMode::purge;
        if (cfg.mode == RetentionMode::partitioned)
            report.notes.push_back(fmt::format("{} is a plain table and stays one (maintenance purges it); "
                                               "convert it with `idemkafka-admin migrate --mode partitioned`",
                                               t));
        // On a large table this blocks writes while it builds: create the index
        // CONCURRENTLY by hand first (docs/retention.md), migrate then finds it.
        if (ensure_processed_at_index(tx, t, detail::ddl::plain_index_name(store.table())))
            report.notes.push_back(fmt::format("created an index on {} (processed_at) for the purge", t));
    }
    // The default partition is purged by processed_at like a plain table.
    if (has_default && ensure_processed_at_index(tx, def, detail::ddl::default_index_name(store.table())) &&
        !report.created)
        report.notes.push_back(fmt::format("created an index on {} (processed_at) for the purge", def));
}

void detail::finish_claims_migration(pqxx::connection& conn, const ProcessedEventStore& store,
                                     const RetentionConfig& cfg, const LogSink& log,
                                     const Maintenance::WallClock& clock, MigrationReport& report)
{
    const std::atomic<bool> never{false};
    MaintenanceOps ops(store, cfg, log, never);
    // Logged once committed: a rolled-back migration changed nothing.
    for (const auto& line : report.notes)
        ops.say(LogLevel::info, "{}", line);
    if (report.mode != RetentionMode::partitioned)
        return;

    // Partitions are made under the maintenance lock, as run_once() makes them. A
    // concurrent migrate holds it only briefly; a maintenance run elsewhere makes
    // them itself.
    SessionLock lock(conn, store.qualified_name());
    const auto deadline =
        std::chrono::steady_clock::now() + std::max<milliseconds>(cfg.lock_timeout, std::chrono::seconds(30));
    bool locked = lock.try_lock();
    while (!locked && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(100));
        locked = lock.try_lock();
    }
    if (!locked) {
        ops.note(report.notes, LogLevel::info, "maintenance is running in another session; it creates the partitions");
        return;
    }
    std::uint64_t moved = 0;
    ops.create_partitions(conn, clock ? clock() : std::chrono::system_clock::now(), false, report.partitions_created,
                          moved, report.notes);
}

MigrationReport Maintenance::migrate(pqxx::connection& conn, Existing existing)
{
    MigrationReport report;
    try {
        {
            pqxx::work tx(conn);
            // The same lock as every schema change: concurrent migrations and
            // consumer start-ups run one after the other.
            tx.exec(detail::ddl::schema_lock);
            // An older table first: conversion and new partitions need its columns.
            detail::upgrade_table(tx, detail::ddl::claims_kind, store_.schema(), store_.table(), config_.lock_timeout);
            detail::migrate_claims_table(tx, store_, config_, existing, report);
            tx.commit();
        }
        detail::finish_claims_migration(conn, store_, config_, log_, clock_, report);
        return report;
    } catch (...) {
        rethrow_as_database_error("migrate");
    }
}

MaintenanceReport Maintenance::run_once(pqxx::connection& conn, bool dry_run)
{
    MaintenanceOps ops(store_, config_, log_, cancel_);
    MaintenanceReport report;
    report.dry_run = dry_run;
    report.now = clock_();
    report.cutoff = report.now - config_.retention;
    const std::string& t = store_.qualified_name();
    try {
        SessionLock lock(conn, t);
        if (!lock.try_lock()) {
            ops.note(report.actions, LogLevel::info, "another session holds the maintenance lock; nothing done");
            return report;
        }
        report.acted = true;
        TableKind kind;
        std::vector<Partition> parts;
        std::optional<int> version;
        {
            pqxx::work tx(conn);
            kind = table_kind(tx, t);
            if (kind.partitioned)
                parts = list_partitions(tx, t);
            version = detail::schema_version_of(tx, store_.schema(), store_.table());
        }
        if (!kind.exists)
            throw DatabaseError(fmt::format("{} does not exist; run `idemkafka-admin migrate` (or start a consumer "
                                            "with create_schema) first",
                                            t));
        report.mode = kind.partitioned ? RetentionMode::partitioned : RetentionMode::purge;
        if (report.mode != config_.mode)
            ops.note(report.actions, LogLevel::warning,
                     fmt::format("{} is {} while the configured mode is {}; maintaining it as it is", t,
                                 kind.partitioned ? "partitioned" : "a plain table", to_string(config_.mode)));
        if (!kind.partitioned) {
            ops.purge(conn, t, t, report.cutoff, dry_run, report);
            return report;
        }
        if (!keyed_by_event_id(kind))
            throw ConfigError(fmt::format("table: {} is partitioned by {}, not RANGE (event_id); not maintaining it", t,
                                          kind.partkey));
        // A partition gets this version's columns, and PostgreSQL attaches only
        // a partition with exactly the parent's: a table not upgraded yet (or
        // upgraded by a newer release) gets no new partitions from here. Its
        // ids land in the default partition meanwhile, still deduplicated.
        if (version.value_or(1) != schema_version)
            ops.note(report.actions, LogLevel::warning,
                     fmt::format("no partitions created: {} has schema version {} and this library makes partitions "
                                 "of version {}; upgrade it with `idemkafka-admin migrate` of the newer release",
                                 t, version.value_or(1), schema_version));
        else
            ops.create_partitions(conn, report.now, dry_run, report.partitions_created, report.rows_moved,
                                  report.actions);
        ops.drop_expired(conn, report.now, dry_run, report.partitions_dropped, report.partitions_kept, report.actions);
        {
            pqxx::work tx(conn);
            parts = list_partitions(tx, t);
        }
        if (const Partition* def = find_default(parts))
            ops.purge(conn, def->qualified(), "the default partition " + def->qualified(), report.cutoff, dry_run,
                      report);
        return report;
    } catch (...) {
        rethrow_as_database_error("maintenance");
    }
}

RetentionStatus Maintenance::status(pqxx::connection& conn) const
{
    RetentionStatus st;
    st.now = clock_();
    st.dedup_horizon = config_.dedup_horizon();
    st.horizon_cutoff = st.now - st.dedup_horizon;
    const std::string& t = store_.qualified_name();
    auto opt_time = [](const pqxx::field& f) -> std::optional<TimePoint> {
        if (f.is_null())
            return std::nullopt;
        return from_ms(f.as<std::int64_t>());
    };
    try {
        pqxx::work tx(conn);
        const TableKind kind = table_kind(tx, t);
        if (!kind.exists)
            return st;
        st.exists = true;
        st.mode = kind.partitioned ? RetentionMode::partitioned : RetentionMode::purge;
        const auto groups = tx.exec(
            fmt::format("SELECT consumer_group, count(*), (extract(epoch FROM min(processed_at)) * 1000)::bigint, "
                        "(extract(epoch FROM max(processed_at)) * 1000)::bigint FROM {} GROUP BY consumer_group "
                        "ORDER BY consumer_group",
                        t));
        for (const auto& row : groups) {
            GroupInfo g;
            g.consumer_group = row[0].as<std::string>();
            g.rows = row[1].as<std::int64_t>();
            g.oldest_claim = opt_time(row[2]);
            g.newest_claim = opt_time(row[3]);
            st.rows += g.rows;
            if (g.oldest_claim && (!st.oldest_claim || *g.oldest_claim < *st.oldest_claim))
                st.oldest_claim = g.oldest_claim;
            if (g.newest_claim && (!st.newest_claim || *st.newest_claim < *g.newest_claim))
                st.newest_claim = g.newest_claim;
            st.groups.push_back(std::move(g));
        }
        if (kind.partitioned) {
            for (const auto& p : list_partitions(tx, t)) {
                PartitionInfo info;
                info.name = p.name;
                info.is_default = p.is_default;
                info.bound = p.bound;
                if (p.parsed && p.lo)
                    info.from = from_ms(bound_ms(*p.lo));
                if (p.parsed && p.hi)
                    info.to = from_ms(bound_ms(*p.hi));
                info.rows = tx.exec(fmt::format("SELECT count(*) FROM {}", p.qualified()))[0][0].as<std::int64_t>();
                if (!p.is_default && info.from && (!st.partitions_from || *info.from < *st.partitions_from))
                    st.partitions_from = info.from;
                if (!p.is_default && info.to && (!st.partitions_to || *st.partitions_to < *info.to))
                    st.partitions_to = info.to;
                st.partitions.push_back(std::move(info));
            }
        }
        return st;
    } catch (...) {
        rethrow_as_database_error("status");
    }
}

// ---- maintenance runner ----------------------------------------------------

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
        if (!conn.db)
            conn.connect(conninfo);
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
