#pragma once
/// \file
/// Logging: every failure path of the library writes one line here.

#include <functional>
#include <string_view>

namespace idemkafka {

enum class LogLevel { debug, info, warning, error };

/// Returns "debug", "info", "warning" or "error".
std::string_view to_string(LogLevel level) noexcept;

/// Receives every log line of the library. Called from the thread that runs the
/// consumer; must not throw (an exception from a sink is swallowed).
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

/// The default sink: one line on stderr, `idemkafka <level>: <message>`.
/// Lines below `min_level` are dropped.
LogSink stderr_sink(LogLevel min_level = LogLevel::info);

} // namespace idemkafka
