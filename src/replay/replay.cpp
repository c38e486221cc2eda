// replay_dead_letters() and replay_audit(): replaying dead letters to their
// source topics with a plan committed to the audit table before the first
// publish, so that a record is never replayed twice by accident.
//
// The order: read and filter the dead-letter topic; refuse a target topic a
// record did not come from; under a transaction-level advisory lock per
// dead-letter topic, read what earlier replays published (or began to), skip
// those, and insert the plan (every record "pending") and commit; publish at
// the rate asked for, writing the outcomes after each chunk; finish the row.
// A replay that stops half-way leaves its unsent records "pending": they count
// as replayed (a later replay needs `again` for them), since whether they
// reached Kafka is unknown.

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "idemkafka/dead_letter.hpp"
#include "idemkafka/dead_letter_triage.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/publisher.hpp"
#include "idemkafka/store.hpp"
#include "observe/log_context.hpp"
#include "pg/bounds.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka {
namespace {

using Coordinates = std::set<std::pair<std::int32_t, std::int64_t>>;

std::string audit_name(const ReplayAuditTable& t)
{
    return quote_identifier(t.schema) + "." + quote_identifier(t.table);
}

void check_request(const ReplayRequest& r)
{
    if (r.requested_by.empty())
        throw ConfigError("replay: requested_by (who asks for the replay) is required");
    if (r.tool.empty())
        throw ConfigError("replay: tool (what asks for the replay) is required");
    if (!(r.rate_per_second >= 0) || std::isinf(r.rate_per_second))
        throw ConfigError(
            fmt::format("replay: rate_per_second must be 0 (no limit) or positive, not {}", r.rate_per_second));
    if (r.limit && *r.limit == 0)
        throw ConfigError("replay: limit must be at least 1");
    if (r.lock_timeout.count() <= 0)
        throw ConfigError("replay: lock_timeout must be positive");
    (void)audit_name(r.audit);
}

// The audit table must exist: the error says how to create it.
void require_audit_table(pqxx::transaction_base& tx, const ReplayAuditTable& t)
{
    if (!detail::pg::relation_exists(tx, audit_name(t)))
        throw DatabaseError(fmt::format("the replay audit table {} does not exist: create it with `idemkafka-admin "
                                        "migrate --replay-audit{}{}`",
                                        audit_name(t), t.schema != "public" ? " --schema " + t.schema : "",
                                        t.table != "dead_letter_replay" ? " --replay-audit-table " + t.table : ""));
}

ReplayedRecord planned(const DeadLetterRecord& d)
{
    ReplayedRecord r;
    r.partition = d.partition;
    r.offset = d.offset;
    r.target = d.original_topic();
    r.reason = d.reason();
    r.event_id = d.header(dead_letter_header::event_id).value_or("");
    r.outcome = r.target.empty() ? "no_source" : "would_publish";
    return r;
}

// Every matching record, in topic order, with its plan.
std::vector<DeadLetterRecord> select(const ReplayRequest& req, ReplayReport& report)
{
    std::vector<DeadLetterRecord> chosen;
    report.read = read_dead_letters(req.source, [&](DeadLetterRecord&& d) {
        if (!req.filter.matches(d))
            return true;
        chosen.push_back(std::move(d));
        return !req.limit || chosen.size() < *req.limit;
    });
    std::stable_sort(chosen.begin(), chosen.end(), [](const DeadLetterRecord& a, const DeadLetterRecord& b) {
        return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
    });
    report.matched = chosen.size();
    for (const auto& d : chosen)
        report.records.push_back(planned(d));
    return chosen;
}

void refuse_other_targets(const ReplayRequest& req, const ReplayReport& report)
{
    if (!req.target_topic)
        return;
    std::size_t others = 0;
    const ReplayedRecord* first = nullptr;
    for (const auto& r : report.records)
        if (!r.target.empty() && r.target != *req.target_topic && ++others == 1)
            first = &r;
    if (others)
        throw ConfigError(fmt::format("replay refused: {} matching record(s) did not come from {} (the first: {}/{}@{} "
                                      "came from {}); a record is replayed only to its own source topic",
                                      others, *req.target_topic, req.source.topic, first->partition, first->offset,
                                      first->target));
}

// Records of the topic an earlier replay published or began to publish.
Coordinates replayed_before(pqxx::transaction_base& tx, const ReplayRequest& req)
{
    Coordinates out;
    const auto rows = detail::pg::exec_params(
        tx,
        fmt::format("SELECT (r->>'partition')::int, (r->>'offset')::bigint FROM {} a, jsonb_array_elements(a.records) "
                    "r WHERE a.dead_letter_topic = $1 AND r->>'outcome' IN ('published', 'pending')",
                    audit_name(req.audit)),
        req.source.topic);
    for (const auto& row : rows)
        out.insert({row[0].as<std::int32_t>(), row[1].as<std::int64_t>()});
    return out;
}

nlohmann::json records_json(const std::vector<ReplayedRecord>& records)
{
    auto j = nlohmann::json::array();
    for (const auto& r : records)
        j.push_back({{"partition", r.partition},
                     {"offset", r.offset},
                     {"target", r.target},
                     {"reason", r.reason},
                     {"event_id", r.event_id},
                     {"outcome", r.outcome},
                     {"error", r.error}});
    return j;
}

std::string dump(const nlohmann::json& j)
{
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void count_outcomes(ReplayReport& report)
{
    report.published = report.failed = report.replayed_before = report.no_source = 0;
    for (const auto& r : report.records) {
        report.published += r.outcome == "published";
        report.failed += r.outcome == "failed";
        report.replayed_before += r.outcome == "replayed_before";
        report.no_source += r.outcome == "no_source";
    }
}

// Skips what earlier replays have; the rest becomes "pending" (or stays
// "would_publish" in a dry run). Commits the plan unless it is a dry run.
void plan(pqxx::connection& conn, const ReplayRequest& req, ReplayReport& report)
{
    pqxx::work tx(conn);
    // Replays of a topic take turns here; one stopped inside this transaction
    // (a frozen process) loses its session past lock_timeout idle.
    tx.exec(detail::pg::bound_transaction(req.lock_timeout));
    require_audit_table(tx, req.audit);
    try {
        detail::pg::exec_params(tx, "SELECT pg_advisory_xact_lock(hashtext('idemkafka.replay:' || $1))",
                                req.source.topic);
    } catch (const pqxx::sql_error& e) {
        if (!detail::pg::is_lock_timeout(e))
            throw;
        throw DatabaseError(fmt::format("replay of {}: another replay of {} held its lock for longer than "
                                        "lock_timeout ({} ms) while recording its plan; nothing was recorded or "
                                        "published: run it again once that one is done",
                                        req.source.topic, req.source.topic, req.lock_timeout.count()));
    }
    const Coordinates before = req.again ? Coordinates{} : replayed_before(tx, req);
    for (auto& r : report.records)
        if (r.outcome == "would_publish" && before.count({r.partition, r.offset}))
            r.outcome = "replayed_before";
        else if (r.outcome == "would_publish" && !req.dry_run)
            r.outcome = "pending";
    count_outcomes(report);
    if (req.dry_run)
        return;
    const auto row = detail::pg::exec_params(
        tx,
        fmt::format("INSERT INTO {} (dead_letter_topic, requested_by, tool, filter, again, rate_per_second, matched, "
                    "skipped, records) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9::jsonb) RETURNING id",
                    audit_name(req.audit)),
        req.source.topic, req.requested_by, req.tool, req.filter.to_json(), req.again, req.rate_per_second,
        static_cast<std::int64_t>(report.matched), static_cast<std::int64_t>(report.replayed_before + report.no_source),
        dump(records_json(report.records)));
    report.audit_id = row[0][0].as<std::int64_t>();
    tx.commit();
}

void write_outcomes(pqxx::connection& conn, const ReplayRequest& req, const ReplayReport& report, bool finished)
{
    pqxx::work tx(conn);
    const char* outcome = !finished ? "running" : report.failed ? "failed" : "done";
    detail::pg::exec_params(tx,
                            fmt::format("UPDATE {} SET records = $2::jsonb, published = $3, failed = $4, outcome = $5, "
                                        "finished_at = CASE WHEN $6 THEN now() END WHERE id = $1",
                                        audit_name(req.audit)),
                            report.audit_id, dump(records_json(report.records)),
                            static_cast<std::int64_t>(report.published), static_cast<std::int64_t>(report.failed),
                            std::string(outcome), finished);
    tx.commit();
}

OutgoingRecord outgoing(const DeadLetterRecord& d)
{
    OutgoingRecord r;
    r.topic = d.original_topic();
    r.key = d.key;
    r.value = d.value;
    for (const auto& h : d.headers)
        if (h.name.rfind(dead_letter_header::prefix, 0) != 0)
            r.headers.push_back(h);
    return r;
}

// How many records go to the producer at once: a fifth of a second's worth
// under a rate limit, so that the pacing stays smooth.
std::size_t chunk_size(double rate)
{
    if (rate <= 0)
        return 500;
    return static_cast<std::size_t>(std::clamp(rate / 5, 1.0, 500.0));
}

struct Sender {
    const ReplayRequest& req;
    const std::function<void(const ReplayedRecord&)>& progress;
    Publisher& publisher;

    void send(const std::vector<const DeadLetterRecord*>& chunk, std::vector<ReplayedRecord*>& slots)
    {
        std::vector<OutgoingRecord> batch;
        batch.reserve(chunk.size());
        for (const auto* d : chunk)
            batch.push_back(outgoing(*d));
        const auto errors = publisher.publish_all(batch);
        for (std::size_t i = 0; i < slots.size(); ++i) {
            slots[i]->outcome = errors[i].empty() ? "published" : "failed";
            slots[i]->error = errors[i];
            if (!errors[i].empty())
                detail::emit(req.log, LogLevel::error,
                             fmt::format("replaying {}/{}@{} to {} failed: {}", req.source.topic, slots[i]->partition,
                                         slots[i]->offset, slots[i]->target, errors[i]),
                             "replay");
            if (progress)
                progress(*slots[i]);
        }
    }
};

void publish(pqxx::connection& conn, const ReplayRequest& req, const std::vector<DeadLetterRecord>& chosen,
             ReplayReport& report, const std::function<void(const ReplayedRecord&)>& progress)
{
    std::unique_ptr<Publisher> publisher;
    try {
        publisher = std::make_unique<Publisher>(PublisherConfig{req.source.brokers, req.source.kafka, req.log});
    } catch (const Error& e) {
        // Nothing was sent: every planned record failed, and the row says why.
        for (auto& r : report.records)
            if (r.outcome == "pending") {
                r.outcome = "failed";
                r.error = fmt::format("no producer: {}", e.what());
            }
        count_outcomes(report);
        write_outcomes(conn, req, report, true);
        throw;
    }
    Sender sender{req, progress, *publisher};
    const std::size_t chunk = chunk_size(req.rate_per_second);
    const auto start = std::chrono::steady_clock::now();
    std::size_t sent = 0;
    std::vector<const DeadLetterRecord*> records;
    std::vector<ReplayedRecord*> slots;
    auto flush = [&] {
        if (records.empty())
            return;
        // The rate limit: this chunk starts no earlier than `sent` records' worth of time.
        if (req.rate_per_second > 0)
            std::this_thread::sleep_until(
                start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(static_cast<double>(sent) / req.rate_per_second)));
        sender.send(records, slots);
        sent += records.size();
        records.clear();
        slots.clear();
        count_outcomes(report);
        write_outcomes(conn, req, report, false);
    };
    for (std::size_t i = 0; i < chosen.size(); ++i) {
        if (report.records[i].outcome != "pending")
            continue;
        records.push_back(&chosen[i]);
        slots.push_back(&report.records[i]);
        if (records.size() >= chunk)
            flush();
    }
    flush();
}

} // namespace

ReplayReport replay_dead_letters(pqxx::connection& conn, const ReplayRequest& request,
                                 const std::function<void(const ReplayedRecord&)>& progress)
{
    check_request(request);
    ReplayRequest req = request;
    if (!req.log)
        req.log = stderr_sink();
    ReplayReport report;
    const std::vector<DeadLetterRecord> chosen = select(req, report);
    refuse_other_targets(req, report);
    try {
        plan(conn, req, report);
        if (req.dry_run)
            return report;
        detail::emit(req.log, LogLevel::info,
                     fmt::format("replay {} of {} by {} ({}): {} to publish, {} replayed before, {} without source",
                                 report.audit_id, req.source.topic, req.requested_by, req.tool,
                                 report.matched - report.replayed_before - report.no_source, report.replayed_before,
                                 report.no_source),
                     "replay");
        publish(conn, req, chosen, report, progress);
        count_outcomes(report);
        write_outcomes(conn, req, report, true);
    } catch (const Error&) {
        throw;
    } catch (const pqxx::failure& e) {
        throw DatabaseError(fmt::format("replay of {}: PostgreSQL failed: {}", req.source.topic, e.what()));
    }
    detail::emit(req.log, report.failed ? LogLevel::error : LogLevel::info,
                 fmt::format("replay {} of {}: {} published, {} failed", report.audit_id, req.source.topic,
                             report.published, report.failed),
                 "replay");
    return report;
}

std::vector<ReplayAuditEntry> replay_audit(pqxx::connection& conn, const ReplayAuditTable& table,
                                           const std::string& topic, std::size_t limit)
{
    try {
        pqxx::read_transaction tx(conn);
        require_audit_table(tx, table);
        const auto rows = detail::pg::exec_params(
            tx,
            fmt::format("SELECT id, dead_letter_topic, requested_by, tool, filter::text, again, rate_per_second, "
                        "(extract(epoch FROM started_at) * 1000)::bigint, (extract(epoch FROM finished_at) * "
                        "1000)::bigint, matched, published, failed, skipped, outcome, records::text FROM {} "
                        "WHERE $1 = '' OR dead_letter_topic = $1 ORDER BY id DESC LIMIT $2",
                        audit_name(table)),
            topic, static_cast<std::int64_t>(limit));
        std::vector<ReplayAuditEntry> out;
        for (const auto& row : rows) {
            ReplayAuditEntry e;
            e.id = row[0].as<std::int64_t>();
            e.dead_letter_topic = row[1].as<std::string>();
            e.requested_by = row[2].as<std::string>();
            e.tool = row[3].as<std::string>();
            e.filter_json = row[4].as<std::string>();
            e.again = row[5].as<bool>();
            e.rate_per_second = row[6].as<double>();
            e.started_ms = row[7].as<std::int64_t>();
            if (!row[8].is_null())
                e.finished_ms = row[8].as<std::int64_t>();
            e.matched = row[9].as<std::uint64_t>();
            e.published = row[10].as<std::uint64_t>();
            e.failed = row[11].as<std::uint64_t>();
            e.skipped = row[12].as<std::uint64_t>();
            e.outcome = row[13].as<std::string>();
            e.records_json = row[14].as<std::string>();
            out.push_back(std::move(e));
        }
        return out;
    } catch (const Error&) {
        throw;
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("reading the replay audit {}: {}", audit_name(table), e.what()));
    }
}

} // namespace idemkafka
