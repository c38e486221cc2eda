#include "idemkafka/dead_letter.hpp"

namespace idemkafka {
namespace {

constexpr std::array<std::string_view, dead_letter_reason_count> names = {
    "decode_error",   "empty_payload", "payload_too_large",    "missing_event_id", "invalid_event_id",
    "handler_failed", "non_retryable", "beyond_dedup_horizon", "non_v7_event_id",  "event_id_reused",
};

} // namespace

std::string_view to_string(DeadLetterReason reason) noexcept
{
    const auto i = static_cast<std::size_t>(reason);
    return i < names.size() ? names[i] : "unknown";
}

std::optional<DeadLetterReason> parse_dead_letter_reason(std::string_view text) noexcept
{
    for (std::size_t i = 0; i < names.size(); ++i)
        if (names[i] == text)
            return static_cast<DeadLetterReason>(i);
    return std::nullopt;
}

} // namespace idemkafka
