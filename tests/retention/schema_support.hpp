#pragma once
// Helpers of the schema tests: schemas that go when the test ends, and a
// schema's DDL through pg_dump, comparable between two schemas.

#include <cstdio>
#include <fstream>
#include <istream>
#include <sstream>
#include <string>
#include <vector>

#include <idemkafka/store.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "test_env.hpp"

namespace idemkafka::test {

/// Drops a schema (and whatever is in it) when the test ends.
struct DropSchema {
    std::string name;
    ~DropSchema()
    {
        try {
            exec("DROP SCHEMA IF EXISTS " + quote_identifier(name) + " CASCADE");
        } catch (...) {
        }
    }
};

/// `pg_dump --schema-only` of one schema (only `tables` of it when given),
/// with what must differ between two schemas normalised: the schema's name,
/// and pg_dump's per-run \restrict key.
inline std::string dump_schema(const std::string& schema, const std::vector<std::string>& tables = {})
{
    std::string what = " -n " + shell_quote(schema);
    if (!tables.empty())
        what.clear();
    for (const auto& t : tables)
        what += " -t " + shell_quote(schema + "." + t);
    const auto r = run_shell("pg_dump --schema-only --no-owner --no-privileges" + what + " " + shell_quote(pg()));
    INFO(r.err);
    REQUIRE(r.rc == 0);
    std::istringstream in(r.out);
    std::string line, out;
    while (std::getline(in, line)) {
        if (line.rfind("\\restrict", 0) == 0 || line.rfind("\\unrestrict", 0) == 0)
            continue;
        for (std::size_t at = line.find(schema); at != std::string::npos; at = line.find(schema, at))
            line.replace(at, schema.size(), "SCHEMA");
        out += line + "\n";
    }
    return out;
}

/// Runs an SQL file with psql in one transaction, stopping at the first
/// error; `-v schema=<schema>` for files that take it.
inline Result run_sql_file(const std::string& path, const std::string& schema = {})
{
    return run_shell("psql -X -q -1 -v ON_ERROR_STOP=1" +
                     (schema.empty() ? std::string() : " -v schema=" + shell_quote(schema)) + " -f " +
                     shell_quote(path) + " " + shell_quote(pg()));
}

/// Runs `sql` (a script, as `migrate --print-sql` prints one) like run_sql_file().
inline Result run_sql(const std::string& sql)
{
    const std::string file = "/tmp/" + unique_name("iksql") + ".sql";
    {
        std::ofstream f(file);
        f << sql;
    }
    auto r = run_sql_file(file);
    std::remove(file.c_str());
    return r;
}

} // namespace idemkafka::test
