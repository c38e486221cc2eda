#pragma once
// The payload fingerprint stored with a claim (ConsumerConfig::
// payload_fingerprint). Private to the library.

#include <cstdint>
#include <string_view>

namespace idemkafka::detail {

/// XXH3-64 of `payload`, as the claims table's bigint stores it. Stored
/// fingerprints outlive releases: the function never changes (XXH3's output
/// is fixed since xxHash 0.8.0). Never throws.
std::int64_t fingerprint(std::string_view payload) noexcept;

} // namespace idemkafka::detail
