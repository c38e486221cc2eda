#pragma once
// SHA-1 (FIPS 180-4) for name-based UUIDs (RFC 9562 version 5) only: RFC 9562
// fixes the hash, and no collision resistance is asked of it here (the names
// hashed are the producers' own ids). Not for anything that needs a secure hash.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace idemkafka::detail {

class Sha1 {
public:
    using Digest = std::array<std::uint8_t, 20>;

    void update(const void* data, std::size_t size) noexcept
    {
        const auto* p = static_cast<const std::uint8_t*>(data);
        length_ += size;
        while (size > 0) {
            const std::size_t take = size < 64 - used_ ? size : 64 - used_;
            for (std::size_t i = 0; i < take; ++i)
                block_[used_ + i] = p[i];
            used_ += take;
            p += take;
            size -= take;
            if (used_ == 64) {
                compress();
                used_ = 0;
            }
        }
    }
    void update(std::string_view text) noexcept { update(text.data(), text.size()); }

    Digest finish() noexcept
    {
        const std::uint64_t bits = static_cast<std::uint64_t>(length_) * 8;
        const std::uint8_t one = 0x80;
        update(&one, 1);
        const std::uint8_t zero = 0;
        while (used_ != 56)
            update(&zero, 1);
        std::uint8_t tail[8];
        for (int i = 0; i < 8; ++i)
            tail[i] = static_cast<std::uint8_t>(bits >> (56 - 8 * i));
        update(tail, 8);
        Digest out{};
        for (std::size_t i = 0; i < 5; ++i)
            for (std::size_t j = 0; j < 4; ++j)
                out[i * 4 + j] = static_cast<std::uint8_t>(h_[i] >> (24 - 8 * j));
        return out;
    }

private:
    static std::uint32_t rotl(std::uint32_t x, int n) noexcept { return (x << n) | (x >> (32 - n)); }

    void compress() noexcept
    {
        std::uint32_t w[80];
        for (std::size_t i = 0; i < 16; ++i)
            w[i] = (std::uint32_t{block_[4 * i]} << 24) | (std::uint32_t{block_[4 * i + 1]} << 16) |
                   (std::uint32_t{block_[4 * i + 2]} << 8) | std::uint32_t{block_[4 * i + 3]};
        for (std::size_t i = 16; i < 80; ++i)
            w[i] = rotl(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        std::uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4];
        for (std::size_t i = 0; i < 80; ++i) {
            std::uint32_t f, k;
            if (i < 20) {
                f = (b & c) | (~b & d);
                k = 0x5A827999;
            } else if (i < 40) {
                f = b ^ c ^ d;
                k = 0x6ED9EBA1;
            } else if (i < 60) {
                f = (b & c) | (b & d) | (c & d);
                k = 0x8F1BBCDC;
            } else {
                f = b ^ c ^ d;
                k = 0xCA62C1D6;
            }
            const std::uint32_t t = rotl(a, 5) + f + e + k + w[i];
            e = d;
            d = c;
            c = rotl(b, 30);
            b = a;
            a = t;
        }
        h_[0] += a;
        h_[1] += b;
        h_[2] += c;
        h_[3] += d;
        h_[4] += e;
    }

    std::uint32_t h_[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    std::uint8_t block_[64] = {};
    std::size_t used_ = 0;
    std::size_t length_ = 0;
};

} // namespace idemkafka::detail
