#include "idemkafka/entity_lock.hpp"

#include <string>

#include "pg/exec.hpp"

namespace idemkafka {

void lock_entity(pqxx::transaction_base& tx, std::string_view entity_id)
{
    detail::pg::exec_params(tx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", std::string(entity_id));
}

} // namespace idemkafka
