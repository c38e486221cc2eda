// --prefill: a claims table holding the retention window's claims before the
// measured runs, as a consumer's table does after days in production.

#include "prefill.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/retention.hpp>
#include <idemkafka/schema.hpp>
#include <idemkafka/store.hpp>

#include "bench_util.hpp"

namespace idemkafka::bench {

namespace {

// One statement writes at most this many rows: progress every few seconds,
// and no transaction holds more than a slice of the WAL.
constexpr std::uint64_t rows_per_statement = 2'500'000;

// Rows [first, last) of `rows`: row i's id is a UUIDv7 minted at
// start + i * window / rows ms, its 12 bits rand_a and 62 bits rand_b taken
// from i (unique, and ordered like the times); processed_at is 20 ms after it.
std::string insert_sql(const std::string& table_q, const std::string& group_q, std::uint64_t first, std::uint64_t last,
                       std::uint64_t rows, std::int64_t start_ms, std::int64_t window_ms)
{
    return fmt::format("INSERT INTO {0} (event_id, consumer_group, processed_at) "
                       "SELECT (lpad(to_hex(ms), 12, '0') || '7' || lpad(to_hex(i & 4095), 3, '0') || '8' || "
                       "lpad(to_hex(i), 15, '0'))::uuid, {1}, to_timestamp((ms + 20) / 1000.0) "
                       "FROM (SELECT i, {2}::bigint + i * {3}::bigint / {4}::bigint AS ms "
                       "FROM generate_series({5}::bigint, {6}::bigint) AS i) AS r",
                       table_q, group_q, start_ms, window_ms, rows, first, last - 1);
}

} // namespace

Prefill prefill_claims(const std::string& conninfo, const std::string& schema, const std::string& table,
                       const std::string& group, std::uint64_t rows, const RetentionConfig& retention)
{
    Prefill p;
    p.table = table;
    p.rows = rows;
    p.window_ms = retention.retention.count();
    // A second back: the ids of the runs, minted from now on, all sort above.
    p.end_ms = wall_us() / 1000 - 1000;
    p.run_ids_from = partition_bound(p.end_ms);
    const std::int64_t start_ms = p.end_ms - p.window_ms;

    pqxx::connection conn(conninfo);
    SchemaSpec spec;
    spec.schema = schema;
    spec.claims_table = table;
    spec.retention = retention;
    migrate_schema(conn, spec);
    const ProcessedEventStore store(schema, table);
    pqxx::nontransaction tx(conn);
    // One COMMIT per statement: nothing to wait for between them.
    tx.exec("SET synchronous_commit = off");
    const std::string group_q = tx.quote(group);
    std::fprintf(stderr, "prefill: %llu claims into %s, ids over the %lld h up to now\n",
                 static_cast<unsigned long long>(rows), store.qualified_name().c_str(),
                 static_cast<long long>(p.window_ms / 3'600'000));
    const auto t0 = SteadyClock::now();
    for (std::uint64_t first = 0; first < rows; first += rows_per_statement) {
        const std::uint64_t last = std::min(rows, first + rows_per_statement);
        tx.exec(insert_sql(store.qualified_name(), group_q, first, last, rows, start_ms, p.window_ms));
        const double s = seconds_between(t0, SteadyClock::now());
        std::fprintf(stderr, "prefill: %llu of %llu rows (%.0f%%) in %.1f s, %.0f rows/s\n",
                     static_cast<unsigned long long>(last), static_cast<unsigned long long>(rows),
                     100.0 * static_cast<double>(last) / static_cast<double>(rows), s,
                     static_cast<double>(last) / std::max(s, 1e-3));
    }
    p.fill_seconds = seconds_between(t0, SteadyClock::now());
    const auto t1 = SteadyClock::now();
    tx.exec(fmt::format("VACUUM ANALYZE {}", store.qualified_name()));
    p.vacuum_seconds = seconds_between(t1, SteadyClock::now());
    const auto size = tx.exec(fmt::format("SELECT coalesce(sum(pg_relation_size(relid)), 0), "
                                          "coalesce(sum(pg_total_relation_size(relid)), 0), count(*) "
                                          "FROM pg_partition_tree({}::regclass) WHERE isleaf",
                                          tx.quote(store.qualified_name())));
    p.heap_bytes = size[0][0].as<std::int64_t>();
    p.total_bytes = size[0][1].as<std::int64_t>();
    p.partitions = size[0][2].as<int>() - 1; // and the default partition
    std::fprintf(stderr,
                 "prefill: %llu rows in %.1f s (%.0f rows/s), VACUUM ANALYZE %.1f s; %.2f GB with indexes "
                 "(heap %.2f GB), %d range partitions\n",
                 static_cast<unsigned long long>(rows), p.fill_seconds,
                 static_cast<double>(rows) / std::max(p.fill_seconds, 1e-3), p.vacuum_seconds,
                 static_cast<double>(p.total_bytes) / 1e9, static_cast<double>(p.heap_bytes) / 1e9, p.partitions);
    return p;
}

} // namespace idemkafka::bench
