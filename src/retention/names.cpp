// The names retention gives what it creates: partitions, the default
// partition, the purge's indexes; and the partitions' bounds and ranges.

#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/fnv1a.hpp"
#include "idemkafka/retention.hpp"
#include "retention/time.hpp"
#include "schema/ddl.hpp"

namespace idemkafka {
namespace {

using namespace detail::retention;
using detail::fnv1a;

// PostgreSQL's identifier limit (NAMEDATALEN - 1).
constexpr std::size_t max_identifier = 63;

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

} // namespace

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

std::string retention_registry_name(std::string_view table)
{
    return derived_name(table, "_retention");
}

} // namespace idemkafka
