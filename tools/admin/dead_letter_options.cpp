#include "dead_letter_options.hpp"

#include <cstdlib>
#include <memory>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/event_id.hpp>
#include <idemkafka/store.hpp>

namespace idemkafka::detail::admin {
namespace {

std::int64_t unix_ms(std::chrono::system_clock::time_point t)
{
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// The replay options and the filter's less common ones.
bool replay_option(ArgReader& a, DeadLetterOptions& o)
{
    if (a.option("--dry-run"))
        o.dry_run = true;
    else if (a.option("--again"))
        o.again = true;
    else if (a.option("--rate"))
        o.rate = static_cast<double>(parse_count(a.value(), "--rate"));
    else if (a.option("--target-topic"))
        o.target_topic = a.value();
    else if (a.option("--requested-by"))
        o.requested_by = a.value();
    else if (a.option("--postgres"))
        o.postgres = a.value();
    else if (a.option("--schema"))
        o.audit.schema = a.value();
    else if (a.option("--replay-audit-table"))
        o.audit.table = a.value();
    else if (a.option("--from"))
        o.filter.from_ms = unix_ms(parse_time(a.value(), "--from"));
    else if (a.option("--to"))
        o.filter.to_ms = unix_ms(parse_time(a.value(), "--to"));
    else if (a.option("--at"))
        o.filter.coordinates.insert(parse_coordinates(a.value(), "--at"));
    else
        return false;
    return true;
}

void add_kafka_setting(DeadLetterOptions& o, const std::string& kv)
{
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
        throw UsageError("dead-letters: --kafka takes KEY=VALUE");
    redactor().add_setting(kv.substr(0, eq), kv.substr(eq + 1));
    // Checked here, so a misspelt property is a usage error before anything runs.
    std::unique_ptr<rd_kafka_conf_t, void (*)(rd_kafka_conf_t*)> conf(rd_kafka_conf_new(), rd_kafka_conf_destroy);
    char errstr[512];
    if (rd_kafka_conf_set(conf.get(), kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), errstr, sizeof errstr) !=
        RD_KAFKA_CONF_OK)
        throw UsageError(fmt::format("dead-letters: --kafka {}: {}", kv.substr(0, eq), errstr));
    o.source.kafka[kv.substr(0, eq)] = kv.substr(eq + 1);
}

std::string from_env(const char* name)
{
    const char* v = std::getenv(name);
    return v ? v : "";
}

} // namespace

std::pair<std::int32_t, std::int64_t> parse_coordinates(const std::string& text, std::string_view what)
{
    const auto at = text.find('@');
    if (at == std::string::npos || at == 0 || at + 1 == text.size())
        throw UsageError(fmt::format("{}: '{}' is not PARTITION@OFFSET", what, text));
    const auto p = parse_count(text.substr(0, at), what);
    const auto off = parse_count(text.substr(at + 1), what);
    if (p > 2147483647)
        throw UsageError(fmt::format("{}: partition {} is out of range", what, p));
    return {static_cast<std::int32_t>(p), static_cast<std::int64_t>(off)};
}

bool dead_letter_option(ArgReader& a, DeadLetterOptions& o)
{
    if (a.option("--brokers"))
        o.source.brokers = a.value();
    else if (a.option("--topic"))
        o.source.topic = a.value();
    else if (a.option("--reason")) {
        const std::string r = a.value();
        if (!parse_dead_letter_reason(r))
            throw UsageError(fmt::format("dead-letters: --reason: '{}' is not a dead-letter reason", r));
        o.filter.reasons.insert(r);
    } else if (a.option("--group"))
        o.filter.consumer_groups.insert(a.value());
    else if (a.option("--cause"))
        o.filter.causes.insert(a.value());
    else if (a.option("--original-topic"))
        o.filter.source_topic = a.value();
    else if (a.option("--event-id")) {
        EventId id;
        const std::string text = a.value();
        if (!EventId::try_parse(text, id))
            throw UsageError(fmt::format("dead-letters: --event-id: '{}' is not a UUID", text));
        o.filter.event_id = id.to_string();
    } else if (a.option("--limit"))
        o.limit = parse_count(a.value(), "--limit");
    else if (a.option("--kafka"))
        add_kafka_setting(o, a.value());
    else if (a.option("--timeout"))
        o.source.timeout = parse_duration(a.value(), "--timeout");
    else if (a.option("--json"))
        o.json = true;
    else
        return replay_option(a, o);
    return true;
}

void check_dead_letter_options(DeadLetterOptions& o, const std::string& action)
{
    if (o.source.brokers.empty())
        o.source.brokers = from_env("IDEMKAFKA_BROKERS");
    if (o.source.brokers.empty())
        throw UsageError("dead-letters: no Kafka: pass --brokers SERVERS or set IDEMKAFKA_BROKERS");
    if (o.source.topic.empty())
        throw UsageError("dead-letters: --topic NAME (the dead-letter topic) is required");
    if (o.limit && *o.limit == 0)
        throw UsageError("dead-letters: --limit must be at least 1");
    if (o.source.timeout.count() <= 0)
        throw UsageError("dead-letters: --timeout must be positive");
    const bool replays = action == "replay" || action == "serve";
    if (!replays && (o.dry_run || o.again || o.rate > 0 || o.target_topic || !o.requested_by.empty()))
        throw UsageError("dead-letters: --dry-run, --again, --rate, --target-topic and --requested-by belong to "
                         "replay");
    if (o.filter.from_ms && o.filter.to_ms && *o.filter.from_ms >= *o.filter.to_ms)
        throw UsageError("dead-letters: --from must be before --to");
    if (!replays)
        return;
    if (o.postgres.empty())
        o.postgres = from_env("IDEMKAFKA_POSTGRES");
    if (o.postgres.empty())
        throw UsageError(fmt::format("{}: no database for the replay audit: pass --postgres CONNINFO or set "
                                     "IDEMKAFKA_POSTGRES",
                                     action == "serve" ? "serve" : "dead-letters"));
    redactor().add_conninfo(o.postgres);
    if (o.requested_by.empty())
        o.requested_by = from_env("USER");
    if (o.requested_by.empty())
        o.requested_by = "unknown";
    try {
        (void)audit_name_of(o.audit);
    } catch (const std::exception& e) {
        throw UsageError(fmt::format("dead-letters: replay audit table: {}", e.what()));
    }
}

std::string audit_name_of(const ReplayAuditTable& t)
{
    return quote_identifier(t.schema) + "." + quote_identifier(t.table);
}

std::string DeadLetterOptions::audit_name() const
{
    return audit_name_of(audit);
}

ReplayRequest DeadLetterOptions::replay_request(const std::string& tool) const
{
    ReplayRequest r;
    r.source = source;
    r.filter = filter;
    r.target_topic = target_topic;
    r.rate_per_second = rate;
    r.limit = limit;
    r.dry_run = dry_run;
    r.again = again;
    r.requested_by = requested_by;
    r.tool = tool;
    r.audit = audit;
    return r;
}

} // namespace idemkafka::detail::admin
