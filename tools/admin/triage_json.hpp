#pragma once
// Dead letters, their groups and replays as JSON: what `dead-letters --json`
// prints and what the console's API serves. Values pass through the admin's
// redaction; a record's value and key only when asked for.

#include <nlohmann/json.hpp>

#include <idemkafka/dead_letter_triage.hpp>

namespace idemkafka::detail::admin {

/// Unix ms as `2024-01-02T03:04:05Z`, or null for a negative (unknown) time.
nlohmann::json json_ms(std::int64_t unix_ms);
/// One dead letter: coordinates, the idemkafka.* fields, and with
/// `with_payload` its key, value and headers (redacted).
nlohmann::json record_json(const DeadLetterRecord& d, bool with_payload);
/// One group: its cause, id, count, first and last seen, sources and sample.
nlohmann::json group_json(const DeadLetterGroup& g);
/// A replay's report: the counts and every record with its outcome.
nlohmann::json replay_report_json(const ReplayReport& r);
/// One audit entry, its filter and records parsed.
nlohmann::json audit_json(const ReplayAuditEntry& e);
/// `j` as text; bytes that are not UTF-8 replaced.
std::string dump(const nlohmann::json& j, int indent = -1);

} // namespace idemkafka::detail::admin
