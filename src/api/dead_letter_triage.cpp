// The pure half of dead-letter triage: the record's accessors, the error
// normaliser, causes, grouping and the filter. No I/O: unit-tested without
// services (tests/unit/test_dead_letter_triage.cpp).

#include "idemkafka/dead_letter_triage.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "idemkafka/dead_letter.hpp"

namespace idemkafka {
namespace {

constexpr std::size_t max_pattern_bytes = 200;

bool is_alnum(char c)
{
    return std::isalnum(static_cast<unsigned char>(c)) != 0;
}

bool is_hex(char c)
{
    return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

// A UUID (8-4-4-4-12 hex digits) at `i`, not inside a longer word.
bool uuid_at(std::string_view s, std::size_t i)
{
    static constexpr std::size_t groups[] = {8, 4, 4, 4, 12};
    if (i > 0 && is_alnum(s[i - 1]))
        return false;
    std::size_t p = i;
    for (std::size_t g = 0; g < 5; ++g) {
        if (g > 0) {
            if (p >= s.size() || s[p] != '-')
                return false;
            ++p;
        }
        for (std::size_t k = 0; k < groups[g]; ++k, ++p)
            if (p >= s.size() || !is_hex(s[p]))
                return false;
    }
    return p == s.size() || !is_alnum(s[p]);
}

// The end of a quoted value opening at `i` (the closing quote's index + 1), or
// npos: it opens a word and closes before a non-word character.
std::size_t quoted_end(std::string_view s, std::size_t i)
{
    if (i > 0 && is_alnum(s[i - 1]))
        return std::string_view::npos;
    const std::size_t close = s.find(s[i], i + 1);
    if (close == std::string_view::npos || (close + 1 < s.size() && is_alnum(s[close + 1])))
        return std::string_view::npos;
    return close + 1;
}

// The mask of a word of letters and digits: a number, an identifier, or itself.
std::string_view word_mask(std::string_view w)
{
    const auto digits = static_cast<std::size_t>(
        std::count_if(w.begin(), w.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }));
    if (digits == w.size())
        return "<n>";
    if (w.size() > 2 && w[0] == '0' && (w[1] == 'x' || w[1] == 'X') && std::all_of(w.begin() + 2, w.end(), is_hex))
        return "<n>";
    const bool hex = std::all_of(w.begin(), w.end(), is_hex);
    if (digits > 0 && ((hex && w.size() >= 6) || w.size() >= 12))
        return "<id>";
    return w;
}

void append_space(std::string& out)
{
    if (!out.empty() && out.back() != ' ')
        out.push_back(' ');
}

std::uint64_t fnv1a(std::string_view s, std::uint64_t h)
{
    for (const char c : s) {
        h ^= static_cast<unsigned char>(c);
        h *= 1099511628211ULL;
    }
    return h;
}

} // namespace

// ---- the record --------------------------------------------------------------------

std::optional<std::string> DeadLetterRecord::header(std::string_view name) const
{
    for (const auto& h : headers)
        if (h.name == name)
            return h.value ? *h.value : std::string();
    return std::nullopt;
}

std::string DeadLetterRecord::consumer_group() const
{
    return header(dead_letter_header::consumer_group).value_or("");
}

std::string DeadLetterRecord::reason() const
{
    return header(dead_letter_header::reason).value_or("");
}

std::string DeadLetterRecord::error() const
{
    return header(dead_letter_header::error).value_or("");
}

std::string DeadLetterRecord::original_topic() const
{
    return header(dead_letter_header::original_topic).value_or("");
}

std::int32_t DeadLetterRecord::original_partition() const
{
    const std::string text = header(dead_letter_header::original_partition).value_or("");
    std::int32_t p = -1;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), p);
    return r.ec == std::errc() && r.ptr == text.data() + text.size() && !text.empty() ? p : -1;
}

// ---- the normaliser ----------------------------------------------------------------

std::string normalise_dead_letter_error(std::string_view s)
{
    std::string out;
    std::size_t i = 0;
    while (i < s.size() && out.size() < max_pattern_bytes) {
        const char c = s[i];
        if (std::isspace(static_cast<unsigned char>(c))) {
            append_space(out);
            ++i;
        } else if (uuid_at(s, i)) {
            out += "<uuid>";
            i += 36;
        } else if ((c == '\'' || c == '"') && quoted_end(s, i) != std::string_view::npos) {
            out += c;
            out += '?';
            out += c;
            i = quoted_end(s, i);
        } else if (is_alnum(c)) {
            std::size_t j = i;
            while (j < s.size() && is_alnum(s[j]))
                ++j;
            const std::string_view mask = word_mask(s.substr(i, j - i));
            // A decimal fraction belongs to its number.
            if (mask == "<n>" && j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1])))
                for (++j; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]));)
                    ++j;
            out += mask;
            i = j;
        } else {
            out.push_back(c);
            ++i;
        }
    }
    while (!out.empty() && out.back() == ' ')
        out.pop_back();
    if (out.size() > max_pattern_bytes)
        out.resize(max_pattern_bytes);
    return out;
}

// ---- causes and groups -------------------------------------------------------------

DeadLetterCause DeadLetterCause::of(const DeadLetterRecord& record)
{
    return {record.consumer_group(), record.reason(), normalise_dead_letter_error(record.error())};
}

std::string DeadLetterCause::id() const
{
    // The parts are separated by a byte none of them holds in practice; each
    // part's length goes in too, so that ("ab", "c") and ("a", "bc") differ.
    std::uint64_t h = 14695981039346656037ULL;
    for (const std::string* part : {&consumer_group, &reason, &error_pattern}) {
        h = fnv1a(std::to_string(part->size()), h);
        h = fnv1a(*part, fnv1a(std::string_view("\x1f", 1), h));
    }
    return fmt::format("{:016x}", h);
}

bool DeadLetterCause::operator<(const DeadLetterCause& o) const
{
    return std::tie(consumer_group, reason, error_pattern) < std::tie(o.consumer_group, o.reason, o.error_pattern);
}

void DeadLetterGrouping::add(const DeadLetterRecord& record)
{
    ++total_;
    DeadLetterCause cause = DeadLetterCause::of(record);
    auto it = groups_.find(cause);
    if (it == groups_.end()) {
        DeadLetterGroup g;
        g.id = cause.id();
        g.cause = cause;
        g.sample = record;
        it = groups_.emplace(std::move(cause), std::move(g)).first;
    }
    DeadLetterGroup& g = it->second;
    ++g.count;
    if (record.timestamp_ms >= 0) {
        if (g.first_seen_ms < 0 || record.timestamp_ms < g.first_seen_ms)
            g.first_seen_ms = record.timestamp_ms;
        g.last_seen_ms = std::max(g.last_seen_ms, record.timestamp_ms);
    }
    const std::string source = record.original_topic();
    if (!source.empty()) {
        auto& parts = g.sources[source];
        if (const auto p = record.original_partition(); p >= 0)
            parts.insert(p);
    }
}

std::vector<DeadLetterGroup> DeadLetterGrouping::groups() const
{
    std::vector<DeadLetterGroup> out;
    out.reserve(groups_.size());
    for (const auto& [cause, g] : groups_)
        out.push_back(g);
    std::stable_sort(out.begin(), out.end(),
                     [](const DeadLetterGroup& a, const DeadLetterGroup& b) { return a.count > b.count; });
    return out;
}

// ---- the filter --------------------------------------------------------------------

bool DeadLetterFilter::matches(const DeadLetterRecord& r) const
{
    if (!coordinates.empty() && !coordinates.count({r.partition, r.offset}))
        return false;
    if (!consumer_groups.empty() && !consumer_groups.count(r.consumer_group()))
        return false;
    if (!reasons.empty() && !reasons.count(r.reason()))
        return false;
    if (from_ms && (r.timestamp_ms < 0 || r.timestamp_ms < *from_ms))
        return false;
    if (to_ms && (r.timestamp_ms < 0 || r.timestamp_ms >= *to_ms))
        return false;
    if (source_topic && r.original_topic() != *source_topic)
        return false;
    if (event_id && r.header(dead_letter_header::event_id) != *event_id)
        return false;
    if (!causes.empty() && !causes.count(DeadLetterCause::of(r).id()))
        return false;
    return true;
}

std::string DeadLetterFilter::to_json() const
{
    nlohmann::json j = nlohmann::json::object();
    if (!consumer_groups.empty())
        j["consumer_groups"] = consumer_groups;
    if (!reasons.empty())
        j["reasons"] = reasons;
    if (!causes.empty())
        j["causes"] = causes;
    if (from_ms)
        j["from_ms"] = *from_ms;
    if (to_ms)
        j["to_ms"] = *to_ms;
    if (source_topic)
        j["source_topic"] = *source_topic;
    if (event_id)
        j["event_id"] = *event_id;
    if (!coordinates.empty()) {
        auto& c = j["coordinates"] = nlohmann::json::array();
        for (const auto& [p, o] : coordinates)
            c.push_back({{"partition", p}, {"offset", o}});
    }
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace idemkafka
