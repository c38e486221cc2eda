#include "pg/bounds.hpp"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace idemkafka::detail::pg {

std::string idle_bound(std::chrono::milliseconds bound)
{
    return fmt::format("SET LOCAL idle_in_transaction_session_timeout = '{}ms'",
                       std::max<std::int64_t>(bound.count(), 1000));
}

std::string bound_transaction(std::chrono::milliseconds bound)
{
    return fmt::format("SET LOCAL lock_timeout = '{}ms'; {}", std::max<std::int64_t>(bound.count(), 1),
                       idle_bound(bound));
}

} // namespace idemkafka::detail::pg
