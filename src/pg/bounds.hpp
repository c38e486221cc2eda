#pragma once
// Server-side bounds of a transaction the library runs itself, as statement
// texts to begin it with (SET LOCAL takes no parameters; the values are
// numbers formatted here).

#include <chrono>
#include <string>

namespace idemkafka::detail::pg {

/// `SET LOCAL idle_in_transaction_session_timeout`, at least a second: for a
/// transaction whose client never makes it wait longer than `bound` between
/// two statements. A client stopped there (a frozen process, a paused VM, a
/// lost network) would hold what the transaction locked for as long as it
/// stays stopped; past `bound` the server ends its session instead. Never in
/// printed SQL, which a person may run by hand.
std::string idle_bound(std::chrono::milliseconds bound);

/// `SET LOCAL lock_timeout` (each wait for a lock, at least 1 ms), then
/// idle_bound(), both at `bound`, in one text.
std::string bound_transaction(std::chrono::milliseconds bound);

} // namespace idemkafka::detail::pg
