// The bounds the library adds to a PostgreSQL connection string (pg/connect.hpp).

#include <cstdlib>
#include <map>
#include <string>

#include <libpq-fe.h>

#include "catch_compat.hpp"
#include "pg/connect.hpp"

using idemkafka::detail::pg::with_connection_defaults;

namespace {

// What libpq makes of a connection string: its set options.
std::map<std::string, std::string> parsed(const std::string& conninfo)
{
    char* error = nullptr;
    PQconninfoOption* options = PQconninfoParse(conninfo.c_str(), &error);
    if (!options) {
        const std::string why = error ? error : "?";
        PQfreemem(error);
        FAIL("libpq refuses " << conninfo << ": " << why);
    }
    std::map<std::string, std::string> out;
    for (const PQconninfoOption* o = options; o->keyword; ++o)
        if (o->val && *o->val)
            out[o->keyword] = o->val;
    PQconninfoFree(options);
    return out;
}

// PGCONNECT_TIMEOUT unset for a test, as it was afterwards.
struct NoConnectTimeoutEnv {
    std::string saved;
    bool had = false;
    NoConnectTimeoutEnv()
    {
        if (const char* v = std::getenv("PGCONNECT_TIMEOUT")) {
            had = true;
            saved = v;
        }
        unsetenv("PGCONNECT_TIMEOUT");
    }
    ~NoConnectTimeoutEnv()
    {
        if (had)
            setenv("PGCONNECT_TIMEOUT", saved.c_str(), 1);
    }
};

} // namespace

TEST_CASE("connection defaults: added to a key/value string, as pairs libpq reads", "[connect]")
{
    NoConnectTimeoutEnv env;
    const auto o = parsed(with_connection_defaults("host=/tmp dbname=billing user=app"));
    CHECK(o.at("host") == "/tmp");
    CHECK(o.at("dbname") == "billing");
    CHECK(o.at("connect_timeout") == "10");
    CHECK(o.at("keepalives") == "1");
    CHECK(o.at("keepalives_idle") == "10");
    CHECK(o.at("keepalives_interval") == "5");
    CHECK(o.at("keepalives_count") == "3");
    CHECK(o.at("tcp_user_timeout") == "20000");
}

TEST_CASE("connection defaults: a URI gets query parameters, after its own", "[connect]")
{
    NoConnectTimeoutEnv env;
    const auto plain = with_connection_defaults("postgresql://app@db1:5432,db2:5432/billing");
    CHECK(plain.find("/billing?connect_timeout=10&") != std::string::npos);
    auto o = parsed(plain);
    CHECK(o.at("host") == "db1,db2");
    CHECK(o.at("tcp_user_timeout") == "20000");

    o = parsed(with_connection_defaults("postgres:///billing?host=/tmp&target_session_attrs=read-write"));
    CHECK(o.at("host") == "/tmp");
    CHECK(o.at("target_session_attrs") == "read-write");
    CHECK(o.at("keepalives_count") == "3");
}

TEST_CASE("connection defaults: the user's setting wins, in the string or PGCONNECT_TIMEOUT", "[connect]")
{
    NoConnectTimeoutEnv env;
    const auto s = with_connection_defaults("host=/tmp connect_timeout=3 keepalives=0 tcp_user_timeout=0");
    const auto o = parsed(s);
    CHECK(o.at("connect_timeout") == "3");
    CHECK(o.at("keepalives") == "0");
    CHECK(o.at("tcp_user_timeout") == "0");
    CHECK(o.at("keepalives_idle") == "10");
    CHECK(s.find("connect_timeout=10") == std::string::npos);

    setenv("PGCONNECT_TIMEOUT", "7", 1);
    CHECK(parsed(with_connection_defaults("host=/tmp")).count("connect_timeout") == 0);
}

TEST_CASE("connection defaults: a string libpq cannot parse is left for the connect to report", "[connect]")
{
    const std::string bad = "host='unterminated";
    CHECK(with_connection_defaults(bad) == bad);
    CHECK(with_connection_defaults("postgresql://[::1") == "postgresql://[::1");
}
