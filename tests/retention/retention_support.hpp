#pragma once
// Helpers of the retention tests: tables of their own, a clock the test moves,
// claims through the library's own statement.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/retention.hpp>
#include <idemkafka/store.hpp>

#include "pg/exec.hpp"
#include "test_env.hpp"

namespace idemkafka::test {

using TimePoint = std::chrono::system_clock::time_point;
constexpr std::int64_t day_ms = 86400000;
constexpr std::int64_t hour_ms = 3600000;

inline std::int64_t to_ms(TimePoint t)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

inline TimePoint at(std::int64_t ms)
{
    return TimePoint(std::chrono::milliseconds(ms));
}

inline std::int64_t now_ms()
{
    return to_ms(std::chrono::system_clock::now());
}

/// A UUIDv7 created at `ms`; `n` varies the random part.
inline EventId v7_at(std::int64_t ms, std::uint64_t n = 0)
{
    return EventId::from_v7_parts(static_cast<std::uint64_t>(ms), static_cast<std::uint16_t>(n & 0xfff),
                                  0x0123456789abcdefULL ^ (n * 0x9E3779B97F4A7C15ULL));
}

inline std::unique_ptr<pqxx::connection> connect()
{
    return std::make_unique<pqxx::connection>(pg());
}

/// A clock the test sets; Maintenance reads it through a WallClock.
struct TestClock {
    std::shared_ptr<std::atomic<std::int64_t>> ms = std::make_shared<std::atomic<std::int64_t>>(now_ms());
    Maintenance::WallClock fn() const
    {
        auto p = ms;
        return [p] { return at(p->load()); };
    }
    void set(std::int64_t v) { ms->store(v); }
    std::int64_t get() const { return ms->load(); }
};

/// Claims one id for `group` in its own transaction; true when it was new.
inline bool claim(pqxx::connection& conn, const ProcessedEventStore& store, const std::string& group, const EventId& id)
{
    pqxx::work tx(conn);
    const auto claimed = store.claim(tx, group, {id});
    tx.commit();
    return claimed.size() == 1;
}

/// Number of rows of a query's first column, as an integer.
inline std::int64_t count_rows(pqxx::connection& conn, const std::string& sql)
{
    pqxx::nontransaction tx(conn);
    return tx.exec(sql)[0][0].as<std::int64_t>();
}

/// The partition (relation name, unquoted) holding `id` for `group`, or "" when none.
inline std::string partition_of(pqxx::connection& conn, const ProcessedEventStore& store, const EventId& id)
{
    pqxx::nontransaction tx(conn);
    const auto r = detail::pg::exec_params(
        tx,
        fmt::format("SELECT c.relname FROM {} t JOIN pg_class c ON c.oid = t.tableoid WHERE t.event_id = $1::uuid",
                    store.qualified_name()),
        id.to_string());
    return r.empty() ? std::string() : r[0][0].as<std::string>();
}

/// Names of the partitions of `store`'s table (default included), sorted.
inline std::vector<std::string> partitions(pqxx::connection& conn, const ProcessedEventStore& store)
{
    pqxx::nontransaction tx(conn);
    const auto r = detail::pg::exec_params(tx,
                                           "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                                           "WHERE i.inhparent = to_regclass($1) ORDER BY 1",
                                           store.qualified_name());
    std::vector<std::string> out;
    for (const auto& row : r)
        out.push_back(row[0].as<std::string>());
    return out;
}

/// Drops the table, its partitions and, for a claims table, its retention
/// registry when the test ends.
struct DropTable {
    std::string qualified;
    ~DropTable()
    {
        try {
            exec("DROP TABLE IF EXISTS " + qualified + " CASCADE");
            const bool quoted = !qualified.empty() && qualified.back() == '"';
            exec("DROP TABLE IF EXISTS " +
                 (quoted ? qualified.substr(0, qualified.size() - 1) + "_retention\"" : qualified + "_retention"));
        } catch (...) {
        }
    }
};

} // namespace idemkafka::test
