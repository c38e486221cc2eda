#pragma once
/// \file
/// Dead letters as data: reading a dead-letter topic, grouping its records by
/// cause (consumer group, reason and the error with its variable parts masked),
/// selecting records with a filter, and replaying them to the topic they came
/// from with a rate limit, a dry run and an audit trail in PostgreSQL (the
/// table `idemkafka-admin migrate --replay-audit` creates). The dead-letter
/// topic stays the source of truth: nothing here consumes it as a group or
/// commits offsets.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <pqxx/connection>

#include "idemkafka/context.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/log.hpp"

namespace idemkafka {

/// One record of a dead-letter topic, owned.
struct IDEMKAFKA_API DeadLetterRecord {
    std::string topic;                ///< the dead-letter topic
    std::int32_t partition = 0;       ///< its partition there
    std::int64_t offset = 0;          ///< its offset there
    std::int64_t timestamp_ms = -1;   ///< when it was dead-lettered (Unix ms), -1 if unknown
    std::optional<std::string> key;   ///< the original key (nullopt: null)
    std::optional<std::string> value; ///< the original value (nullopt: null or left out)
    std::vector<Header> headers;      ///< the original headers, then the idemkafka.* ones

    /// The value of the first header called `name` (an empty string for a null
    /// value); nullopt when there is none.
    std::optional<std::string> header(std::string_view name) const;
    /// idemkafka.consumer_group, or "" when missing.
    std::string consumer_group() const;
    /// idemkafka.reason, or "" when missing.
    std::string reason() const;
    /// idemkafka.error, or "" when missing.
    std::string error() const;
    /// idemkafka.original.topic, or "" when missing.
    std::string original_topic() const;
    /// idemkafka.original.partition; -1 when missing or not a number.
    std::int32_t original_partition() const;
};

/// `error` with its variable parts masked, so that errors of one cause read
/// the same: UUIDs become `<uuid>`, long hex and letter-digit identifiers
/// `<id>`, numbers standing alone (not part of a word like `utf8`) `<n>`, and
/// text in single or double quotes a question mark in the same quotes; runs of
/// white space become one space and the result is cut at 200 bytes. Never
/// throws but std::bad_alloc.
IDEMKAFKA_API std::string normalise_dead_letter_error(std::string_view error);

/// The cause of a dead letter: what grouping keys on.
struct IDEMKAFKA_API DeadLetterCause {
    std::string consumer_group; ///< idemkafka.consumer_group ("" when missing)
    std::string reason;         ///< idemkafka.reason ("" when missing)
    std::string error_pattern;  ///< normalise_dead_letter_error(idemkafka.error)

    /// The cause of `record`.
    static DeadLetterCause of(const DeadLetterRecord& record);
    /// A short stable name of the cause (16 hex digits of a hash of its three
    /// parts): the same in every run and process, for filters and links.
    std::string id() const;
    /// Orders by group, reason, pattern.
    bool operator<(const DeadLetterCause& other) const;
};

/// The dead letters of one cause.
struct IDEMKAFKA_API DeadLetterGroup {
    DeadLetterCause cause;           ///< what the records share
    std::string id;                  ///< cause.id()
    std::uint64_t count = 0;         ///< records of this cause
    std::int64_t first_seen_ms = -1; ///< the earliest dead-letter timestamp (-1: none known)
    std::int64_t last_seen_ms = -1;  ///< the latest
    /// Source topics and, for each, the partitions the records came from.
    std::map<std::string, std::set<std::int32_t>> sources;
    DeadLetterRecord sample; ///< the first record of the cause read
};

/// Groups dead letters by cause as they are read. Not thread-safe.
class IDEMKAFKA_API DeadLetterGrouping {
public:
    /// Counts `record` under its cause (keeps it as the sample of a new cause).
    void add(const DeadLetterRecord& record);
    /// The groups, most records first (ties: by cause).
    std::vector<DeadLetterGroup> groups() const;
    /// Records added.
    std::uint64_t total() const noexcept { return total_; }

private:
    std::map<DeadLetterCause, DeadLetterGroup> groups_;
    std::uint64_t total_ = 0;
};

/// Which dead letters an operation takes. Empty sets and unset fields take
/// every record; the fields that are set must all match.
struct IDEMKAFKA_API DeadLetterFilter {
    std::set<std::string> consumer_groups;   ///< idemkafka.consumer_group is one of these
    std::set<std::string> reasons;           ///< idemkafka.reason is one of these
    std::set<std::string> causes;            ///< DeadLetterCause::id() is one of these
    std::optional<std::int64_t> from_ms;     ///< dead-lettered at or after (Unix ms)
    std::optional<std::int64_t> to_ms;       ///< dead-lettered before (Unix ms)
    std::optional<std::string> source_topic; ///< idemkafka.original.topic is this
    std::optional<std::string> event_id;     ///< idemkafka.event_id is this (canonical text)
    /// Explicit records: (partition, offset) in the dead-letter topic.
    std::set<std::pair<std::int32_t, std::int64_t>> coordinates;

    /// Whether `record` passes every set field.
    bool matches(const DeadLetterRecord& record) const;
    /// The filter as a JSON object (what the replay audit stores).
    std::string to_json() const;
};

/// Where to read dead letters from.
struct IDEMKAFKA_API DeadLetterSource {
    std::string brokers;                      ///< Kafka bootstrap servers. Required.
    std::string topic;                        ///< the dead-letter topic. Required.
    std::map<std::string, std::string> kafka; ///< extra librdkafka properties (security, ...)
    std::chrono::milliseconds timeout{60000}; ///< the whole read's bound
};

/// Reads `source.topic` from the start of each partition to its end as of the
/// call (no consumer group joins, nothing is committed), calling `each` for
/// every record until it returns false. Returns how many records were read.
/// Throws ConfigError for a bad librdkafka property, KafkaError when Kafka
/// cannot be reached, the topic does not exist or the read does not end within
/// the timeout (naming the partitions left).
IDEMKAFKA_API std::uint64_t read_dead_letters(const DeadLetterSource& source,
                                              const std::function<bool(DeadLetterRecord&&)>& each);

/// The replay audit table (SchemaSpec::replay_audit_table).
struct IDEMKAFKA_API ReplayAuditTable {
    std::string schema = "public";            ///< its schema
    std::string table = "dead_letter_replay"; ///< its name
};

/// What to replay and how.
struct IDEMKAFKA_API ReplayRequest {
    DeadLetterSource source; ///< the dead-letter topic
    DeadLetterFilter filter; ///< which records
    /// When set, the topic the operator means to replay to: a matching record
    /// from any other topic refuses the whole replay (nothing is published).
    std::optional<std::string> target_topic;
    double rate_per_second = 0;         ///< records published per second at most; 0: no limit
    std::optional<std::uint64_t> limit; ///< at most this many records
    bool dry_run = false;               ///< plan only: nothing published, nothing recorded
    /// Replay records an earlier replay published (or began to) too; without it
    /// they are skipped, so that no record is replayed twice by accident.
    bool again = false;
    std::string requested_by; ///< who asked (a user name); required
    std::string tool;         ///< what asked (e.g. "idemkafka-admin dead-letters replay"); required
    ReplayAuditTable audit;   ///< where replays are recorded
    /// Replays of one dead-letter topic take turns while they record their
    /// plan: this is the longest one waits for another, and the longest its
    /// own plan's transaction may sit idle on the server (one stopped there,
    /// a frozen process or a paused VM, would keep every other replay out).
    /// Past it the replay fails with DatabaseError, nothing recorded.
    std::chrono::milliseconds lock_timeout{30000};
    /// Where the replay's log lines go (its start, end and each failed publish).
    /// Default: stderr, level info and above.
    LogSink log;
};

/// One record of a replay and what became of it.
struct IDEMKAFKA_API ReplayedRecord {
    std::int32_t partition = 0; ///< in the dead-letter topic
    std::int64_t offset = 0;    ///< in the dead-letter topic
    std::string target;         ///< the topic it goes (or went) to
    std::string reason;         ///< idemkafka.reason
    std::string event_id;       ///< idemkafka.event_id ("" when not decoded)
    /// "published", "failed", "pending" (recorded, outcome unknown: the replay
    /// stopped), "would_publish" (dry run), "replayed_before" (skipped: an
    /// earlier replay has it), "no_source" (skipped: no idemkafka.original.topic).
    std::string outcome;
    std::string error; ///< why it failed; empty otherwise
};

/// What a replay did (or, for a dry run, would do).
struct IDEMKAFKA_API ReplayReport {
    std::int64_t audit_id = 0;           ///< its row in the audit table; 0 for a dry run
    std::uint64_t read = 0;              ///< dead letters read
    std::uint64_t matched = 0;           ///< records the filter took
    std::uint64_t published = 0;         ///< records published
    std::uint64_t failed = 0;            ///< records whose publish failed
    std::uint64_t replayed_before = 0;   ///< records skipped: an earlier replay has them
    std::uint64_t no_source = 0;         ///< records skipped: no idemkafka.original.topic
    std::vector<ReplayedRecord> records; ///< every matched record, in topic order
};

/// Replays the dead letters `request` selects: each one's original key, value
/// and headers (without idemkafka.*) go to its idemkafka.original.topic with an
/// idempotent producer; the event id in the value is unchanged, so the claims
/// still protect an event already processed. The plan (every record to be
/// published, with who asked, the filter and the time) is committed to the
/// audit table before the first record is published, under a lock that
/// serialises replays of one dead-letter topic, and each publish's outcome is
/// written afterwards; records an earlier replay has are skipped unless
/// `request.again`. `progress` is called for each record as its outcome is known.
/// Throws ConfigError for a bad request (missing requested_by/tool, a target
/// topic a record did not come from, a negative rate), DatabaseError when the
/// audit table is missing (naming the migrate command) or PostgreSQL fails,
/// KafkaError as read_dead_letters() does.
IDEMKAFKA_API ReplayReport replay_dead_letters(pqxx::connection& conn, const ReplayRequest& request,
                                               const std::function<void(const ReplayedRecord&)>& progress = {});

/// One replay as the audit table keeps it.
struct IDEMKAFKA_API ReplayAuditEntry {
    std::int64_t id = 0;                     ///< the row's id (ReplayReport::audit_id)
    std::string dead_letter_topic;           ///< the topic replayed from
    std::string requested_by;                ///< ReplayRequest::requested_by
    std::string tool;                        ///< ReplayRequest::tool
    std::string filter_json;                 ///< DeadLetterFilter::to_json() of the request
    bool again = false;                      ///< ReplayRequest::again
    double rate_per_second = 0;              ///< ReplayRequest::rate_per_second
    std::int64_t started_ms = 0;             ///< Unix ms
    std::optional<std::int64_t> finished_ms; ///< nullopt while running (or if it stopped)
    std::uint64_t matched = 0;               ///< records the filter took
    std::uint64_t published = 0;             ///< records published
    std::uint64_t failed = 0;                ///< records whose publish failed
    std::uint64_t skipped = 0;               ///< replayed before or without a source topic
    std::string outcome;                     ///< "running", "done" (every publish succeeded) or "failed"
    std::string records_json; ///< the records: [{"partition","offset","target","event_id","outcome","error"}]
};

/// The latest `limit` replays of `dead_letter_topic` (every topic when empty),
/// newest first. Throws DatabaseError as replay_dead_letters() does.
IDEMKAFKA_API std::vector<ReplayAuditEntry> replay_audit(pqxx::connection& conn, const ReplayAuditTable& table,
                                                         const std::string& dead_letter_topic = {},
                                                         std::size_t limit = 50);

} // namespace idemkafka
