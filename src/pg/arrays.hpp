#pragma once
// PostgreSQL array literals for array parameters ($1::text[], $1::bigint[]),
// so one statement carries a whole batch.

#include <cstdint>
#include <string>
#include <vector>

namespace idemkafka::detail {

/// `{"a","b"}`: every element quoted, `"` and `\` escaped.
inline std::string text_array(const std::vector<std::string>& values)
{
    std::string out = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i)
            out += ',';
        out += '"';
        for (char c : values[i]) {
            if (c == '"' || c == '\\')
                out += '\\';
            out += c;
        }
        out += '"';
    }
    out += '}';
    return out;
}

/// `{1,2,3}`
inline std::string int_array(const std::vector<std::int64_t>& values)
{
    std::string out = "{";
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (i)
            out += ',';
        out += std::to_string(values[i]);
    }
    out += '}';
    return out;
}

} // namespace idemkafka::detail
