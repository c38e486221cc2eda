#include "idemkafka/cloud_events.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/record_headers.hpp"
#include "core/sha1.hpp"
#include "idemkafka/error.hpp"

namespace idemkafka {
namespace {

using detail::last_header;

// UUIDv5(NAMESPACE_URL, "urn:idemkafka:cloudevents"), pinned by a unit test:
// changing it would change every CloudEvents dedup key.
constexpr EventId::Bytes namespace_bytes = {0x9d, 0x34, 0x0a, 0x48, 0x9e, 0x6d, 0x5a, 0xd6,
                                            0x9e, 0xa3, 0xd5, 0x1f, 0xd4, 0x76, 0x69, 0xb9};

// Error messages show this much of a producer's text at most.
constexpr std::size_t max_shown = 64;

std::string shown(std::string_view text)
{
    std::string out;
    out.reserve(text.size() < max_shown ? text.size() + 2 : max_shown + 5);
    out += '"';
    for (std::size_t i = 0; i < text.size() && i < max_shown; ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        out += c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
    }
    out += '"';
    if (text.size() > max_shown)
        out += "...";
    return out;
}

char lower(char c) noexcept
{
    return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) noexcept
{
    if (a.size() != b.size())
        return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (lower(a[i]) != lower(b[i]))
            return false;
    return true;
}

// The media type of a content type: before any parameter, without blanks.
std::string_view media_type(std::string_view content_type) noexcept
{
    content_type = content_type.substr(0, content_type.find(';'));
    while (!content_type.empty() && (content_type.front() == ' ' || content_type.front() == '\t'))
        content_type.remove_prefix(1);
    while (!content_type.empty() && (content_type.back() == ' ' || content_type.back() == '\t'))
        content_type.remove_suffix(1);
    return content_type;
}

bool starts_with_ci(std::string_view text, std::string_view prefix) noexcept
{
    return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

bool ends_with_ci(std::string_view text, std::string_view suffix) noexcept
{
    return text.size() >= suffix.size() && iequals(text.substr(text.size() - suffix.size()), suffix);
}

// JSON format 3.1: without a datacontenttype the data is JSON.
bool is_json_media_type(const std::optional<std::string>& content_type) noexcept
{
    if (!content_type)
        return true;
    const auto m = media_type(*content_type);
    return iequals(m, "application/json") || iequals(m, "text/json") || ends_with_ci(m, "+json");
}

int base64_value(char c) noexcept
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

// RFC 4648 base64 with padding, as the JSON format asks for data_base64.
std::string decode_base64(std::string_view text)
{
    if (text.size() % 4 != 0)
        throw DecodeError("CloudEvents envelope: 'data_base64' is not base64: its length " +
                          std::to_string(text.size()) + " is not a multiple of 4");
    std::string out;
    out.reserve(text.size() / 4 * 3);
    for (std::size_t i = 0; i < text.size(); i += 4) {
        int v[4];
        for (std::size_t j = 0; j < 4; ++j) {
            const char c = text[i + j];
            const bool last_quad = i + 4 == text.size();
            if (c == '=' && last_quad && (j == 3 || (j == 2 && text[i + 3] == '='))) {
                v[j] = -2;
                continue;
            }
            v[j] = base64_value(c);
            if (v[j] < 0)
                throw DecodeError("CloudEvents envelope: 'data_base64' is not base64: character " + shown({&c, 1}) +
                                  " at position " + std::to_string(i + j));
        }
        out += static_cast<char>((v[0] << 2) | (v[1] >> 4));
        if (v[2] >= 0)
            out += static_cast<char>(((v[1] & 0x0F) << 4) | (v[2] >> 2));
        if (v[3] >= 0)
            out += static_cast<char>(((v[2] & 0x03) << 6) | v[3]);
    }
    return out;
}

// ---- the envelope ----------------------------------------------------------
//
// The envelope is validated whole by nlohmann's acceptor (no document built),
// then its top-level members are found by a scan that may assume valid JSON.
// `data` is handed on as the producer wrote it, byte for byte: no number is
// re-printed (amounts keep every digit) and nothing is parsed twice.

bool is_ws(char c) noexcept
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::size_t skip_ws(std::string_view json, std::size_t i) noexcept
{
    while (i < json.size() && is_ws(json[i]))
        ++i;
    return i;
}

// `i` at the opening quote; returns the index after the closing one.
std::size_t skip_string(std::string_view json, std::size_t i) noexcept
{
    for (++i; i < json.size() && json[i] != '"'; ++i)
        if (json[i] == '\\')
            ++i;
    return i + 1;
}

std::size_t skip_value(std::string_view json, std::size_t i) noexcept
{
    if (json[i] == '"')
        return skip_string(json, i);
    if (json[i] != '{' && json[i] != '[') {
        while (i < json.size() && json[i] != ',' && json[i] != '}' && json[i] != ']' && !is_ws(json[i]))
            ++i;
        return i;
    }
    std::size_t depth = 0;
    while (i < json.size()) {
        const char c = json[i];
        if (c == '"') {
            i = skip_string(json, i);
            continue;
        }
        if (c == '{' || c == '[')
            ++depth;
        else if ((c == '}' || c == ']') && --depth == 0)
            return i + 1;
        ++i;
    }
    return i;
}

// A JSON string's value; `raw` is valid JSON string text with its quotes.
std::string unquote(std::string_view raw)
{
    if (raw.find('\\') == std::string_view::npos)
        return std::string(raw.substr(1, raw.size() - 2));
    return nlohmann::json::parse(raw.begin(), raw.end()).get<std::string>();
}

const char* type_name(std::string_view raw) noexcept
{
    switch (raw.empty() ? 'n' : raw.front()) {
    case '"':
        return "string";
    case '{':
        return "object";
    case '[':
        return "array";
    case 't':
    case 'f':
        return "boolean";
    case 'n':
        return "null";
    default:
        return "number";
    }
}

struct Member {
    std::string name;
    std::string_view raw; ///< the value's JSON text
};

// The top-level members of an envelope, in order. Throws DecodeError naming
// what is wrong when it is not a JSON object.
std::vector<Member> members_of(std::string_view json)
{
    if (!nlohmann::json::accept(json.begin(), json.end())) {
        // Only now is the error worth its price. nlohmann's message ends with
        // the token it read last, which can be as long as the payload: cut
        // there and give the byte position instead.
        try {
            const auto unexpected = nlohmann::json::parse(json.begin(), json.end());
            (void)unexpected;
        } catch (const nlohmann::json::parse_error& e) {
            std::string what = e.what();
            what = what.substr(0, what.find("; last read"));
            throw DecodeError("CloudEvents envelope is not JSON: " + what.substr(0, max_shown * 3) + " (byte " +
                              std::to_string(e.byte) + ")");
        } catch (const nlohmann::json::exception& e) {
            throw DecodeError("CloudEvents envelope is not JSON: " + std::string(e.what()).substr(0, max_shown * 3));
        }
        throw DecodeError("CloudEvents envelope is not JSON");
    }
    std::size_t i = 0;
    if (json.substr(0, 3) == "\xEF\xBB\xBF") // a byte order mark, which the acceptor skips too
        i = 3;
    i = skip_ws(json, i);
    if (json[i] != '{')
        throw DecodeError(std::string("CloudEvents envelope must be a JSON object, got ") + type_name(json.substr(i)));
    std::vector<Member> out;
    i = skip_ws(json, i + 1);
    while (json[i] != '}') {
        const auto name_end = skip_string(json, i);
        auto name = unquote(json.substr(i, name_end - i));
        const auto value = skip_ws(json, skip_ws(json, name_end) + 1);
        const auto value_end = skip_value(json, value);
        out.push_back({std::move(name), json.substr(value, value_end - value)});
        i = skip_ws(json, value_end);
        if (json[i] == ',')
            i = skip_ws(json, i + 1);
    }
    return out;
}

// The value of member `name` (the last one, as a JSON object's duplicate keys
// are commonly read), nothing when absent; `null` counts as absent unless asked.
std::optional<std::string_view> member(const std::vector<Member>& members, std::string_view name,
                                       bool null_too = false) noexcept
{
    for (auto it = members.rbegin(); it != members.rend(); ++it)
        if (it->name == name)
            return it->raw == "null" && !null_too ? std::nullopt : std::optional<std::string_view>(it->raw);
    return std::nullopt;
}

// id and source make the dedup key, so their absence is a missing event id
// (missing_event_id) and their wrong type an invalid one (invalid_event_id).
std::string identity_member(const std::vector<Member>& members, const char* name)
{
    const auto raw = member(members, name, true);
    if (!raw)
        throw MissingEventId(std::string("CloudEvents envelope has no '") + name + "' attribute");
    if (*raw == "null")
        throw MissingEventId(std::string("CloudEvents envelope: '") + name + "' is null");
    if (raw->front() != '"')
        throw InvalidEventId(std::string("CloudEvents envelope: '") + name + "' must be a string, got " +
                             type_name(*raw));
    auto value = unquote(*raw);
    if (value.empty())
        throw MissingEventId(std::string("CloudEvents envelope: '") + name + "' is empty");
    return value;
}

std::optional<std::string> string_member(const std::vector<Member>& members, const char* name, bool required)
{
    const auto raw = member(members, name);
    if (!raw) {
        if (required)
            throw DecodeError(std::string("CloudEvents envelope has no '") + name + "' attribute");
        return std::nullopt;
    }
    if (raw->front() != '"')
        throw DecodeError(std::string("CloudEvents envelope: '") + name + "' must be a string, got " + type_name(*raw));
    auto value = unquote(*raw);
    if (required && value.empty())
        throw DecodeError(std::string("CloudEvents envelope: '") + name + "' is empty");
    return value;
}

bool is_attribute(std::string_view name) noexcept
{
    static constexpr std::array<std::string_view, 10> known = {
        "id",      "source",          "type",       "specversion", "time",
        "subject", "datacontenttype", "dataschema", "data",        "data_base64"};
    for (const auto k : known)
        if (k == name)
            return true;
    return false;
}

CloudEvent from_envelope(const std::vector<Member>& members)
{
    CloudEvent ev;
    ev.structured = true;
    ev.id = identity_member(members, "id");
    ev.source = identity_member(members, "source");
    ev.specversion = *string_member(members, "specversion", true);
    ev.type = *string_member(members, "type", true);
    ev.time = string_member(members, "time", false);
    ev.subject = string_member(members, "subject", false);
    ev.datacontenttype = string_member(members, "datacontenttype", false);
    ev.dataschema = string_member(members, "dataschema", false);
    for (const auto& m : members) {
        if (is_attribute(m.name) || m.raw == "null")
            continue;
        const auto c = m.raw.front();
        if (c == '{' || c == '[')
            throw DecodeError("CloudEvents envelope: extension " + shown(m.name) +
                              " must be a string, number or boolean, got " + type_name(m.raw));
        ev.extensions[m.name] = c == '"' ? unquote(m.raw) : std::string(m.raw);
    }
    const auto data = member(members, "data");
    const auto base64 = member(members, "data_base64");
    if (data && base64)
        throw DecodeError("CloudEvents envelope has both 'data' and 'data_base64'");
    if (base64) {
        if (base64->front() != '"')
            throw DecodeError(std::string("CloudEvents envelope: 'data_base64' must be a string, got ") +
                              type_name(*base64));
        ev.data = decode_base64(unquote(*base64));
    } else if (data) {
        if (data->front() == '"' && !is_json_media_type(ev.datacontenttype))
            ev.data = unquote(*data);
        else
            ev.data = std::string(*data);
    }
    return ev;
}

enum class Mode { binary, structured };

Mode mode_of(const Record& record)
{
    const auto* ct = last_header(record, cloud_event_header::content_type);
    if (!ct || !ct->value)
        return Mode::binary;
    const auto m = media_type(*ct->value);
    if (iequals(m, cloud_event_header::structured_media_type))
        return Mode::structured;
    // The binding has no batch mode, and only the JSON event format is read here.
    if (starts_with_ci(m, "application/cloudevents"))
        throw DecodeError("CloudEvents content type " + shown(*ct->value) +
                          " is not supported: only application/cloudevents+json (structured) or binary mode");
    return Mode::binary;
}

std::string_view structured_value(const Record& record)
{
    if (!record.value)
        throw DecodeError("structured CloudEvents record has a null value");
    return *record.value;
}

// What a missing ce_* header means: id and source make the dedup key (a
// missing event id), specversion and type make it a CloudEvent (undecodable).
enum class Need { optional, identity, required };

std::optional<std::string> header_value(const Record& record, const char* name, Need need)
{
    const auto* h = last_header(record, name);
    if (h && h->value && !h->value->empty())
        return *h->value;
    if (need == Need::optional)
        return std::nullopt;
    const char* what = !h ? "no" : !h->value ? "a null" : "an empty";
    const auto message = std::string("CloudEvents record (binary mode) has ") + what + " '" + name + "' header";
    if (need == Need::identity)
        throw MissingEventId(message);
    throw DecodeError(message);
}

} // namespace

EventId cloud_event_namespace() noexcept
{
    return EventId(namespace_bytes);
}

EventId cloud_event_id(std::string_view source, std::string_view id)
{
    if (source.empty())
        throw MissingEventId("CloudEvents 'source' is empty");
    if (id.empty())
        throw MissingEventId("CloudEvents 'id' is empty");
    // The length prefix keeps ("a", "bc") and ("ab", "c") apart.
    const auto length = std::to_string(source.size());
    detail::Sha1 sha;
    sha.update(namespace_bytes.data(), namespace_bytes.size());
    sha.update(length);
    sha.update(":");
    sha.update(source);
    sha.update(id);
    const auto digest = sha.finish();
    EventId::Bytes b{};
    for (std::size_t i = 0; i < b.size(); ++i)
        b[i] = digest[i];
    int version = 5;
    EventId given;
    if (EventId::try_parse(id, given) && given.version() == 7 && given.is_rfc_variant()) {
        for (std::size_t i = 0; i < 6; ++i)
            b[i] = given.bytes()[i];
        version = 7;
    }
    b[6] = static_cast<std::uint8_t>((b[6] & 0x0F) | (version << 4));
    b[8] = static_cast<std::uint8_t>((b[8] & 0x3F) | 0x80);
    return EventId(b);
}

CloudEvent parse_cloud_event(std::string_view json)
{
    return from_envelope(members_of(json));
}

CloudEvent decode_cloud_event(const Record& record)
{
    if (mode_of(record) == Mode::structured)
        return parse_cloud_event(structured_value(record));
    CloudEvent ev;
    ev.id = *header_value(record, cloud_event_header::id, Need::identity);
    ev.source = *header_value(record, cloud_event_header::source, Need::identity);
    ev.specversion = *header_value(record, cloud_event_header::specversion, Need::required);
    ev.type = *header_value(record, cloud_event_header::type, Need::required);
    ev.time = header_value(record, cloud_event_header::time, Need::optional);
    ev.subject = header_value(record, cloud_event_header::subject, Need::optional);
    ev.dataschema = header_value(record, cloud_event_header::dataschema, Need::optional);
    if (const auto* ct = last_header(record, cloud_event_header::content_type); ct && ct->value)
        ev.datacontenttype = *ct->value;
    const std::string_view prefix = cloud_event_header::prefix;
    for (const auto& h : record.headers) {
        const std::string_view name = h.name;
        if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix || !h.value)
            continue;
        const auto attribute = name.substr(prefix.size());
        if (attribute == "id" || attribute == "source" || attribute == "specversion" || attribute == "type" ||
            attribute == "time" || attribute == "subject" || attribute == "dataschema")
            continue;
        ev.extensions[std::string(attribute)] = *h.value;
    }
    if (record.value)
        ev.data = std::string(*record.value);
    return ev;
}

EventId cloud_event_record_id(const Record& record)
{
    // The id is checked before the source, as decode_cloud_event() does, so
    // both name the same problem first.
    if (mode_of(record) == Mode::structured) {
        const auto members = members_of(structured_value(record));
        const auto id = identity_member(members, "id");
        return cloud_event_id(identity_member(members, "source"), id);
    }
    const auto id = header_value(record, cloud_event_header::id, Need::identity);
    return cloud_event_id(*header_value(record, cloud_event_header::source, Need::identity), *id);
}

} // namespace idemkafka
