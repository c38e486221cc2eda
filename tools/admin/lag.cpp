#include "lag.hpp"

#include <algorithm>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <idemkafka/error.hpp>

namespace idemkafka::detail::admin {
namespace {

struct Deleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
    void operator()(rd_kafka_topic_partition_list_t* p) const noexcept { rd_kafka_topic_partition_list_destroy(p); }
    void operator()(const rd_kafka_metadata_t* p) const noexcept { rd_kafka_metadata_destroy(p); }
    void operator()(rd_kafka_message_t* p) const noexcept { rd_kafka_message_destroy(p); }
    void operator()(rd_kafka_queue_t* p) const noexcept { rd_kafka_queue_destroy(p); }
    void operator()(rd_kafka_event_t* p) const noexcept { rd_kafka_event_destroy(p); }
};
template <class T> using Owned = std::unique_ptr<T, Deleter>;
using PartitionList = Owned<rd_kafka_topic_partition_list_t>;

int ms(std::chrono::milliseconds t)
{
    return static_cast<int>(t.count());
}

// A consumer client of `group` that never joins it: for committed offsets,
// watermarks and reading single records.
Owned<rd_kafka_t> client(const std::string& brokers, const std::map<std::string, std::string>& kafka,
                         const std::string& group)
{
    char errstr[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    std::map<std::string, std::string> settings = kafka;
    settings["bootstrap.servers"] = brokers;
    settings["group.id"] = group;
    settings["enable.auto.commit"] = "false";
    settings["enable.auto.offset.store"] = "false";
    settings["log_level"] = "0";
    for (const auto& [k, v] : settings)
        if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            throw KafkaError(fmt::format("setting {}: {}", k, errstr));
        }
    Owned<rd_kafka_t> rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        throw KafkaError(fmt::format("cannot create a Kafka client: {}", errstr));
    }
    rd_kafka_poll_set_consumer(rk.get());
    return rk;
}

// The topics `group` has committed offsets for (Kafka's own list).
std::vector<std::string> committed_topics(rd_kafka_t* rk, const std::string& group, std::chrono::milliseconds timeout)
{
    Owned<rd_kafka_queue_t> q(rd_kafka_queue_new(rk));
    rd_kafka_ListConsumerGroupOffsets_t* req = rd_kafka_ListConsumerGroupOffsets_new(group.c_str(), nullptr);
    rd_kafka_ListConsumerGroupOffsets(rk, &req, 1, nullptr, q.get());
    rd_kafka_ListConsumerGroupOffsets_destroy(req);
    Owned<rd_kafka_event_t> ev(rd_kafka_queue_poll(q.get(), ms(timeout)));
    if (!ev)
        throw KafkaError(fmt::format("listing the offsets of {}: no answer in {} ms", group, timeout.count()));
    if (rd_kafka_event_error(ev.get()))
        throw KafkaError(fmt::format("listing the offsets of {}: {}", group, rd_kafka_event_error_string(ev.get())));
    std::set<std::string> topics;
    std::size_t n = 0;
    const auto* res = rd_kafka_event_ListConsumerGroupOffsets_result(ev.get());
    const rd_kafka_group_result_t** groups = rd_kafka_ListConsumerGroupOffsets_result_groups(res, &n);
    for (std::size_t i = 0; i < n; ++i)
        if (const auto* parts = rd_kafka_group_result_partitions(groups[i]))
            for (int k = 0; k < parts->cnt; ++k)
                topics.insert(parts->elems[k].topic);
    return {topics.begin(), topics.end()};
}

// Every partition of `topics`, from the cluster's metadata.
PartitionList partitions_of(rd_kafka_t* rk, const std::vector<std::string>& topics, std::chrono::milliseconds timeout)
{
    const rd_kafka_metadata_t* raw = nullptr;
    const auto e = rd_kafka_metadata(rk, 1, nullptr, &raw, ms(timeout));
    Owned<const rd_kafka_metadata_t> md(raw);
    if (e)
        throw KafkaError(fmt::format("cannot read Kafka's metadata: {}", rd_kafka_err2str(e)));
    PartitionList list(rd_kafka_topic_partition_list_new(8));
    for (const auto& t : topics) {
        bool found = false;
        for (int i = 0; i < md->topic_cnt; ++i)
            if (t == md->topics[i].topic && !md->topics[i].err) {
                found = true;
                for (int p = 0; p < md->topics[i].partition_cnt; ++p)
                    rd_kafka_topic_partition_list_add(list.get(), t.c_str(), md->topics[i].partitions[p].id);
            }
        if (!found)
            throw KafkaError(fmt::format("topic {} does not exist", t));
    }
    return list;
}

// The timestamp of the record at each (topic, partition, offset) asked, read
// by assigning those offsets; what does not arrive within `timeout` is left out.
std::map<std::pair<std::string, std::int32_t>, std::int64_t>
first_unconsumed_timestamps(rd_kafka_t* rk, const std::vector<PartitionLag>& lags, std::chrono::milliseconds timeout)
{
    std::map<std::pair<std::string, std::int32_t>, std::int64_t> out;
    PartitionList list(rd_kafka_topic_partition_list_new(8));
    for (const auto& l : lags)
        if (l.records_behind && *l.records_behind > 0)
            rd_kafka_topic_partition_list_add(list.get(), l.topic.c_str(), l.partition)->offset =
                std::max(l.committed, l.log_start);
    if (list->cnt == 0 || rd_kafka_assign(rk, list.get()))
        return out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < static_cast<std::size_t>(list->cnt) && std::chrono::steady_clock::now() < deadline) {
        Owned<rd_kafka_message_t> m(rd_kafka_consumer_poll(rk, 100));
        if (!m || m->err)
            continue;
        const std::pair<std::string, std::int32_t> key{rd_kafka_topic_name(m->rkt), m->partition};
        if (!out.count(key))
            out[key] = rd_kafka_message_timestamp(m.get(), nullptr);
    }
    rd_kafka_assign(rk, nullptr);
    return out;
}

std::vector<PartitionLag> group_lag(const std::string& brokers, const std::map<std::string, std::string>& kafka,
                                    const std::string& group, std::vector<std::string> topics,
                                    std::chrono::milliseconds timeout)
{
    auto rk = client(brokers, kafka, group);
    if (topics.empty())
        topics = committed_topics(rk.get(), group, timeout);
    std::vector<PartitionLag> out;
    if (topics.empty())
        return out;
    PartitionList list = partitions_of(rk.get(), topics, timeout);
    if (const auto e = rd_kafka_committed(rk.get(), list.get(), ms(timeout)))
        throw KafkaError(fmt::format("reading the committed offsets of {}: {}", group, rd_kafka_err2str(e)));
    for (int i = 0; i < list->cnt; ++i) {
        const auto& el = list->elems[i];
        PartitionLag l{group, el.topic, el.partition, el.err || el.offset < 0 ? -1 : el.offset, -1, -1, {}, {}};
        if (const auto e = rd_kafka_query_watermark_offsets(rk.get(), el.topic, el.partition, &l.log_start, &l.log_end,
                                                            ms(timeout)))
            throw KafkaError(
                fmt::format("reading the offsets of {}/{}: {}", el.topic, el.partition, rd_kafka_err2str(e)));
        if (l.committed >= 0)
            l.records_behind = std::max<std::int64_t>(0, l.log_end - std::max(l.committed, l.log_start));
        if (l.records_behind == std::optional<std::int64_t>(0))
            l.seconds_behind = 0.0;
        out.push_back(l);
    }
    const auto now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const auto ts = first_unconsumed_timestamps(rk.get(), out, std::min(timeout, std::chrono::milliseconds(3000)));
    for (auto& l : out)
        if (const auto t = ts.find({l.topic, l.partition}); t != ts.end() && t->second >= 0)
            l.seconds_behind = std::max(0.0, static_cast<double>(now_ms - t->second) / 1000.0);
    return out;
}

} // namespace

std::vector<PartitionLag> partition_lag(const std::string& brokers, const std::map<std::string, std::string>& kafka,
                                        const std::vector<std::string>& groups, const std::vector<std::string>& topics,
                                        std::chrono::milliseconds timeout)
{
    std::vector<PartitionLag> out;
    for (const auto& g : groups) {
        auto lags = group_lag(brokers, kafka, g, topics, timeout);
        // A topic named for every group: leave out a group's topics it never committed on.
        std::set<std::string> used;
        for (const auto& l : lags)
            if (l.committed >= 0)
                used.insert(l.topic);
        lags.erase(
            std::remove_if(lags.begin(), lags.end(), [&](const PartitionLag& l) { return !used.count(l.topic); }),
            lags.end());
        out.insert(out.end(), lags.begin(), lags.end());
    }
    return out;
}

nlohmann::json lag_json(const std::vector<PartitionLag>& rows)
{
    auto arr = nlohmann::json::array();
    for (const auto& l : rows)
        arr.push_back({{"group", l.group},
                       {"topic", l.topic},
                       {"partition", l.partition},
                       {"committed", l.committed < 0 ? nlohmann::json(nullptr) : nlohmann::json(l.committed)},
                       {"log_start", l.log_start},
                       {"log_end", l.log_end},
                       {"records_behind", l.records_behind ? nlohmann::json(*l.records_behind) : nlohmann::json()},
                       {"seconds_behind", l.seconds_behind ? nlohmann::json(*l.seconds_behind) : nlohmann::json()}});
    return arr;
}

std::vector<std::string> lag_lines(const std::vector<PartitionLag>& rows)
{
    std::vector<std::string> out = {fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>12}", "group", "topic",
                                                "partition", "committed", "log end", "behind", "seconds")};
    for (const auto& l : rows)
        out.push_back(fmt::format("{:<24} {:<32} {:>9} {:>12} {:>12} {:>12} {:>12}", l.group, l.topic, l.partition,
                                  l.committed < 0 ? "-" : std::to_string(l.committed), l.log_end,
                                  l.records_behind ? std::to_string(*l.records_behind) : "-",
                                  l.seconds_behind ? fmt::format("{:.1f}", *l.seconds_behind) : "-"));
    return out;
}

} // namespace idemkafka::detail::admin
