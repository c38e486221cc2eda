#pragma once
// The downstream payment API the billing service calls. The idempotency key
// makes a repeated call (after a rolled-back transaction whose charge did go
// through) return the first result instead of charging twice.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace billing {

class PaymentClient {
public:
    virtual ~PaymentClient() = default;
    /// Charges `amount_cents` for `order_id`; returns the provider's payment id.
    /// A call with an idempotency key seen before returns that call's payment id.
    virtual std::string charge(const std::string& order_id, std::int64_t amount_cents, const std::string& currency,
                               const std::string& idempotency_key) = 0;
};

/// In-process stand-in for a payment provider that honours Idempotency-Key.
class SimulatedPaymentProvider final : public PaymentClient {
public:
    std::string charge(const std::string& order_id, std::int64_t amount_cents, const std::string& currency,
                       const std::string& idempotency_key) override
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_;
        auto it = by_key_.find(idempotency_key);
        if (it != by_key_.end())
            return it->second;
        ++charges_;
        auto id = "pay-" + std::to_string(charges_) + "-" + order_id + "-" + std::to_string(amount_cents) + currency;
        by_key_.emplace(idempotency_key, id);
        return id;
    }
    std::uint64_t calls() const
    {
        std::lock_guard<std::mutex> lock(mu_);
        return calls_;
    }
    std::uint64_t charges() const
    {
        std::lock_guard<std::mutex> lock(mu_);
        return charges_;
    }

private:
    mutable std::mutex mu_;
    std::map<std::string, std::string> by_key_;
    std::uint64_t calls_ = 0;
    std::uint64_t charges_ = 0;
};

} // namespace billing
