#pragma once
// What the share consumer's tests (label share) share: a share group on the
// mock broker, an effect table, and the events they publish. Each test runs
// through run_isolated.sh: its own mock broker (share-group settings are the
// mock cluster's, not a group's) and its own database.

#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/publisher.hpp>
#include <idemkafka/share_consumer.hpp>

#include "pg/exec.hpp"
#include "test_env.hpp"

namespace idemkafka::test::share {

using Consumer = IdempotentShareConsumer<TestEvent>;

/// A topic for a share group that starts at the beginning of its partitions
/// (share groups start at the end unless told otherwise: on the mock cluster a
/// setting of the cluster, on Apache Kafka one of the group, set by share_config).
inline std::string share_topic(const std::string& prefix, int partitions)
{
    if (on_mock_cluster())
        mock_control("share-group auto-offset-reset earliest");
    auto topic = unique_name(prefix);
    create_topic(topic, partitions);
    return topic;
}

/// Sets a share-group setting a test needs, before the group's members start: on the mock
/// cluster a setting of the whole cluster (its `share-group SETTING VALUE` control command), on
/// Apache Kafka the group's own dynamic setting (share.delivery.count.limit, ...).
inline void share_setting(const std::string& group, const std::string& setting, const std::string& value)
{
    if (on_mock_cluster()) {
        mock_control("share-group " + setting + " " + value);
        return;
    }
    static const std::map<std::string, std::string> names{{"delivery-limit", "share.delivery.count.limit"},
                                                          {"lock-duration-ms", "share.record.lock.duration.ms"},
                                                          {"session-timeout-ms", "share.session.timeout.ms"},
                                                          {"heartbeat-interval-ms", "share.heartbeat.interval.ms"},
                                                          {"auto-offset-reset", "share.auto.offset.reset"}};
    const auto it = names.find(setting);
    if (it == names.end())
        throw std::invalid_argument("no Apache Kafka group setting for the mock's share-group " + setting);
    set_group_config(group, it->second, value);
}

/// A share consumer's configuration for `group` on `topic`.
inline ShareConsumerConfig share_config(const std::string& group, const std::string& topic)
{
    if (!on_mock_cluster())
        set_group_config(group, "share.auto.offset.reset", "earliest");
    ShareConsumerConfig cfg;
    cfg.consumer.brokers = brokers();
    cfg.consumer.group_id = group;
    cfg.consumer.topics = {topic};
    cfg.consumer.postgres = pg();
    cfg.consumer.log = log_sink();
    return cfg;
}

/// The effect table: one row per handler call that committed.
inline std::string make_effect_table(const std::string& name)
{
    exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, entity text NOT NULL,"
                     " delivery int NOT NULL)",
                     name));
    return name;
}

inline void insert_effect(pqxx::work& tx, const std::string& table, const TestEvent& e, const Context& ctx)
{
    detail::pg::exec_params(tx,
                            fmt::format("INSERT INTO {} (event_id, entity, delivery) VALUES ($1::uuid, $2, $3)", table),
                            e.id.to_string(), e.entity, ctx.attempt());
}

inline std::int64_t effects(const std::string& table)
{
    return scalar("SELECT count(*) FROM " + table);
}

inline std::int64_t distinct_effects(const std::string& table)
{
    return scalar("SELECT count(DISTINCT event_id) FROM " + table);
}

inline std::int64_t claims(const std::string& group)
{
    return scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", group));
}

/// Publishes `events` (and nothing else) with their entity as the key.
inline void publish(const std::string& topic, const std::vector<TestEvent>& events)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    for (const auto& e : events)
        pub.publish_async(topic, e.entity, encode(e));
    pub.flush();
}

/// `n` new events named "<prefix>-<i>".
inline std::vector<TestEvent> new_events(const std::string& prefix, int n)
{
    std::vector<TestEvent> out;
    out.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i)
        out.push_back(TestEvent{new_event_id(), fmt::format("{}-{}", prefix, i), i});
    return out;
}

} // namespace idemkafka::test::share
