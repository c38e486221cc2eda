#include "idemkafka/log.hpp"

#include <cstdio>
#include <mutex>

#include <fmt/format.h>

namespace idemkafka {

std::string_view to_string(LogLevel level) noexcept
{
    switch (level) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    }
    return "unknown";
}

LogSink stderr_sink(LogLevel min_level)
{
    return [min_level](LogLevel level, std::string_view message) {
        if (level < min_level)
            return;
        // One write per line so lines of several consumers do not interleave.
        std::string line = fmt::format("idemkafka {}: {}\n", to_string(level), message);
        std::fwrite(line.data(), 1, line.size(), stderr);
    };
}

} // namespace idemkafka
