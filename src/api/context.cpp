#include "idemkafka/context.hpp"

namespace idemkafka {

std::optional<std::string_view> Context::header(std::string_view name) const noexcept
{
    for (const auto& h : record_->headers) {
        if (h.name == name) {
            if (!h.value)
                return std::string_view{};
            return std::string_view(*h.value);
        }
    }
    return std::nullopt;
}

} // namespace idemkafka
