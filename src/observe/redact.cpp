#include "idemkafka/redact.hpp"

#include <algorithm>
#include <array>
#include <cctype>

namespace idemkafka {
namespace {

char lower(char c) noexcept
{
    return static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

bool is_space(char c) noexcept
{
    return std::isspace(static_cast<unsigned char>(c)) != 0;
}

bool icontains(std::string_view text, std::string_view needle) noexcept
{
    if (needle.size() > text.size())
        return false;
    for (std::size_t i = 0; i + needle.size() <= text.size(); ++i) {
        std::size_t k = 0;
        while (k < needle.size() && lower(text[i + k]) == needle[k])
            ++k;
        if (k == needle.size())
            return true;
    }
    return false;
}

// The cheap test that keeps ordinary lines from being scanned twice: every
// pattern of redact() needs one of these words (or a URI) nearby.
bool may_hold_secret(std::string_view text) noexcept
{
    static constexpr std::array<std::string_view, 8> words = {"pass",     "secret", "pwd",         "private",
                                                              "keystore", "jaas",   "oauthbearer", "key.pem"};
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = lower(text[i]);
        if (c == ':' && text.compare(i, 3, "://") == 0)
            return true;
        for (const auto w : words)
            if (c == w[0] && i + w.size() <= text.size() && icontains(text.substr(i, w.size()), w))
                return true;
    }
    return false;
}

bool is_key_char(char c) noexcept
{
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// Masks the value of every `<secret key>=<value>`: spaces may surround `=`,
// the key may sit in `["..."]` (as in a ConfigError naming kafka["sasl.password"]);
// a quoted value is masked up to its closing quote, any other up to a space,
// `&` (URI query) or `"`.
std::string mask_settings(std::string text)
{
    std::size_t from = 0;
    for (std::size_t eq; (eq = text.find('=', from)) != std::string::npos;) {
        from = eq + 1;
        std::size_t j = eq;
        while (j > 0 && text[j - 1] == ' ')
            --j;
        if (j > 0 && text[j - 1] == ']')
            --j;
        if (j > 0 && (text[j - 1] == '"' || text[j - 1] == '\''))
            --j;
        std::size_t k = j;
        while (k > 0 && is_key_char(text[k - 1]))
            --k;
        if (k == j || !is_secret_setting(std::string_view(text).substr(k, j - k)))
            continue;
        std::size_t v = eq + 1;
        while (v < text.size() && text[v] == ' ')
            ++v;
        std::size_t end = v;
        if (end < text.size() && (text[end] == '\'' || text[end] == '"')) {
            const char q = text[end++];
            while (end < text.size() && text[end] != q) {
                if (text[end] == '\\')
                    ++end;
                ++end;
            }
            end = std::min(end + 1, text.size());
        } else {
            while (end < text.size() && !is_space(text[end]) && text[end] != '&' && text[end] != '"')
                ++end;
        }
        if (end > v) {
            text.replace(v, end - v, redacted);
            from = v + redacted.size();
        }
    }
    return text;
}

// Masks the password of every `scheme://user:password@` in the text.
std::string mask_uri_passwords(std::string text)
{
    std::size_t pos = 0;
    while ((pos = text.find("://", pos)) != std::string::npos) {
        const std::size_t start = pos + 3;
        std::size_t end = start;
        while (end < text.size() && !is_space(text[end]) && text[end] != '@')
            ++end;
        if (end < text.size() && text[end] == '@') {
            const std::size_t colon = text.find(':', start);
            if (colon != std::string::npos && colon < end && end > colon + 1) {
                text.replace(colon + 1, end - colon - 1, redacted);
                end = colon + 1 + redacted.size();
            }
        }
        pos = end;
    }
    return text;
}

std::string percent_decode(std::string_view s)
{
    auto hex = [](char c) { return c <= '9' ? c - '0' : lower(c) - 'a' + 10; };
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
            std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
            out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
            i += 2;
        } else {
            out.push_back(s[i]);
        }
    }
    return out;
}

} // namespace

bool is_secret_setting(std::string_view key) noexcept
{
    static constexpr std::array<std::string_view, 8> words = {
        "password", "passwd", "secret", "private", "keystore", "jaas.config", "key.pem", "oauthbearer.config"};
    for (const auto w : words)
        if (icontains(key, w))
            return true;
    return false;
}

std::string redact(std::string_view text)
{
    if (!may_hold_secret(text))
        return std::string(text);
    return mask_uri_passwords(mask_settings(std::string(text)));
}

std::string redact_conninfo(std::string_view conninfo)
{
    Redactor r;
    r.add_conninfo(conninfo);
    return r(conninfo);
}

void Redactor::add_secret(std::string_view value)
{
    if (value.size() < 4 || std::find(secrets_.begin(), secrets_.end(), value) != secrets_.end())
        return;
    const auto at =
        std::find_if(secrets_.begin(), secrets_.end(), [&](const std::string& s) { return s.size() < value.size(); });
    secrets_.emplace(at, value);
}

namespace {

// The secrets of a URI conninfo whose authority begins at `start`: the
// password of its user info and the values of its secret query parameters,
// each given to `keep` as written.
template <class Keep> void uri_secrets(std::string_view conninfo, std::size_t start, Keep keep)
{
    const std::size_t at = conninfo.find('@', start);
    const std::size_t authority_end = conninfo.find_first_of("/?", start);
    if (at != std::string_view::npos && at < authority_end) {
        const std::size_t colon = conninfo.find(':', start);
        if (colon != std::string_view::npos && colon < at)
            keep(conninfo.substr(colon + 1, at - colon - 1));
    }
    const std::size_t query = conninfo.find('?', start);
    if (query == std::string_view::npos)
        return;
    for (std::size_t p = query + 1; p < conninfo.size();) {
        std::size_t amp = conninfo.find('&', p);
        if (amp == std::string_view::npos)
            amp = conninfo.size();
        const auto param = conninfo.substr(p, amp - p);
        const auto eq = param.find('=');
        if (eq != std::string_view::npos && is_secret_setting(percent_decode(param.substr(0, eq))))
            keep(param.substr(eq + 1));
        p = amp + 1;
    }
}

// The value of a key = value conninfo that begins at `i`, unescaped; `i`
// moves past it. A value may be single-quoted with backslash escapes.
std::string conninfo_value(std::string_view conninfo, std::size_t& i)
{
    std::string value;
    if (i < conninfo.size() && conninfo[i] == '\'') {
        ++i;
        while (i < conninfo.size() && conninfo[i] != '\'') {
            if (conninfo[i] == '\\' && i + 1 < conninfo.size())
                ++i;
            value.push_back(conninfo[i++]);
        }
        ++i;
    } else {
        while (i < conninfo.size() && !is_space(conninfo[i])) {
            if (conninfo[i] == '\\' && i + 1 < conninfo.size())
                ++i;
            value.push_back(conninfo[i++]);
        }
    }
    return value;
}

// The values of the secret settings of a key = value conninfo, each given to
// `add` unescaped and as written.
template <class Add> void keyword_secrets(std::string_view conninfo, Add add)
{
    std::size_t i = 0;
    while (i < conninfo.size()) {
        while (i < conninfo.size() && is_space(conninfo[i]))
            ++i;
        const std::size_t key_start = i;
        while (i < conninfo.size() && conninfo[i] != '=' && !is_space(conninfo[i]))
            ++i;
        const auto key = conninfo.substr(key_start, i - key_start);
        while (i < conninfo.size() && is_space(conninfo[i]))
            ++i;
        if (i >= conninfo.size() || conninfo[i] != '=') {
            ++i;
            continue;
        }
        ++i;
        while (i < conninfo.size() && is_space(conninfo[i]))
            ++i;
        const std::size_t value_start = i;
        const std::string value = conninfo_value(conninfo, i);
        if (is_secret_setting(key)) {
            add(value);
            // As written too (quotes, escapes): a parse error may quote it so.
            add(conninfo.substr(value_start, std::min(i, conninfo.size()) - value_start));
        }
    }
}

} // namespace

void Redactor::add_conninfo(std::string_view conninfo)
{
    const auto scheme = conninfo.find("://");
    if (scheme != std::string_view::npos) {
        uri_secrets(conninfo, scheme + 3, [this](std::string_view raw) {
            add_secret(raw);
            add_secret(percent_decode(raw));
        });
        return;
    }
    keyword_secrets(conninfo, [this](std::string_view value) { add_secret(value); });
}

void Redactor::add_setting(std::string_view key, std::string_view value)
{
    if (is_secret_setting(key))
        add_secret(value);
}

void Redactor::add_settings(const std::map<std::string, std::string>& settings)
{
    for (const auto& [k, v] : settings)
        add_setting(k, v);
}

std::string Redactor::operator()(std::string_view text) const
{
    std::string s(text);
    for (const auto& secret : secrets_) {
        for (std::size_t p = 0; (p = s.find(secret, p)) != std::string::npos;) {
            s.replace(p, secret.size(), redacted);
            p += redacted.size();
        }
    }
    return redact(s);
}

bool Redactor::needed(std::string_view text) const noexcept
{
    for (const auto& secret : secrets_)
        if (text.find(secret) != std::string_view::npos)
            return true;
    return may_hold_secret(text);
}

} // namespace idemkafka
