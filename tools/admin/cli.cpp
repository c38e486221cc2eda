#include "cli.hpp"

#include "core/duration_text.hpp"
#include "observe/log_context.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <utility>

#include <fmt/format.h>

namespace idemkafka::detail::admin {
// ---- arguments -------------------------------------------------------------

ArgReader::ArgReader(std::string command, std::vector<std::string> args)
    : command_(std::move(command)), args_(std::move(args))
{
}

bool ArgReader::option(std::string_view name)
{
    if (!more())
        return false;
    const std::string& a = args_[pos_];
    if (a == name) {
        current_ = a;
        inline_value_.reset();
        ++pos_;
        return true;
    }
    if (a.size() > name.size() && a.compare(0, name.size(), name) == 0 && a[name.size()] == '=') {
        current_ = std::string(name);
        inline_value_ = a.substr(name.size() + 1);
        ++pos_;
        return true;
    }
    return false;
}

std::string ArgReader::value()
{
    if (inline_value_) {
        std::string v = std::move(*inline_value_);
        inline_value_.reset();
        return v;
    }
    if (!more())
        throw UsageError(fmt::format("{}: option {} needs a value", command_, current_));
    return args_[pos_++];
}

std::optional<std::string> ArgReader::word()
{
    if (!more() || (!args_[pos_].empty() && args_[pos_][0] == '-'))
        return std::nullopt;
    return args_[pos_++];
}

void ArgReader::unknown() const
{
    const std::string& a = args_[pos_];
    if (!a.empty() && a[0] == '-')
        throw UsageError(fmt::format("{}: unknown option '{}'", command_, a.substr(0, a.find('='))));
    throw UsageError(fmt::format("{}: unexpected argument '{}'", command_, a));
}

// ---- values ----------------------------------------------------------------

std::chrono::milliseconds parse_duration(std::string_view text, std::string_view what)
{
    std::size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])))
        ++digits;
    const std::string_view unit = text.substr(digits);
    std::int64_t scale = 0;
    if (unit == "ms")
        scale = 1;
    else if (unit == "s")
        scale = 1000;
    else if (unit == "m" || unit == "min")
        scale = 60 * 1000;
    else if (unit == "h")
        scale = 3600 * 1000;
    else if (unit == "d")
        scale = 86400 * 1000;
    else if (unit == "w")
        scale = 7 * 86400 * 1000;
    if (digits == 0 || digits > 12 || scale == 0)
        throw UsageError(
            fmt::format("{}: '{}' is not a duration (a number and a unit: ms, s, m, h, d or w, e.g. 7d)", what, text));
    return std::chrono::milliseconds(std::stoll(std::string(text.substr(0, digits))) * scale);
}

std::uint64_t parse_count(std::string_view text, std::string_view what)
{
    if (text.empty() || text.size() > 18 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        throw UsageError(fmt::format("{}: '{}' is not a non-negative whole number", what, text));
    return std::stoull(std::string(text));
}

std::chrono::system_clock::time_point parse_time(std::string_view text, std::string_view what)
{
    if (!text.empty() && text[0] == '@')
        return std::chrono::system_clock::time_point(
            std::chrono::milliseconds(static_cast<std::int64_t>(parse_count(text.substr(1), what))));
    const std::string s(text);
    int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0, n = 0;
    std::tm tm{};
    const bool date_only =
        std::sscanf(s.c_str(), "%4d-%2d-%2d%n", &y, &mo, &d, &n) == 3 && static_cast<std::size_t>(n) == s.size();
    bool ok = date_only;
    if (!ok) {
        n = 0;
        ok = std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2dZ%n", &y, &mo, &d, &h, &mi, &sec, &n) == 6 &&
             static_cast<std::size_t>(n) == s.size();
    }
    if (!ok) {
        n = 0;
        sec = 0;
        ok = std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2dZ%n", &y, &mo, &d, &h, &mi, &n) == 5 &&
             static_cast<std::size_t>(n) == s.size();
    }
    if (!ok || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        throw UsageError(
            fmt::format("{}: '{}' is not a time (YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ or @<unix ms>)", what, text));
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::string format_time(std::chrono::system_clock::time_point t)
{
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
    std::int64_t secs = ms / 1000, frac = ms % 1000;
    if (frac < 0) {
        frac += 1000;
        --secs;
    }
    const auto tt = static_cast<std::time_t>(secs);
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    return frac ? fmt::format("{}.{:03}Z", buf, frac) : fmt::format("{}Z", buf);
}

std::string format_duration(std::chrono::milliseconds d)
{
    return detail::duration_text(d);
}

// ---- redaction -------------------------------------------------------------

Redactor& redactor()
{
    static Redactor r;
    return r;
}

namespace {

// libpq's messages end in a newline of their own.
std::string_view trim_end(std::string_view s)
{
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
        s.remove_suffix(1);
    return s;
}

} // namespace

void out(std::string_view line)
{
    std::cout << redactor()(trim_end(line)) << '\n' << std::flush;
}

void err(std::string_view line)
{
    std::cerr << redactor()(trim_end(line)) << '\n' << std::flush;
}

// ---- JSON ------------------------------------------------------------------

std::string json_string(std::string_view text)
{
    std::string out;
    detail::append_json_string(out, text);
    return out;
}

std::string json_time(const std::optional<std::chrono::system_clock::time_point>& t)
{
    return t ? json_string(format_time(*t)) : "null";
}

} // namespace idemkafka::detail::admin
