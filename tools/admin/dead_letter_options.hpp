#pragma once
// The options of `dead-letters` that `serve` shares: the dead-letter topic,
// the filter, the replay's options and its audit table.

#include <optional>
#include <string>

#include <idemkafka/dead_letter_triage.hpp>

#include "cli.hpp"

namespace idemkafka::detail::admin {

struct DeadLetterOptions {
    DeadLetterSource source;
    DeadLetterFilter filter;
    std::optional<std::uint64_t> limit;
    bool json = false, dry_run = false, again = false;
    double rate = 0;
    std::optional<std::string> target_topic;
    std::string requested_by;
    std::string postgres;
    ReplayAuditTable audit;

    /// The replay these options ask for, made by `tool`.
    ReplayRequest replay_request(const std::string& tool) const;
    /// The audit table, quoted.
    std::string audit_name() const;
};

/// Consumes one dead-letter option; false if it is not one. Throws UsageError
/// for a bad value.
bool dead_letter_option(ArgReader& a, DeadLetterOptions& o);
/// Fills what the environment gives (IDEMKAFKA_BROKERS, IDEMKAFKA_POSTGRES,
/// USER) and checks that `action` (list, groups, replay, serve) has what it
/// needs and nothing that belongs to another; throws UsageError.
void check_dead_letter_options(DeadLetterOptions& o, const std::string& action);

/// `"schema"."table"` of an audit table. Throws ConfigError for a bad name.
std::string audit_name_of(const ReplayAuditTable& t);

/// Parses `PARTITION@OFFSET`. Throws UsageError naming `what`.
std::pair<std::int32_t, std::int64_t> parse_coordinates(const std::string& text, std::string_view what);

} // namespace idemkafka::detail::admin
