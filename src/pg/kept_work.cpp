#include "pg/kept_work.hpp"

#include "pg/tx_guard.hpp"

namespace idemkafka::detail::pg {

pqxx::work& KeptWork::on(pqxx::connection& conn)
{
    if (work_ && &work_->conn() != &conn)
        drop();
    if (!work_)
        work_.emplace(conn);
    return *work_;
}

bool KeptWork::begins() const noexcept
{
    return work_ && state_of(*work_) == TxState::ended;
}

void KeptWork::commit()
{
    work_->exec("COMMIT");
}

void KeptWork::drop() noexcept
{
    work_.reset();
}

} // namespace idemkafka::detail::pg
