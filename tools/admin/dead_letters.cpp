// dead-letters: list dead-letter records, group them by cause, and replay them
// to their source topic with an audit trail (the library's dead-letter triage:
// idemkafka/dead_letter_triage.hpp).

#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/dead_letter_triage.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "dead_letter_options.hpp"
#include "pg/connect.hpp"
#include "triage_json.hpp"

namespace idemkafka::detail::admin {
namespace {

constexpr const char* help_text = R"(usage: idemkafka-admin dead-letters list [options]
       idemkafka-admin dead-letters groups [options]
       idemkafka-admin dead-letters replay [options]

Reads a dead-letter topic from its beginning to its current end (no consumer group, nothing is
committed). `list` prints the records; `groups` counts them by cause: consumer group, reason and the
error with numbers, ids and quoted values masked (each cause has an id, for --cause); `replay`
publishes each matching record's original key, value and headers (without the idemkafka.* headers)
to the topic it came from (idemkafka.original.topic) with an idempotent producer, and records the
replay in PostgreSQL (`idemkafka-admin migrate --replay-audit` creates the table): who asked, the
filter, every record and the outcome of its publish. A record an earlier replay published is
skipped unless --again. A replayed event keeps its event id, so a consumer that has already
processed it skips it as a duplicate. Records dead-lettered as beyond_dedup_horizon are
dead-lettered again on replay unless the consumer's policy changed, and event_id_reused ones as
long as the claim of their id (with the other payload's fingerprint) is kept.

  --brokers SERVERS          Kafka bootstrap servers (default: $IDEMKAFKA_BROKERS)
  --topic NAME               the dead-letter topic (required)
filters (repeatable ones take any of their values; all given must match):
  --reason REASON            idemkafka.reason; repeatable (decode_error, empty_payload,
                             payload_too_large, missing_event_id, invalid_event_id, handler_failed,
                             non_retryable, beyond_dedup_horizon, non_v7_event_id, event_id_reused)
  --group NAME               idemkafka.consumer_group; repeatable
  --cause ID                 the cause id `groups` prints; repeatable
  --original-topic NAME      records that came from this topic
  --event-id UUID            records of this event id
  --from TIME, --to TIME     dead-lettered in [from, to) (YYYY-MM-DD, YYYY-MM-DDTHH:MM:SSZ, @<unix ms>)
  --at PARTITION@OFFSET      this record of the dead-letter topic; repeatable
  --limit N                  stop after N matching records
other options:
  --kafka KEY=VALUE          librdkafka property for the consumer and the producer (security.protocol,
                             sasl.*, ssl.*, ...); repeatable. Secret values are never printed.
  --timeout DURATION         give up reading after this long (default 60s)
  --json                     (list, groups, replay) JSON instead of lines
  --dry-run                  (replay) show what would be replayed, publish and record nothing
  --rate N                   (replay) publish at most N records per second (default: no limit)
  --again                    (replay) also records an earlier replay published
  --target-topic NAME        (replay) refuse the replay unless every record came from NAME
  --requested-by NAME        (replay) who asks, for the audit (default: $USER)
  --postgres CONNINFO        (replay) the database of the audit (default: $IDEMKAFKA_POSTGRES)
  --schema NAME              (replay) schema of the audit table (default public)
  --replay-audit-table NAME  (replay) the audit table (default dead_letter_replay)
  --help                     this text

The replayed record's partition is chosen by the producer's partitioner from its key; pass
--kafka partitioner=murmur2_random to match producers that use the Java client's default.
)";

std::string label(const DeadLetterOptions& o, const ReplayedRecord& r)
{
    return fmt::format("{}/{}@{} (reason {}, event {})", o.source.topic, r.partition, r.offset,
                       r.reason.empty() ? "?" : r.reason, r.event_id.empty() ? "-" : r.event_id);
}

std::string describe(const DeadLetterRecord& d)
{
    auto h = [&](const char* name) { return d.header(name).value_or("?"); };
    std::string error = d.error();
    if (error.size() > 200)
        error = error.substr(0, 200) + "...";
    return fmt::format("{}/{}@{}  reason={}  from={}/{}@{}  event={}  attempts={}  group={}  error={}", d.topic,
                       d.partition, d.offset, h(dead_letter_header::reason), h(dead_letter_header::original_topic),
                       h(dead_letter_header::original_partition), h(dead_letter_header::original_offset),
                       d.header(dead_letter_header::event_id).value_or("-"), h(dead_letter_header::attempts),
                       h(dead_letter_header::consumer_group), error);
}

int list(const DeadLetterOptions& o)
{
    std::uint64_t matched = 0;
    auto records = nlohmann::json::array();
    const auto read = read_dead_letters(o.source, [&](DeadLetterRecord&& d) {
        if (!o.filter.matches(d))
            return true;
        ++matched;
        if (o.json)
            records.push_back(record_json(d, true));
        else
            out(describe(d));
        return !o.limit || matched < *o.limit;
    });
    if (o.json)
        out(dump({{"topic", o.source.topic}, {"read", read}, {"matched", matched}, {"records", records}}));
    else
        out(fmt::format("{} dead-letter record(s) read from {}, {} matching", read, o.source.topic, matched));
    return exit_ok;
}

std::string sources_text(const DeadLetterGroup& g)
{
    std::string s;
    for (const auto& [topic, parts] : g.sources)
        s += fmt::format("{}{}[{}]", s.empty() ? "" : " ", topic, fmt::join(parts, ","));
    return s.empty() ? "-" : s;
}

int groups(const DeadLetterOptions& o)
{
    DeadLetterGrouping grouping;
    const auto read = read_dead_letters(o.source, [&](DeadLetterRecord&& d) {
        if (o.filter.matches(d))
            grouping.add(d);
        return !o.limit || grouping.total() < *o.limit;
    });
    const auto gs = grouping.groups();
    if (o.json) {
        auto arr = nlohmann::json::array();
        for (const auto& g : gs)
            arr.push_back(group_json(g));
        out(dump({{"topic", o.source.topic}, {"read", read}, {"matched", grouping.total()}, {"groups", arr}}));
        return exit_ok;
    }
    out(fmt::format("{:>8}  {:<16}  {:<20}  {:<20}  {:<20}  {:<20}  {}", "count", "cause", "group", "reason",
                    "first seen", "last seen", "sources / error"));
    for (const auto& g : gs) {
        out(fmt::format("{:>8}  {:<16}  {:<20}  {:<20}  {:<20}  {:<20}  {}", g.count, g.id, g.cause.consumer_group,
                        g.cause.reason, json_ms(g.first_seen_ms).dump(), json_ms(g.last_seen_ms).dump(),
                        sources_text(g)));
        out(fmt::format("{:>8}  {}", "", g.cause.error_pattern));
    }
    out(fmt::format("{} dead-letter record(s) read from {}, {} matching, {} cause(s)", read, o.source.topic,
                    grouping.total(), gs.size()));
    return exit_ok;
}

void print_plan(const DeadLetterOptions& o, const ReplayReport& r)
{
    for (const auto& x : r.records) {
        if (x.outcome == "would_publish")
            out(fmt::format("would replay {} -> {}", label(o, x), x.target));
        else if (x.outcome == "no_source")
            err(fmt::format("idemkafka-admin: warning: skipping {}: no {} header", label(o, x),
                            dead_letter_header::original_topic));
        else if (x.outcome == "replayed_before")
            err(fmt::format("idemkafka-admin: warning: skipping {}: replayed before (see the audit; --again "
                            "replays it again)",
                            label(o, x)));
    }
}

int replay(const DeadLetterOptions& o)
{
    const auto conn = pg::connect(o.postgres);
    ReplayRequest req = o.replay_request("idemkafka-admin dead-letters replay");
    req.log = [](LogLevel level, std::string_view line) {
        if (level >= LogLevel::warning)
            err(fmt::format("idemkafka-admin: {}", line));
    };
    const auto report = replay_dead_letters(*conn, req, [&](const ReplayedRecord& x) {
        if (o.json)
            return;
        if (x.outcome == "published")
            out(fmt::format("replayed {} -> {}", label(o, x), x.target));
        else
            err(fmt::format("idemkafka-admin: error: replaying {} -> {} failed: {}", label(o, x), x.target, x.error));
    });
    if (o.json) {
        out(dump(replay_report_json(report)));
        return report.failed ? exit_failure : exit_ok;
    }
    const auto skipped = report.no_source + report.replayed_before;
    if (o.dry_run) {
        print_plan(o, report);
        out(fmt::format("dry run: {} record(s) read from {}, {} matching, {} would be replayed, {} skipped",
                        report.read, o.source.topic, report.matched, report.matched - skipped, skipped));
        return exit_ok;
    }
    print_plan(o, report);
    out(fmt::format("{} record(s) read from {}, {} matching, {} replayed, {} skipped, {} failed (replay {} in {})",
                    report.read, o.source.topic, report.matched, report.published, skipped, report.failed,
                    report.audit_id, o.audit_name()));
    return report.failed ? exit_failure : exit_ok;
}

} // namespace

int run_dead_letters(std::vector<std::string> args)
{
    ArgReader a("dead-letters", std::move(args));
    const auto action = a.word();
    DeadLetterOptions o;
    bool help = false;
    while (a.more()) {
        if (dead_letter_option(a, o))
            continue;
        if (a.option("--help") || a.option("-h"))
            help = true;
        else
            a.unknown();
    }
    if (help || action == std::string("help")) {
        out(help_text);
        return exit_ok;
    }
    if (!action)
        throw UsageError("dead-letters: say `list`, `groups` or `replay`");
    if (*action != "list" && *action != "replay" && *action != "groups")
        throw UsageError(fmt::format("dead-letters: unknown action '{}' (list, groups or replay)", *action));
    check_dead_letter_options(o, *action);
    if (*action == "list")
        return list(o);
    if (*action == "groups")
        return groups(o);
    return replay(o);
}

} // namespace idemkafka::detail::admin
