// HorizonGuard: what becomes of a record by the age its UUIDv7 event id
// tells, against the dedup horizon and the downstream key window.

#include <chrono>

#include "idemkafka/retention.hpp"
#include "retention/time.hpp"

namespace idemkafka {

using detail::retention::bound_ms;
using detail::retention::to_ms;

HorizonGuard::HorizonGuard(const RetentionConfig& config)
    : mode_(config.mode), horizon_(config.dedup_horizon()), key_window_(config.downstream_key_window),
      beyond_(config.beyond_horizon), non_v7_(config.non_v7)
{
    config.validate();
}

HorizonDecision HorizonGuard::check(const EventId& id, std::chrono::system_clock::time_point now) const noexcept
{
    HorizonDecision d;
    const bool window = key_window_.count() > 0;
    if (id.version() != 7) {
        // Without a timestamp neither horizon can be judged.
        d.key_window_open = !window;
        if (mode_ == RetentionMode::partitioned && non_v7_ == NonV7Policy::dead_letter) {
            d.action = HorizonAction::dead_letter;
            d.reason = DeadLetterReason::non_v7_event_id;
        }
        return d;
    }
    d.has_timestamp = true;
    const auto created = static_cast<std::int64_t>(bound_ms(id));
    d.age = std::chrono::milliseconds(to_ms(now) - created);
    d.beyond_horizon = d.age >= horizon_;
    d.key_window_open = !window || d.age < key_window_;
    if (d.beyond_horizon) {
        switch (beyond_) {
        case HorizonPolicy::dead_letter:
            d.action = HorizonAction::dead_letter;
            d.reason = DeadLetterReason::beyond_dedup_horizon;
            break;
        case HorizonPolicy::reconcile:
            d.action = HorizonAction::reconcile;
            break;
        case HorizonPolicy::process:
            d.action = HorizonAction::process;
            break;
        }
    }
    return d;
}

HorizonDecision HorizonGuard::check(const EventId& id) const noexcept
{
    return check(id, std::chrono::system_clock::now());
}

} // namespace idemkafka
