#include "charge.hpp"

namespace billing {

void create_charge_table(pqxx::connection& db, const std::string& table)
{
    pqxx::work tx(db);
    tx.exec("CREATE TABLE IF NOT EXISTS " + table +
            " ("
            " id bigserial PRIMARY KEY,"
            " order_id text NOT NULL,"
            " customer_id text NOT NULL,"
            " amount_cents bigint NOT NULL,"
            " currency text NOT NULL,"
            " payment_id text NOT NULL,"
            " idempotency_key uuid NOT NULL,"
            " charged_at timestamptz NOT NULL DEFAULT now())");
    tx.commit();
}

ChargeHandler::ChargeHandler(PaymentClient& payments, const std::string& table)
    : payments_(&payments), insert_("INSERT INTO " + table +
                                    " (order_id, customer_id, amount_cents, currency, payment_id, idempotency_key)"
                                    " VALUES ($1, $2, $3, $4, $5, $6::uuid)")
{
}

void ChargeHandler::operator()(pqxx::work& tx, const OrderConfirmed& e, const idemkafka::Context& ctx) const
{
    const auto key = ctx.idempotency_key();
    const auto payment_id = payments_->charge(e.order_id, e.amount_cents, e.currency, key);
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
    tx.exec(insert_, pqxx::params{e.order_id, e.customer_id, e.amount_cents, e.currency, payment_id, key});
#else // libpqxx before 7.10 has no exec(sql, params)
    tx.exec_params(insert_, e.order_id, e.customer_id, e.amount_cents, e.currency, payment_id, key);
#endif
}

} // namespace billing
