// ensure_schema() of the table classes (ProcessedEventStore, OffsetStore,
// Outbox): each table's DDL from schema/ddl.hpp, created when missing, under
// the lock every schema change takes. Here rather than beside each class, so
// that pg/ and outbox/ do not depend on the schema layer.

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/store.hpp"
#include "pg/exec.hpp"
#include "schema/ddl.hpp"

namespace idemkafka {
namespace {

bool missing(pqxx::work& tx, const std::string& qualified)
{
    return !detail::pg::relation_exists(tx, qualified);
}

// Creates `qualified` (in `schema_q`) with `statements` unless it exists,
// and then each of `also` that is missing: {qualified name, statements}.
void ensure_table(pqxx::work& tx, const std::string& schema_q, const std::string& qualified,
                  const std::vector<std::string>& statements,
                  const std::vector<std::pair<std::string, std::vector<std::string>>>& also = {})
{
    try {
        // Concurrent CREATE ... IF NOT EXISTS can still fail on the catalog's
        // unique indexes; the lock every idemkafka table shares serialises them.
        tx.exec(detail::ddl::schema_lock);
        tx.exec(detail::ddl::create_schema(schema_q));
        // Tables and their indexes are created together, so an existing table has its indexes.
        if (missing(tx, qualified))
            for (const auto& sql : statements)
                tx.exec(sql);
        for (const auto& [name, sqls] : also)
            if (missing(tx, name))
                for (const auto& sql : sqls)
                    tx.exec(sql);
    } catch (const pqxx::sql_error& e) {
        throw DatabaseError(fmt::format("creating {} failed: {}", qualified, e.what()));
    }
}

} // namespace

void ProcessedEventStore::ensure_schema(pqxx::work& tx) const
{
    // A plain table, as Maintenance::migrate() creates one in purge mode, and its retention registry.
    const std::string registry = schema_q_ + "." + quote_identifier(retention_registry_name(table_));
    ensure_table(tx, schema_q_, qualified_, detail::ddl::claims_table(schema_, table_, RetentionMode::purge),
                 {{registry, detail::ddl::retention_table(registry)}});
}

void OffsetStore::ensure_schema(pqxx::work& tx) const
{
    ensure_table(tx, schema_q_, qualified_, detail::ddl::offsets_table(qualified_));
}

void Outbox::ensure_schema(pqxx::work& tx) const
{
    ensure_table(tx, schema_q_, qualified_, detail::ddl::outbox_table(qualified_));
}

} // namespace idemkafka
