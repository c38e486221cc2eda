#include "core/fingerprint.hpp"

// Inlined: no symbol of libxxhash is linked, so the installed library does not
// depend on it (only the build needs the header, Debian's libxxhash-dev).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace idemkafka::detail {

// XXH3 rather than the FNV-1a the library has: 64 bits with full avalanche
// (FNV-1a's low bits mix poorly), and it hashes a payload at memory speed
// where FNV-1a takes a multiply per byte (about 1 GB/s).
std::int64_t fingerprint(std::string_view payload) noexcept
{
    return static_cast<std::int64_t>(XXH3_64bits(payload.data(), payload.size()));
}

} // namespace idemkafka::detail
