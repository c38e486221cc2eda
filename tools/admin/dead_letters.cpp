// dead-letters: list dead-letter records and replay them to their source topic.

#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>
#include <idemkafka/publisher.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "kafka/record_of.hpp"

namespace idemkafka::detail::admin {
namespace {

constexpr const char* help_text = R"(usage: idemkafka-admin dead-letters list [options]
       idemkafka-admin dead-letters replay [options]

Reads a dead-letter topic from its beginning to its current end (no consumer group, nothing is
committed). `list` prints the records; `replay` publishes each matching record's original key,
value and headers (without the idemkafka.* headers) to the topic it came from
(idemkafka.original.topic) with an idempotent producer. A replayed event keeps its event id, so
a consumer that has already processed it skips it as a duplicate. Records dead-lettered as
beyond_dedup_horizon are dead-lettered again on replay unless the consumer's policy changed, and
event_id_reused ones as long as the claim of their id (with the other payload's fingerprint) is kept.

  --brokers SERVERS          Kafka bootstrap servers (default: $IDEMKAFKA_BROKERS)
  --topic NAME               the dead-letter topic (required)
  --reason REASON            only records with this idemkafka.reason; repeatable
                             (decode_error, empty_payload, payload_too_large, missing_event_id,
                             invalid_event_id, handler_failed, non_retryable, beyond_dedup_horizon,
                             non_v7_event_id, event_id_reused)
  --original-topic NAME      only records that came from this topic
  --event-id UUID            only records of this event id
  --limit N                  stop after N matching records
  --kafka KEY=VALUE          librdkafka property for the consumer and the producer (security.protocol,
                             sasl.*, ssl.*, ...); repeatable. Secret values are never printed.
  --timeout DURATION         give up reading after this long (default 60s)
  --json                     (list) one JSON object with the records
  --dry-run                  (replay) show what would be replayed, publish nothing
  --help                     this text

The replayed record's partition is chosen by the producer's partitioner from its key; pass
--kafka partitioner=murmur2_random to match producers that use the Java client's default.
)";

struct KafkaDeleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
    void operator()(rd_kafka_conf_t* p) const noexcept { rd_kafka_conf_destroy(p); }
    void operator()(rd_kafka_message_t* p) const noexcept { rd_kafka_message_destroy(p); }
    void operator()(rd_kafka_topic_partition_list_t* p) const noexcept { rd_kafka_topic_partition_list_destroy(p); }
    void operator()(const rd_kafka_metadata_t* p) const noexcept { rd_kafka_metadata_destroy(p); }
};
template <class T> using Owned = std::unique_ptr<T, KafkaDeleter>;

struct Options {
    std::string brokers;
    std::string topic;
    std::set<std::string> reasons;
    std::optional<std::string> original_topic;
    std::optional<EventId> event_id;
    std::optional<std::uint64_t> limit;
    std::map<std::string, std::string> kafka;
    std::chrono::milliseconds timeout{60000};
    bool json = false;
    bool dry_run = false;
};

struct DeadLetter {
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    std::int64_t timestamp_ms = -1;
    std::optional<std::string> key, value;
    std::vector<Header> headers;

    std::optional<std::string> header(std::string_view name) const
    {
        for (const auto& h : headers)
            if (h.name == name)
                return h.value ? *h.value : std::string();
        return std::nullopt;
    }
};

bool matches(const Options& o, const DeadLetter& d)
{
    if (!o.reasons.empty() && !o.reasons.count(d.header(dead_letter_header::reason).value_or("")))
        return false;
    if (o.original_topic && d.header(dead_letter_header::original_topic) != *o.original_topic)
        return false;
    if (o.event_id) {
        EventId id;
        const auto text = d.header(dead_letter_header::event_id);
        if (!text || !EventId::try_parse(*text, id) || id != *o.event_id)
            return false;
    }
    return true;
}

// A consumer that joins no group: partitions are assigned by hand and
// offsets never stored.
Owned<rd_kafka_t> topic_reader(const Options& o)
{
    char errstr[512];
    Owned<rd_kafka_conf_t> conf(rd_kafka_conf_new());
    auto set = [&](const std::string& k, const std::string& v, bool from_user) {
        if (rd_kafka_conf_set(conf.get(), k.c_str(), v.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            if (from_user)
                throw UsageError(fmt::format("dead-letters: --kafka {}: {}", k, errstr));
            throw KafkaError(fmt::format("setting {}: {}", k, errstr));
        }
    };
    set("bootstrap.servers", o.brokers, false);
    // A group id is required by the consumer API, but nothing joins or commits.
    set("group.id", "idemkafka-admin", false);
    set("enable.auto.commit", "false", false);
    set("enable.auto.offset.store", "false", false);
    set("enable.partition.eof", "true", false);
    set("log_level", "3", false);
    // librdkafka's own lines go through the redaction like everything printed.
    rd_kafka_conf_set_log_cb(conf.get(), [](const rd_kafka_t*, int, const char* fac, const char* buf) {
        err(fmt::format("idemkafka-admin: kafka: {}: {}", fac, buf));
    });
    for (const auto& [k, v] : o.kafka)
        set(k, v, true);
    Owned<rd_kafka_t> rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr));
    if (!rk)
        throw KafkaError(fmt::format("cannot create Kafka consumer: {}", errstr));
    (void)conf.release(); // rd_kafka_new() took it
    rd_kafka_poll_set_consumer(rk.get());
    return rk;
}

// Assigns every non-empty partition of `o.topic` from its low watermark;
// returns each one's high watermark as of now (where reading stops).
std::map<std::int32_t, std::int64_t> assign_whole_topic(rd_kafka_t* rk, const Options& o)
{
    const int meta_timeout = static_cast<int>(std::min<std::int64_t>(o.timeout.count(), 30000));
    // Metadata of all topics, not of this one: a request naming a topic lets a broker
    // with auto.create.topics.enable create it, and a typo would become a topic.
    const rd_kafka_metadata_t* md_raw = nullptr;
    const auto merr = rd_kafka_metadata(rk, 1, nullptr, &md_raw, meta_timeout);
    Owned<const rd_kafka_metadata_t> md(md_raw);
    if (merr != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("cannot reach Kafka at {}: {}", o.brokers, rd_kafka_err2str(merr)));
    const rd_kafka_metadata_topic_t* topic = nullptr;
    for (int i = 0; i < md->topic_cnt; ++i)
        if (o.topic == md->topics[i].topic)
            topic = &md->topics[i];
    if (!topic || topic->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        throw KafkaError(fmt::format("dead-letter topic {} does not exist", o.topic));
    if (topic->err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("topic {}: {}", o.topic, rd_kafka_err2str(topic->err)));

    Owned<rd_kafka_topic_partition_list_t> assignment(rd_kafka_topic_partition_list_new(topic->partition_cnt));
    std::map<std::int32_t, std::int64_t> end;
    for (int i = 0; i < topic->partition_cnt; ++i) {
        const std::int32_t p = topic->partitions[i].id;
        std::int64_t lo = 0, hi = 0;
        const auto werr = rd_kafka_query_watermark_offsets(rk, o.topic.c_str(), p, &lo, &hi, meta_timeout);
        if (werr != RD_KAFKA_RESP_ERR_NO_ERROR)
            throw KafkaError(fmt::format("reading the offsets of {}/{}: {}", o.topic, p, rd_kafka_err2str(werr)));
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(assignment.get(), o.topic.c_str(), p)->offset = lo;
            end[p] = hi;
        }
    }
    if (!end.empty())
        if (const auto aerr = rd_kafka_assign(rk, assignment.get()))
            throw KafkaError(fmt::format("assigning {}: {}", o.topic, rd_kafka_err2str(aerr)));
    return end;
}

DeadLetter dead_letter_of(rd_kafka_message_t* m)
{
    const Record read = kafka::record_of(*m);
    DeadLetter d;
    d.partition = read.partition;
    d.offset = read.offset;
    d.timestamp_ms = read.timestamp_ms;
    d.key = kafka::owned(read.key);
    d.value = kafka::owned(read.value);
    d.headers = read.headers;
    return d;
}

// Reads `o.topic` from the low to the high watermark of every partition, as of
// the start, and calls `each` for every record until it returns false.
template <class Each> std::uint64_t read_topic(const Options& o, Each&& each)
{
    Owned<rd_kafka_t> rk = topic_reader(o);
    std::map<std::int32_t, std::int64_t> end = assign_whole_topic(rk.get(), o); // still to reach
    std::uint64_t read = 0;
    bool go_on = true;
    const auto deadline = std::chrono::steady_clock::now() + o.timeout;
    std::string last_error;
    while (go_on && !end.empty()) {
        if (std::chrono::steady_clock::now() >= deadline)
            throw KafkaError(fmt::format("timed out after {} reading {}: {} partition(s) not read to the end{}",
                                         format_duration(o.timeout), o.topic, end.size(),
                                         last_error.empty() ? "" : " (last error: " + last_error + ")"));
        Owned<rd_kafka_message_t> m(rd_kafka_consumer_poll(rk.get(), 200));
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            end.erase(m->partition);
            continue;
        }
        if (m->err) {
            last_error = rd_kafka_message_errstr(m.get());
            continue;
        }
        ++read;
        if (read % 10000 == 0)
            err(fmt::format("idemkafka-admin: {} records read from {} ...", read, o.topic));
        auto e = end.find(m->partition);
        if (e != end.end() && m->offset + 1 >= e->second)
            end.erase(e);
        go_on = each(dead_letter_of(m.get()));
    }
    rd_kafka_consumer_close(rk.get());
    return read;
}

std::string describe(const Options& o, const DeadLetter& d)
{
    auto h = [&](const char* name) { return d.header(name).value_or("?"); };
    std::string error = d.header(dead_letter_header::error).value_or("");
    if (error.size() > 200)
        error = error.substr(0, 200) + "...";
    return fmt::format("{}/{}@{}  reason={}  from={}/{}@{}  event={}  attempts={}  group={}  error={}", o.topic,
                       d.partition, d.offset, h(dead_letter_header::reason), h(dead_letter_header::original_topic),
                       h(dead_letter_header::original_partition), h(dead_letter_header::original_offset),
                       d.header(dead_letter_header::event_id).value_or("-"), h(dead_letter_header::attempts),
                       h(dead_letter_header::consumer_group), error);
}

std::string json_opt(const std::optional<std::string>& s)
{
    return s ? json_string(*s) : "null";
}

std::string to_json(const DeadLetter& d)
{
    auto h = [&](const char* name) { return json_opt(d.header(name)); };
    std::string headers = "[";
    for (std::size_t i = 0; i < d.headers.size(); ++i)
        headers += fmt::format("{}{{\"name\":{},\"value\":{}}}", i ? "," : "", json_string(d.headers[i].name),
                               json_opt(d.headers[i].value));
    headers += "]";
    return fmt::format("{{\"partition\":{},\"offset\":{},\"timestamp\":{},\"reason\":{},\"error\":{},"
                       "\"original\":{{\"topic\":{},\"partition\":{},\"offset\":{},\"timestamp\":{}}},"
                       "\"event_id\":{},\"attempts\":{},\"consumer_group\":{},\"key\":{},\"value\":{},\"headers\":{}}}",
                       d.partition, d.offset, d.timestamp_ms, h(dead_letter_header::reason),
                       h(dead_letter_header::error), h(dead_letter_header::original_topic),
                       h(dead_letter_header::original_partition), h(dead_letter_header::original_offset),
                       h(dead_letter_header::original_timestamp), h(dead_letter_header::event_id),
                       h(dead_letter_header::attempts), h(dead_letter_header::consumer_group), json_opt(d.key),
                       json_opt(d.value), headers);
}

int list(const Options& o)
{
    std::uint64_t matched = 0;
    std::string records;
    const auto read = read_topic(o, [&](const DeadLetter& d) {
        if (!matches(o, d))
            return true;
        ++matched;
        if (o.json)
            records += (matched > 1 ? "," : "") + to_json(d);
        else
            out(describe(o, d));
        return !o.limit || matched < *o.limit;
    });
    if (o.json)
        out(fmt::format("{{\"topic\":{},\"read\":{},\"matched\":{},\"records\":[{}]}}", json_string(o.topic), read,
                        matched, records));
    else
        out(fmt::format("{} dead-letter record(s) read from {}, {} matching", read, o.topic, matched));
    return exit_ok;
}

int replay(const Options& o)
{
    std::vector<OutgoingRecord> batch;
    std::vector<std::string> labels;
    std::uint64_t matched = 0, replayed = 0, skipped = 0, failed = 0;
    std::unique_ptr<Publisher> publisher;

    auto flush = [&] {
        if (batch.empty())
            return;
        if (!publisher) {
            PublisherConfig pc;
            pc.brokers = o.brokers;
            pc.kafka = o.kafka;
            pc.log = [](LogLevel level, std::string_view line) {
                if (level >= LogLevel::warning)
                    err(fmt::format("idemkafka-admin: {}", line));
            };
            try {
                publisher = std::make_unique<Publisher>(std::move(pc));
            } catch (const ConfigError& e) {
                throw UsageError(fmt::format("dead-letters: {}", e.what()));
            }
        }
        const auto errors = publisher->publish_all(batch);
        for (std::size_t i = 0; i < batch.size(); ++i) {
            if (errors[i].empty()) {
                ++replayed;
                out(fmt::format("replayed {} -> {}", labels[i], batch[i].topic));
            } else {
                ++failed;
                err(fmt::format("idemkafka-admin: error: replaying {} -> {} failed: {}", labels[i], batch[i].topic,
                                errors[i]));
            }
        }
        batch.clear();
        labels.clear();
    };

    const auto read = read_topic(o, [&](const DeadLetter& d) {
        if (!matches(o, d))
            return true;
        ++matched;
        const std::string label = fmt::format("{}/{}@{} (reason {}, event {})", o.topic, d.partition, d.offset,
                                              d.header(dead_letter_header::reason).value_or("?"),
                                              d.header(dead_letter_header::event_id).value_or("-"));
        const auto target = d.header(dead_letter_header::original_topic);
        if (!target || target->empty()) {
            ++skipped;
            err(fmt::format("idemkafka-admin: warning: skipping {}: no {} header", label,
                            dead_letter_header::original_topic));
        } else if (o.dry_run) {
            out(fmt::format("would replay {} -> {}", label, *target));
        } else {
            OutgoingRecord r;
            r.topic = *target;
            r.key = d.key;
            r.value = d.value;
            for (const auto& h : d.headers)
                if (h.name.rfind(dead_letter_header::prefix, 0) != 0)
                    r.headers.push_back(h);
            batch.push_back(std::move(r));
            labels.push_back(label);
            if (batch.size() >= 500)
                flush();
        }
        return !o.limit || matched < *o.limit;
    });
    flush();
    if (o.dry_run)
        out(fmt::format("dry run: {} record(s) read from {}, {} matching, {} would be replayed, {} skipped", read,
                        o.topic, matched, matched - skipped, skipped));
    else
        out(fmt::format("{} record(s) read from {}, {} matching, {} replayed, {} skipped, {} failed", read, o.topic,
                        matched, replayed, skipped, failed));
    return failed ? exit_failure : exit_ok;
}

} // namespace

int run_dead_letters(std::vector<std::string> args)
{
    ArgReader a("dead-letters", std::move(args));
    const auto action = a.word();
    Options o;
    bool help = false;
    while (a.more()) {
        if (a.option("--brokers"))
            o.brokers = a.value();
        else if (a.option("--topic"))
            o.topic = a.value();
        else if (a.option("--reason")) {
            const std::string r = a.value();
            if (!parse_dead_letter_reason(r))
                throw UsageError(fmt::format("dead-letters: --reason: '{}' is not a dead-letter reason", r));
            o.reasons.insert(r);
        } else if (a.option("--original-topic"))
            o.original_topic = a.value();
        else if (a.option("--event-id")) {
            EventId id;
            const std::string text = a.value();
            if (!EventId::try_parse(text, id))
                throw UsageError(fmt::format("dead-letters: --event-id: '{}' is not a UUID", text));
            o.event_id = id;
        } else if (a.option("--limit"))
            o.limit = parse_count(a.value(), "--limit");
        else if (a.option("--kafka")) {
            const std::string kv = a.value();
            const auto eq = kv.find('=');
            if (eq == std::string::npos || eq == 0)
                throw UsageError("dead-letters: --kafka takes KEY=VALUE");
            redactor().add_setting(kv.substr(0, eq), kv.substr(eq + 1));
            o.kafka[kv.substr(0, eq)] = kv.substr(eq + 1);
        } else if (a.option("--timeout"))
            o.timeout = parse_duration(a.value(), "--timeout");
        else if (a.option("--json"))
            o.json = true;
        else if (a.option("--dry-run"))
            o.dry_run = true;
        else if (a.option("--help") || a.option("-h"))
            help = true;
        else
            a.unknown();
    }
    if (help || action == std::string("help")) {
        out(help_text);
        return exit_ok;
    }
    if (!action)
        throw UsageError("dead-letters: say `list` or `replay`");
    if (*action != "list" && *action != "replay")
        throw UsageError(fmt::format("dead-letters: unknown action '{}' (list or replay)", *action));
    if (o.brokers.empty()) {
        const char* env = std::getenv("IDEMKAFKA_BROKERS");
        if (!env || !*env)
            throw UsageError("dead-letters: no Kafka: pass --brokers SERVERS or set IDEMKAFKA_BROKERS");
        o.brokers = env;
    }
    if (o.topic.empty())
        throw UsageError("dead-letters: --topic NAME (the dead-letter topic) is required");
    if (o.limit && *o.limit == 0)
        throw UsageError("dead-letters: --limit must be at least 1");
    if (o.timeout.count() <= 0)
        throw UsageError("dead-letters: --timeout must be positive");
    if (*action == "list" && o.dry_run)
        throw UsageError("dead-letters: --dry-run belongs to replay");
    if (*action == "replay" && o.json)
        throw UsageError("dead-letters: --json belongs to list");
    return *action == "list" ? list(o) : replay(o);
}

} // namespace idemkafka::detail::admin
