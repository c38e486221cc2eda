#include "idemkafka/log.hpp"

#include <algorithm>
#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "idemkafka/redact.hpp"
#include "observe/log_context.hpp"

namespace idemkafka {
namespace {

bool needs_redaction(const LogRecord& r, const Redactor& secrets) noexcept
{
    if (secrets.needed(r.message))
        return true;
    for (const auto& f : r.fields)
        if (secrets.needed(f.value))
            return true;
    return false;
}

// The last line of defence: a copy of the record with secrets masked, made
// only when a scan finds something that may be one.
const LogRecord& redacted_record(const LogRecord& r, const Redactor& secrets, LogRecord& copy)
{
    if (!needs_redaction(r, secrets))
        return r;
    copy.level = r.level;
    copy.message = secrets(r.message);
    copy.fields = r.fields;
    for (auto& f : copy.fields)
        f.value = secrets(f.value);
    return copy;
}

bool needs_quotes(std::string_view v) noexcept
{
    if (v.empty())
        return true;
    return std::any_of(v.begin(), v.end(), [](char c) {
        return c == ' ' || c == '"' || c == '=' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
    });
}

void append_text_value(std::string& out, std::string_view v)
{
    if (!needs_quotes(v)) {
        out.append(v);
        return;
    }
    out.push_back('"');
    for (char c : v) {
        switch (c) {
        case '"':
            out += "\\\"";
            break;
        case '\\':
            out += "\\\\";
            break;
        case '\n':
            out += "\\n";
            break;
        case '\r':
            out += "\\r";
            break;
        case '\t':
            out += "\\t";
            break;
        default:
            if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
                out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
            else
                out.push_back(c);
        }
    }
    out.push_back('"');
}

std::string_view trim_end(std::string_view s) noexcept
{
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
        s.remove_suffix(1);
    return s;
}

void write_line(const std::string& line) noexcept
{
    // One write per line so lines of several threads do not interleave.
    std::fwrite(line.data(), 1, line.size(), stderr);
}

} // namespace

std::string_view to_string(LogLevel level) noexcept
{
    switch (level) {
    case LogLevel::debug:
        return "debug";
    case LogLevel::info:
        return "info";
    case LogLevel::warning:
        return "warning";
    case LogLevel::error:
        return "error";
    }
    return "unknown";
}

std::optional<std::string_view> LogRecord::field(std::string_view key) const noexcept
{
    for (const auto& f : fields)
        if (f.key == key)
            return std::string_view(f.value);
    return std::nullopt;
}

void LogSink::operator()(const LogRecord& record) const
{
    if (!fn_)
        return;
    static const Redactor patterns_only;
    LogRecord copy;
    fn_(redacted_record(record, patterns_only, copy));
}

void LogSink::operator()(LogLevel level, std::string_view message) const
{
    if (!fn_)
        return;
    (*this)(LogRecord{level, std::string(message), {}});
}

std::string format_text(const LogRecord& record)
{
    std::string out(trim_end(record.message));
    for (const auto& f : record.fields) {
        out.push_back(' ');
        out += f.key;
        out.push_back('=');
        append_text_value(out, f.value);
    }
    return out;
}

std::string format_json(const LogRecord& record)
{
    std::string out = "{\"level\":";
    detail::append_json_string(out, to_string(record.level));
    out += ",\"message\":";
    detail::append_json_string(out, trim_end(record.message));
    for (const auto& f : record.fields) {
        out.push_back(',');
        detail::append_json_string(out, f.key == "level" || f.key == "message" ? "field." + f.key : f.key);
        out.push_back(':');
        detail::append_json_string(out, f.value);
    }
    out.push_back('}');
    return out;
}

LogSink stderr_sink(LogLevel min_level)
{
    return [min_level](const LogRecord& r) {
        if (r.level < min_level)
            return;
        write_line(fmt::format("idemkafka {}: {}\n", to_string(r.level), format_text(r)));
    };
}

LogSink json_sink(LogLevel min_level)
{
    return [min_level](const LogRecord& r) {
        if (r.level < min_level)
            return;
        write_line(format_json(r) + '\n');
    };
}

namespace detail {

void append_json_string(std::string& out, std::string_view text)
{
    out.push_back('"');
    auto escape_byte = [&](unsigned char c) { out += fmt::format("\\u{:04x}", c); };
    for (std::size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7f) {
            escape_byte(c);
        } else if (c < 0x80) {
            out.push_back(static_cast<char>(c));
        } else {
            // A well-formed UTF-8 sequence is copied; a stray byte is escaped.
            const std::size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            bool ok = len > 0 && i + len <= text.size() && c >= 0xC2 && c <= 0xF4;
            for (std::size_t k = 1; ok && k < len; ++k)
                ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
            if (ok) {
                out.append(text.substr(i, len));
                i += len;
                continue;
            }
            escape_byte(c);
        }
        ++i;
    }
    out.push_back('"');
}

LogSink with_context(LogSink inner, LogFields defaults, Redactor secrets)
{
    if (!inner)
        return {};
    return [inner = std::move(inner), defaults = std::move(defaults),
            secrets = std::make_shared<const Redactor>(std::move(secrets))](const LogRecord& r) {
        LogRecord copy;
        const LogRecord& masked = redacted_record(r, *secrets, copy);
        bool complete = true;
        for (const auto& d : defaults)
            complete = complete && masked.field(d.key).has_value();
        if (complete) {
            inner(masked);
            return;
        }
        if (&masked != &copy)
            copy = masked;
        auto at = copy.fields.begin();
        if (at != copy.fields.end() && at->key == log_field::component)
            ++at;
        for (const auto& d : defaults)
            if (!copy.field(d.key))
                at = copy.fields.insert(at, d) + 1;
        inner(copy);
    };
}

void emit(const LogSink& sink, LogLevel level, std::string message, const char* component, LogFields fields) noexcept
{
    if (!sink)
        return;
    try {
        LogRecord r{level, std::move(message), std::move(fields)};
        if (!r.field(log_field::component))
            r.fields.insert(r.fields.begin(), LogField{log_field::component, component});
        sink(r);
    } catch (...) {
    }
}

} // namespace detail
} // namespace idemkafka
