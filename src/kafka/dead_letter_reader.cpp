// read_dead_letters(): a dead-letter topic from the start of each partition to
// its end as of the call, by a consumer that joins no group and commits nothing.

#include <algorithm>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include "idemkafka/dead_letter_triage.hpp"
#include "idemkafka/error.hpp"
#include "kafka/record_of.hpp"

namespace idemkafka {
namespace {

struct KafkaDeleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
    void operator()(rd_kafka_conf_t* p) const noexcept { rd_kafka_conf_destroy(p); }
    void operator()(rd_kafka_message_t* p) const noexcept { rd_kafka_message_destroy(p); }
    void operator()(rd_kafka_topic_partition_list_t* p) const noexcept { rd_kafka_topic_partition_list_destroy(p); }
    void operator()(const rd_kafka_metadata_t* p) const noexcept { rd_kafka_metadata_destroy(p); }
};
template <class T> using Owned = std::unique_ptr<T, KafkaDeleter>;

// A consumer that joins no group: partitions are assigned by hand and offsets
// never stored. librdkafka's own log stays quiet (errors surface as exceptions).
Owned<rd_kafka_t> topic_reader(const DeadLetterSource& s)
{
    char errstr[512];
    Owned<rd_kafka_conf_t> conf(rd_kafka_conf_new());
    auto set = [&](const std::string& k, const std::string& v, bool from_user) {
        if (rd_kafka_conf_set(conf.get(), k.c_str(), v.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            if (from_user)
                throw ConfigError(fmt::format("kafka property {}: {}", k, errstr));
            throw KafkaError(fmt::format("setting {}: {}", k, errstr));
        }
    };
    set("bootstrap.servers", s.brokers, false);
    // A group id is required by the consumer API, but nothing joins or commits.
    set("group.id", "idemkafka-dead-letter-reader", false);
    set("enable.auto.commit", "false", false);
    set("enable.auto.offset.store", "false", false);
    set("enable.partition.eof", "true", false);
    set("log_level", "0", false);
    for (const auto& [k, v] : s.kafka)
        set(k, v, true);
    Owned<rd_kafka_t> rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), errstr, sizeof errstr));
    if (!rk)
        throw KafkaError(fmt::format("cannot create Kafka consumer: {}", errstr));
    (void)conf.release(); // rd_kafka_new() took it
    rd_kafka_poll_set_consumer(rk.get());
    return rk;
}

const rd_kafka_metadata_topic_t* find_topic(const rd_kafka_metadata_t& md, const std::string& name)
{
    for (int i = 0; i < md.topic_cnt; ++i)
        if (name == md.topics[i].topic)
            return &md.topics[i];
    return nullptr;
}

// Assigns every non-empty partition of the topic from its low watermark;
// returns each one's high watermark as of now (where reading stops).
std::map<std::int32_t, std::int64_t> assign_whole_topic(rd_kafka_t* rk, const DeadLetterSource& s)
{
    const int meta_timeout = static_cast<int>(std::min<std::int64_t>(s.timeout.count(), 30000));
    // Metadata of all topics, not of this one: a request naming a topic lets a broker
    // with auto.create.topics.enable create it, and a typo would become a topic.
    const rd_kafka_metadata_t* md_raw = nullptr;
    const auto merr = rd_kafka_metadata(rk, 1, nullptr, &md_raw, meta_timeout);
    Owned<const rd_kafka_metadata_t> md(md_raw);
    if (merr != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("cannot reach Kafka at {}: {}", s.brokers, rd_kafka_err2str(merr)));
    const rd_kafka_metadata_topic_t* topic = find_topic(*md, s.topic);
    if (!topic || topic->err == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
        throw KafkaError(fmt::format("dead-letter topic {} does not exist", s.topic));
    if (topic->err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("topic {}: {}", s.topic, rd_kafka_err2str(topic->err)));

    Owned<rd_kafka_topic_partition_list_t> assignment(rd_kafka_topic_partition_list_new(topic->partition_cnt));
    std::map<std::int32_t, std::int64_t> end;
    for (int i = 0; i < topic->partition_cnt; ++i) {
        const std::int32_t p = topic->partitions[i].id;
        std::int64_t lo = 0, hi = 0;
        const auto werr = rd_kafka_query_watermark_offsets(rk, s.topic.c_str(), p, &lo, &hi, meta_timeout);
        if (werr != RD_KAFKA_RESP_ERR_NO_ERROR)
            throw KafkaError(fmt::format("reading the offsets of {}/{}: {}", s.topic, p, rd_kafka_err2str(werr)));
        if (hi > lo) {
            rd_kafka_topic_partition_list_add(assignment.get(), s.topic.c_str(), p)->offset = lo;
            end[p] = hi;
        }
    }
    if (!end.empty())
        if (const auto aerr = rd_kafka_assign(rk, assignment.get()))
            throw KafkaError(fmt::format("assigning {}: {}", s.topic, rd_kafka_err2str(aerr)));
    return end;
}

DeadLetterRecord dead_letter_of(const rd_kafka_message_t& m)
{
    const Record read = detail::kafka::record_of(m);
    DeadLetterRecord d;
    d.topic = std::string(read.topic);
    d.partition = read.partition;
    d.offset = read.offset;
    d.timestamp_ms = read.timestamp_ms;
    d.key = detail::kafka::owned(read.key);
    d.value = detail::kafka::owned(read.value);
    d.headers = read.headers;
    return d;
}

std::string partitions_text(const std::map<std::int32_t, std::int64_t>& end)
{
    std::vector<std::int32_t> ps;
    ps.reserve(end.size());
    for (const auto& [p, hi] : end)
        ps.push_back(p);
    return fmt::format("{}", fmt::join(ps, ","));
}

} // namespace

std::uint64_t read_dead_letters(const DeadLetterSource& s, const std::function<bool(DeadLetterRecord&&)>& each)
{
    if (s.brokers.empty() || s.topic.empty())
        throw ConfigError("reading dead letters: brokers and topic are required");
    Owned<rd_kafka_t> rk = topic_reader(s);
    std::map<std::int32_t, std::int64_t> end = assign_whole_topic(rk.get(), s); // still to reach
    std::uint64_t read = 0;
    bool go_on = true;
    const auto deadline = std::chrono::steady_clock::now() + s.timeout;
    std::string last_error;
    while (go_on && !end.empty()) {
        if (std::chrono::steady_clock::now() >= deadline)
            throw KafkaError(fmt::format("timed out after {} ms reading {}: partition(s) {} not read to the end{}",
                                         s.timeout.count(), s.topic, partitions_text(end),
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
        // Records written after the start (past the end taken then) are not read.
        auto e = end.find(m->partition);
        if (e == end.end() || m->offset >= e->second)
            continue;
        ++read;
        if (m->offset + 1 >= e->second)
            end.erase(e);
        go_on = each(dead_letter_of(*m));
    }
    rd_kafka_consumer_close(rk.get());
    return read;
}

} // namespace idemkafka
