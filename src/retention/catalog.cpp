#include "retention/catalog.hpp"

#include <algorithm>
#include <string_view>
#include <utility>

#include "idemkafka/store.hpp"
#include "pg/exec.hpp"
#include "schema/ddl.hpp"

namespace idemkafka::detail::retention {
namespace {

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

} // namespace

TableKind table_kind(pqxx::transaction_base& tx, const std::string& qualified)
{
    const auto r = pg::exec_params(tx,
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

bool ensure_processed_at_index(pqxx::transaction_base& tx, const std::string& target, const std::string& index_name)
{
    const auto idx = pg::exec_params(tx,
                                     "SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                                     "AND a.attnum = i.indkey[0] WHERE i.indrelid = to_regclass($1) "
                                     "AND a.attname = 'processed_at'",
                                     target);
    if (!idx.empty())
        return false;
    tx.exec(ddl::processed_at_index(index_name, target));
    return true;
}

std::string Partition::qualified() const
{
    return quote_identifier(schema) + "." + quote_identifier(name);
}

std::vector<Partition> list_partitions(pqxx::transaction_base& tx, const std::string& qualified)
{
    const auto r = pg::exec_params(tx,
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

} // namespace idemkafka::detail::retention
