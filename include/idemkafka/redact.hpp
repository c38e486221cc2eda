#pragma once
/// \file
/// Secret redaction: one implementation for the library's log records and
/// exception texts and for idemkafka-admin's output.

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// What a masked secret is replaced with.
inline constexpr std::string_view redacted = "***";

/// True when a configuration key names a secret, case-insensitively: a libpq
/// `password` or `sslpassword`, librdkafka `sasl.password`, `ssl.key.password`,
/// `ssl.keystore.password`, `sasl.oauthbearer.client.secret`,
/// `sasl.oauthbearer.config`, `ssl.key.pem`, `sasl.jaas.config`, and any key
/// containing `password`, `passwd`, `secret`, `private` or `keystore`. Never throws.
IDEMKAFKA_API bool is_secret_setting(std::string_view key) noexcept;

/// `text` with every password-looking value masked as `***`: the value after
/// `<key>=` when is_secret_setting(key) (also `kafka["<key>"]=`; a quoted value
/// up to its closing quote, otherwise up to a space, `&` or `"`), and the
/// password of every `scheme://user:password@`. Text without `pass`, `secret`,
/// `pwd`, `private`, `keystore`, `jaas`, `oauthbearer`, `key.pem` (any case)
/// or `://` is returned unchanged after a single scan. Throws only std::bad_alloc.
IDEMKAFKA_API std::string redact(std::string_view text);

/// A libpq connection string (key/value or URI form) with its password
/// masked, for printing: `host=db user=app password=***`,
/// `postgresql://app:***@db/x`. Throws only std::bad_alloc.
IDEMKAFKA_API std::string redact_conninfo(std::string_view conninfo);

/// Remembers the secret values of a configuration and masks them wherever
/// they appear in a text, on top of redact()'s patterns: a library or server
/// message may echo a secret without its key (libpq's "invalid
/// percent-encoded token: ..." quotes a URI password, for one). const members
/// are thread-safe; the add functions are not.
class IDEMKAFKA_API Redactor {
public:
    /// Remembers the password(s) of a libpq key/value string or URI, as written
    /// and percent-decoded. Never throws but std::bad_alloc.
    void add_conninfo(std::string_view conninfo);
    /// Remembers `value` when is_secret_setting(key). Never throws but std::bad_alloc.
    void add_setting(std::string_view key, std::string_view value);
    /// add_setting() for each entry. Never throws but std::bad_alloc.
    void add_settings(const std::map<std::string, std::string>& settings);
    /// Remembers `value` as a secret. Values shorter than 4 bytes are ignored
    /// (they would mask ordinary words everywhere); redact()'s patterns still
    /// catch them after their key. Never throws but std::bad_alloc.
    void add_secret(std::string_view value);

    /// `text` with every remembered secret replaced by `***`, then redact().
    /// Throws only std::bad_alloc.
    std::string operator()(std::string_view text) const;
    /// True when `text` holds a remembered secret or may hold a password pattern. Never throws.
    bool needed(std::string_view text) const noexcept;
    /// True when no secret is remembered. Never throws.
    bool empty() const noexcept { return secrets_.empty(); }

private:
    std::vector<std::string> secrets_; // longest first, so a secret inside another cannot split it
};

} // namespace idemkafka
