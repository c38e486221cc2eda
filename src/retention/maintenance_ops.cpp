#include "retention/maintenance_ops.hpp"

#include <algorithm>
#include <thread>

#include "pg/bounds.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"
#include "retention/registry.hpp"
#include "retention/time.hpp"
#include "schema/ddl.hpp"

namespace idemkafka::detail::retention {
namespace {

using pg::is_lock_timeout;

std::string uuid_literal(const EventId& id)
{
    return "'" + id.to_string() + "'";
}

// The bounds of a maintenance transaction, its first statement
// (pg::bound_transaction()). lock_timeout: each wait for a lock.
// idle_in_transaction_session_timeout: a client that stopped between two
// statements (a frozen process, a paused VM) holds what the transaction
// locked, the default partition or, while a partition is dropped, the whole
// table, and every claim routed there waits on it; the server ends such a
// session once it has sat idle that long. The maintenance's transactions
// never wait on their client, so the same bound serves both.
using pg::bound_transaction;

// A claim expires when it was processed before the cutoff ($1, ms) and,
// when its event id is a UUIDv7, the id was minted before it too: the
// horizon guard judges a redelivery by the id's time, so an id from a
// producer whose clock runs fast keeps its claim for as long as the guard
// would let the redelivery through (the claim outlives processed_at +
// retention by the clock's lead).
constexpr const char* expired =
    "processed_at < to_timestamp($1::bigint / 1000.0) AND (substr(event_id::text, 15, 1) <> '7' OR "
    "('x' || substr(event_id::text, 1, 8) || substr(event_id::text, 10, 4))::bit(48)::bigint < $1::bigint)";

} // namespace

void MaintenanceOps::create_partitions(pqxx::connection& conn, TimePoint now, bool dry_run,
                                       std::vector<std::string>& created, std::uint64_t& moved,
                                       std::vector<std::string>& actions) const
{
    std::vector<Partition> parts;
    {
        pqxx::work tx(conn);
        parts = list_partitions(tx, store_.qualified_name());
    }
    const Partition* def = find_default(parts);
    for (const auto& [lo_ms, hi_ms] : ddl::partition_ranges(cfg_, to_ms(now))) {
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

bool MaintenanceOps::create_partition(pqxx::connection& conn, const Partition* def, const std::string& name,
                                      const EventId& lo, const EventId& hi, bool dry_run, std::uint64_t& rows) const
{
    const std::string q = quote_identifier(store_.schema()) + "." + quote_identifier(name);
    pqxx::work tx(conn);
    tx.exec(bound_transaction(cfg_.lock_timeout));
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
    tx.exec(ddl::claims_partition_table(q));
    if (rows > 0)
        tx.exec(fmt::format("WITH moved AS (DELETE FROM {0} WHERE {1} RETURNING {3}) INSERT INTO {2} ({3}) "
                            "SELECT {3} FROM moved",
                            def->qualified(), in_range, q, ddl::claim_column_names));
    tx.exec(ddl::claims_attach(store_.qualified_name(), q, lo, hi));
    tx.commit();
    return true;
}

TimePoint MaintenanceOps::locked_cutoff(pqxx::work& tx, TimePoint now, TimePoint cutoff) const
{
    const auto longest = longest_registered(tx, store_, true);
    return longest ? std::min(cutoff, now - longest->retention) : cutoff;
}

void MaintenanceOps::drop_expired(pqxx::connection& conn, TimePoint now, TimePoint cutoff_time, bool dry_run,
                                  std::vector<std::string>& dropped, std::vector<std::string>& kept,
                                  std::vector<std::string>& actions) const
{
    std::vector<Partition> parts;
    {
        pqxx::work tx(conn);
        parts = list_partitions(tx, store_.qualified_name());
    }
    const EventId cutoff = partition_bound(to_ms(cutoff_time));
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
            tx.exec(bound_transaction(cfg_.lock_timeout));
            if (partition_bound(to_ms(locked_cutoff(tx, now, cutoff_time))) < *p.hi) {
                note(actions, LogLevel::info,
                     fmt::format("kept {}: a group registered a longer retention meanwhile", what));
                continue;
            }
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

void MaintenanceOps::purge(pqxx::connection& conn, const std::string& target, const std::string& label, TimePoint now,
                           TimePoint cutoff, bool dry_run, MaintenanceReport& report) const
{
    const std::int64_t cutoff_ms = to_ms(cutoff);
    if (dry_run) {
        pqxx::work tx(conn);
        const auto n =
            pg::exec_params(tx, fmt::format("SELECT count(*) FROM {} WHERE {}", target, expired), cutoff_ms)[0][0]
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
            tx.exec(bound_transaction(cfg_.lock_timeout));
            const std::int64_t batch_cutoff = to_ms(locked_cutoff(tx, now, cutoff));
            n = static_cast<std::uint64_t>(
                pg::exec_params(tx, sql, batch_cutoff, static_cast<std::int64_t>(cfg_.purge_batch)).affected_rows());
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

} // namespace idemkafka::detail::retention
