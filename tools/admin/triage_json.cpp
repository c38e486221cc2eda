#include "triage_json.hpp"

#include <idemkafka/dead_letter.hpp>

#include "cli.hpp"

namespace idemkafka::detail::admin {

nlohmann::json json_ms(std::int64_t unix_ms)
{
    if (unix_ms < 0)
        return nullptr;
    return format_time(std::chrono::system_clock::time_point(std::chrono::milliseconds(unix_ms)));
}

namespace {

nlohmann::json opt(const std::optional<std::string>& s)
{
    return s ? nlohmann::json(redactor()(*s)) : nlohmann::json(nullptr);
}

} // namespace

nlohmann::json record_json(const DeadLetterRecord& d, bool with_payload)
{
    auto h = [&](const char* name) { return opt(d.header(name)); };
    nlohmann::json j = {
        {"topic", d.topic},
        {"partition", d.partition},
        {"offset", d.offset},
        {"timestamp", d.timestamp_ms},
        {"dead_lettered_at", json_ms(d.timestamp_ms)},
        {"reason", h(dead_letter_header::reason)},
        {"error", h(dead_letter_header::error)},
        {"original",
         {{"topic", h(dead_letter_header::original_topic)},
          {"partition", h(dead_letter_header::original_partition)},
          {"offset", h(dead_letter_header::original_offset)},
          {"timestamp", h(dead_letter_header::original_timestamp)}}},
        {"event_id", h(dead_letter_header::event_id)},
        {"attempts", h(dead_letter_header::attempts)},
        {"consumer_group", h(dead_letter_header::consumer_group)},
        {"cause", DeadLetterCause::of(d).id()},
    };
    if (with_payload) {
        j["key"] = opt(d.key);
        j["value"] = opt(d.value);
        auto headers = nlohmann::json::array();
        for (const auto& hd : d.headers)
            headers.push_back({{"name", hd.name}, {"value", opt(hd.value)}});
        j["headers"] = headers;
    }
    return j;
}

nlohmann::json group_json(const DeadLetterGroup& g)
{
    auto sources = nlohmann::json::array();
    for (const auto& [topic, parts] : g.sources)
        sources.push_back({{"topic", topic}, {"partitions", parts}});
    return {{"id", g.id},
            {"consumer_group", g.cause.consumer_group},
            {"reason", g.cause.reason},
            {"error_pattern", redactor()(g.cause.error_pattern)},
            {"count", g.count},
            {"first_seen", json_ms(g.first_seen_ms)},
            {"last_seen", json_ms(g.last_seen_ms)},
            {"sources", sources},
            {"sample", record_json(g.sample, false)}};
}

nlohmann::json replay_report_json(const ReplayReport& r)
{
    auto records = nlohmann::json::array();
    for (const auto& x : r.records)
        records.push_back({{"partition", x.partition},
                           {"offset", x.offset},
                           {"target", x.target},
                           {"reason", x.reason},
                           {"event_id", x.event_id},
                           {"outcome", x.outcome},
                           {"error", redactor()(x.error)}});
    return {{"audit_id", r.audit_id},   {"read", r.read},     {"matched", r.matched},
            {"published", r.published}, {"failed", r.failed}, {"replayed_before", r.replayed_before},
            {"no_source", r.no_source}, {"records", records}};
}

nlohmann::json audit_json(const ReplayAuditEntry& e)
{
    return {{"id", e.id},
            {"dead_letter_topic", e.dead_letter_topic},
            {"requested_by", e.requested_by},
            {"tool", e.tool},
            {"filter", nlohmann::json::parse(e.filter_json, nullptr, false)},
            {"again", e.again},
            {"rate_per_second", e.rate_per_second},
            {"started_at", json_ms(e.started_ms)},
            {"finished_at", e.finished_ms ? json_ms(*e.finished_ms) : nlohmann::json(nullptr)},
            {"matched", e.matched},
            {"published", e.published},
            {"failed", e.failed},
            {"skipped", e.skipped},
            {"outcome", e.outcome},
            {"records", nlohmann::json::parse(e.records_json, nullptr, false)}};
}

std::string dump(const nlohmann::json& j, int indent)
{
    return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace idemkafka::detail::admin
