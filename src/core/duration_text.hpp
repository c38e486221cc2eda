#pragma once
// One spelling of a duration for the library's generated commands and
// comments and for idemkafka-admin's output, so what one prints the other
// parses back unchanged.

#include <chrono>
#include <string>

namespace idemkafka::detail {

/// `7d`, `36h`, `90m`, `30s`, `250ms`: the largest unit that divides exactly
/// (`0ms` for zero). Throws only std::bad_alloc.
std::string duration_text(std::chrono::milliseconds d);

} // namespace idemkafka::detail
