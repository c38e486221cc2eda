#include "pg/connect.hpp"

#include <cstdlib>
#include <set>
#include <utility>

#include <libpq-fe.h>

namespace idemkafka::detail::pg {
namespace {

struct Default {
    const char* key;
    const char* value;
    const char* env; // the PG* variable libpq reads for it, or nullptr
};

constexpr Default defaults[] = {
    {"connect_timeout", "10", "PGCONNECT_TIMEOUT"},
    {"keepalives", "1", nullptr},
    {"keepalives_idle", "10", nullptr},
    {"keepalives_interval", "5", nullptr},
    {"keepalives_count", "3", nullptr},
    {"tcp_user_timeout", "20000", nullptr},
};

bool is_uri(const std::string& conninfo)
{
    return conninfo.rfind("postgresql://", 0) == 0 || conninfo.rfind("postgres://", 0) == 0;
}

} // namespace

std::string with_connection_defaults(const std::string& conninfo)
{
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
    if (!options) {
        PQfreemem(error);
        return conninfo;
    }
    std::set<std::string> known, set;
    for (const PQconninfoOption* o = options; o->keyword; ++o) {
        known.insert(o->keyword);
        if (o->val && *o->val)
            set.insert(o->keyword);
    }
    PQconninfoFree(options);

    std::string out = conninfo;
    const bool uri = is_uri(conninfo);
    bool has_query = uri && conninfo.find('?') != std::string::npos;
    for (const auto& d : defaults) {
        if (!known.count(d.key) || set.count(d.key)) // an older libpq without it, or the user's
            continue;
        if (d.env && std::getenv(d.env))
            continue;
        if (uri) {
            out += has_query ? '&' : '?';
            has_query = true;
            out += std::string(d.key) + '=' + d.value;
        } else {
            out += ' ';
            out += std::string(d.key) + '=' + d.value;
        }
    }
    return out;
}

std::unique_ptr<pqxx::connection> connect(const std::string& conninfo)
{
    return std::make_unique<pqxx::connection>(with_connection_defaults(conninfo));
}

} // namespace idemkafka::detail::pg
