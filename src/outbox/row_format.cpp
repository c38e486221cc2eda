#include "outbox/row_format.hpp"

#include <cstdint>

#include <fmt/format.h>

#include "core/hex.hpp"
#include "idemkafka/error.hpp"

namespace idemkafka::detail::outbox {
namespace {

// Headers column format: per header a 4-byte big-endian name length, the name,
// a 4-byte big-endian value length (0xFFFFFFFF for a null value), the value.
// Header names and values are bytes in Kafka; jsonb could not hold them all.
constexpr std::uint32_t null_length = 0xFFFFFFFFu;

void put_u32(std::string& out, std::uint32_t v)
{
    out.push_back(static_cast<char>((v >> 24) & 0xFF));
    out.push_back(static_cast<char>((v >> 16) & 0xFF));
    out.push_back(static_cast<char>((v >> 8) & 0xFF));
    out.push_back(static_cast<char>(v & 0xFF));
}

bool get_u32(std::string_view in, std::size_t& pos, std::uint32_t& v)
{
    if (in.size() - pos < 4)
        return false;
    v = 0;
    for (int i = 0; i < 4; ++i)
        v = (v << 8) | static_cast<unsigned char>(in[pos++]);
    return true;
}

} // namespace

// bytea crosses the wire as hex text: the one form that libpqxx 6.4 and 7.x
// both accept as a parameter and return as a field without deprecated APIs.
std::string to_hex(std::string_view bytes)
{
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    out.resize(bytes.size() * 2);
    std::size_t o = 0;
    for (unsigned char c : bytes) {
        out[o++] = digits[c >> 4];
        out[o++] = digits[c & 0x0F];
    }
    return out;
}

bool from_hex(std::string_view hex, std::string& out)
{
    if (hex.size() % 2 != 0)
        return false;
    out.resize(hex.size() / 2);
    for (std::size_t i = 0; i < out.size(); ++i) {
        const int hi = hex_value(hex[2 * i]);
        const int lo = hex_value(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return false;
        out[i] = static_cast<char>((hi << 4) | lo);
    }
    return true;
}

std::string encode_headers(const std::vector<Header>& headers)
{
    std::string out;
    for (const auto& h : headers) {
        if (h.name.size() >= null_length || (h.value && h.value->size() >= null_length))
            throw ConfigError(fmt::format("enqueue: header \"{}\" is too large", h.name.substr(0, 64)));
        put_u32(out, static_cast<std::uint32_t>(h.name.size()));
        out += h.name;
        if (!h.value) {
            put_u32(out, null_length);
            continue;
        }
        put_u32(out, static_cast<std::uint32_t>(h.value->size()));
        out += *h.value;
    }
    return out;
}

bool decode_headers(std::string_view in, std::vector<Header>& out)
{
    std::size_t pos = 0;
    while (pos < in.size()) {
        std::uint32_t n = 0;
        if (!get_u32(in, pos, n) || n == null_length || in.size() - pos < n)
            return false;
        Header h;
        h.name = std::string(in.substr(pos, n));
        pos += n;
        if (!get_u32(in, pos, n))
            return false;
        if (n != null_length) {
            if (in.size() - pos < n)
                return false;
            h.value.emplace(in.substr(pos, n));
            pos += n;
        }
        out.push_back(std::move(h));
    }
    return true;
}

// Kafka's own rule for topic names; checked at enqueue so a bad name fails the
// writer's transaction instead of becoming a row no relay can ever publish.
void check_topic(std::string_view topic)
{
    if (topic.empty())
        throw ConfigError("enqueue: topic must not be empty");
    if (topic.size() > 249)
        throw ConfigError(fmt::format("enqueue: topic is {} bytes long; Kafka allows at most 249", topic.size()));
    if (topic == "." || topic == "..")
        throw ConfigError(fmt::format("enqueue: \"{}\" is not a valid topic name", topic));
    for (char c : topic) {
        const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                        c == '_' || c == '-';
        if (!ok)
            throw ConfigError(fmt::format("enqueue: topic \"{}\" has a character Kafka does not allow (only "
                                          "ASCII letters, digits, '.', '_' and '-')",
                                          topic));
    }
}

} // namespace idemkafka::detail::outbox
