#pragma once
// How an outbox row holds what Kafka needs: bytea columns cross the wire as
// hex text, headers in a length-prefixed binary form, topic names checked at
// enqueue. Shared by Outbox (writing) and OutboxRelay (reading). Private to
// the library.

#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/publisher.hpp"

namespace idemkafka::detail::outbox {

/// `bytes` as lower-case hex.
std::string to_hex(std::string_view bytes);

/// Decodes `hex` into `out`; false if it is not hex of whole bytes.
bool from_hex(std::string_view hex, std::string& out);

/// The headers column's bytes for `headers`; throws ConfigError for a header
/// too large for the format.
std::string encode_headers(const std::vector<Header>& headers);

/// Appends the headers `in` holds to `out`; false if `in` is not in the format.
bool decode_headers(std::string_view in, std::vector<Header>& out);

/// Throws ConfigError naming what is wrong unless `topic` is a name Kafka accepts.
void check_topic(std::string_view topic);

} // namespace idemkafka::detail::outbox
