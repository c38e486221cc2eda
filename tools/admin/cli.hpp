#pragma once
// Helpers shared by the idemkafka-admin subcommands: argument reading,
// durations and times, secret redaction, JSON text and output.

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <idemkafka/redact.hpp>

namespace idemkafka::detail::admin {

constexpr int exit_ok = 0;
constexpr int exit_failure = 1;
constexpr int exit_usage = 2;

/// A bad command line: printed with a pointer to --help, exit status 2.
class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Reads `--name value`, `--name=value` and flags from a subcommand's arguments.
class ArgReader {
public:
    /// `command` names the subcommand in error messages.
    ArgReader(std::string command, std::vector<std::string> args);

    /// True while arguments are left.
    bool more() const noexcept { return pos_ < args_.size(); }
    /// The next argument is `--name` or `--name=...`; consumes the name. Never throws.
    bool option(std::string_view name);
    /// The value of the option just matched (inline `=value` or the next argument).
    /// Throws UsageError when there is none.
    std::string value();
    /// The next argument if it does not start with `-` (a positional word); consumes it.
    std::optional<std::string> word();
    /// Throws UsageError for the argument at the current position.
    [[noreturn]] void unknown() const;

private:
    std::string command_;
    std::vector<std::string> args_;
    std::size_t pos_ = 0;
    std::string current_;
    std::optional<std::string> inline_value_;
};

/// Parses `500ms`, `30s`, `15m`, `36h`, `7d`, `2w`. Throws UsageError naming `what`.
std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what);
/// Parses a non-negative integer. Throws UsageError naming `what`.
std::uint64_t parse_count(std::string_view text, std::string_view what);
/// Parses `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM[:SS]Z` (UTC) or `@<unix ms>`. Throws UsageError.
std::chrono::system_clock::time_point parse_time(std::string_view text, std::string_view what);
/// `2024-01-02T03:04:05Z` (with `.mmm` when the milliseconds are not zero).
std::string format_time(std::chrono::system_clock::time_point t);
/// `7d`, `36h`, `90m`, `30s`, `250ms`: the largest unit that divides exactly.
std::string format_duration(std::chrono::milliseconds d);

/// Remembers secrets (passwords in connection strings, secret Kafka settings) and
/// removes them, and any `password=...` or URI password, from text before it is
/// printed: the library's own redaction, the one its log records go through.
using Redactor = idemkafka::Redactor;

/// The process-wide redactor every printed line goes through.
Redactor& redactor();
/// Prints a line to stdout / stderr after redaction.
void out(std::string_view line);
void err(std::string_view line);

/// `text` as a JSON string literal, quotes included. Bytes that are not valid
/// UTF-8 are escaped as \u00XX so the output is always valid JSON.
std::string json_string(std::string_view text);
/// A JSON string of format_time(t), or null.
std::string json_time(const std::optional<std::chrono::system_clock::time_point>& t);

} // namespace idemkafka::detail::admin
