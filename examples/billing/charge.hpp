#pragma once
// The billing handler: an order.confirmed.v1 event becomes one call to the
// payment provider (the event id as its Idempotency-Key) and one row in the
// charge table, inside the transaction that claims the event. The listener
// runs it in an IdempotentConsumer; tests/ runs the same handler through the
// test kit.

#include <string>

#include <pqxx/pqxx>

#include <idemkafka/context.hpp>

#include "order_confirmed.hpp"
#include "payment_client.hpp"

namespace billing {

/// Creates the charge table `table` (already a quoted identifier, see
/// idemkafka::quote_identifier) when it is missing. Throws what libpqxx throws.
void create_charge_table(pqxx::connection& db, const std::string& table);

/// The handler: charges the order through the payment client, passing
/// ctx.idempotency_key(), and inserts the charge into `table`. Throws what the
/// payment client or PostgreSQL throws (the transaction then rolls back).
class ChargeHandler {
public:
    /// `payments` must outlive the handler; `table` is a quoted identifier.
    ChargeHandler(PaymentClient& payments, const std::string& table);

    void operator()(pqxx::work& tx, const OrderConfirmed& e, const idemkafka::Context& ctx) const;

private:
    PaymentClient* payments_;
    std::string insert_;
};

} // namespace billing
