#include "pg/claims.hpp"

#include <cstddef>
#include <string_view>

#include <fmt/format.h>

namespace idemkafka::detail::pg {

std::string new_claim_sql(const ProcessedEventStore& store, bool fingerprints)
{
    return fingerprints ? fmt::format("INSERT INTO {} (event_id, consumer_group, payload_fingerprint) SELECT c.id, "
                                      "$2::text, c.fp FROM unnest($1::uuid[], $3::bigint[]) AS c(id, fp)",
                                      store.qualified_name())
                        : fmt::format("INSERT INTO {} (event_id, consumer_group) SELECT unnest($1::uuid[]), $2::text",
                                      store.qualified_name());
}

namespace {
constexpr std::string_view skip_claimed = " ON CONFLICT DO NOTHING RETURNING event_id";
}

std::string claim_sql(const ProcessedEventStore& store)
{
    return new_claim_sql(store, false).append(skip_claimed);
}

std::string fingerprint_claim_sql(const ProcessedEventStore& store)
{
    return new_claim_sql(store, true).append(skip_claimed);
}

std::string stored_fingerprints_sql(const ProcessedEventStore& store)
{
    return fmt::format("SELECT event_id, payload_fingerprint FROM {} WHERE consumer_group = $1 AND event_id = "
                       "ANY($2::uuid[]) AND payload_fingerprint IS NOT NULL",
                       store.qualified_name());
}

std::string uuid_array(const std::vector<EventId>& ids)
{
    std::string out;
    out.resize(ids.size() * 37 + 2);
    char* p = out.data();
    *p++ = '{';
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i)
            *p++ = ',';
        ids[i].format_to(p);
        p += 36;
    }
    *p++ = '}';
    out.resize(static_cast<std::size_t>(p - out.data()));
    return out;
}

std::vector<EventId> claimed_ids(const pqxx::result& r)
{
    std::vector<EventId> out;
    out.reserve(r.size());
    for (const auto& row : r) {
        const auto f = row[0];
        out.push_back(EventId::parse(std::string_view(f.c_str(), f.size())));
    }
    return out;
}

} // namespace idemkafka::detail::pg
