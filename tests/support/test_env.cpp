#include "test_env.hpp"

#include "recent_log.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spawn.h>
#include <unistd.h>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <pqxx/pqxx>

extern char** environ;

namespace idemkafka::test {
namespace {

std::string required_env(const char* name, const char* what)
{
    const char* v = std::getenv(name);
    if (!v || !*v)
        throw std::runtime_error(fmt::format(
            "{} is not set: this test needs {}; run it through scripts/test.sh, which starts one", name, what));
    return v;
}

} // namespace

std::string pg()
{
    return required_env("IDEMKAFKA_TEST_PG", "a PostgreSQL server (libpq connection string)");
}

std::string brokers()
{
    return required_env("IDEMKAFKA_TEST_BROKERS", "a Kafka-protocol broker (bootstrap servers)");
}

std::string unique_name(std::string_view prefix)
{
    static std::atomic<int> counter{0};
    const auto now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    return fmt::format("{}_{}_{}_{}", prefix, getpid(), now % 100000000, counter++);
}

namespace {

// The mock cluster (librdkafka 2.0) does not implement CreateTopics: ask the
// mock broker process through its control FIFO instead.
void write_control(const std::string& fifo, const std::string& command)
{
    const std::string line = command + "\n";
    std::FILE* f = std::fopen(fifo.c_str(), "w");
    if (!f)
        throw std::runtime_error("cannot open mock broker control FIFO " + fifo);
    // One write below PIPE_BUF is atomic, so parallel tests do not interleave.
    const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
    std::fclose(f);
    if (!ok)
        throw std::runtime_error("cannot write to mock broker control FIFO " + fifo);
}

} // namespace

namespace {

// A producer handle for admin requests and metadata; destroyed with the object.
struct AdminHandle {
    rd_kafka_t* rk = nullptr;
    AdminHandle()
    {
        char err[512];
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers().c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
            throw std::runtime_error(err);
        rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
        if (!rk)
            throw std::runtime_error(err);
    }
    ~AdminHandle() { rd_kafka_destroy(rk); }
    AdminHandle(const AdminHandle&) = delete;
    AdminHandle& operator=(const AdminHandle&) = delete;

    // The partitions of `topic` in a fresh metadata answer: count and leaders (empty when the
    // broker does not know the topic or did not answer).
    std::vector<std::int32_t> leaders(const std::string& topic) const
    {
        std::vector<std::int32_t> out;
        const rd_kafka_metadata_t* md = nullptr;
        if (rd_kafka_metadata(rk, 1, nullptr, &md, 5000) != RD_KAFKA_RESP_ERR_NO_ERROR)
            return out;
        for (int t = 0; t < md->topic_cnt; ++t)
            if (md->topics[t].topic == topic && md->topics[t].err == RD_KAFKA_RESP_ERR_NO_ERROR) {
                out.assign(static_cast<std::size_t>(md->topics[t].partition_cnt), -1);
                for (int p = 0; p < md->topics[t].partition_cnt; ++p) {
                    const auto& part = md->topics[t].partitions[p];
                    if (part.id >= 0 && part.id < md->topics[t].partition_cnt)
                        out[static_cast<std::size_t>(part.id)] = part.err ? -1 : part.leader;
                }
            }
        rd_kafka_metadata_destroy(md);
        return out;
    }
};

} // namespace

bool on_mock_cluster()
{
    const char* control = std::getenv("IDEMKAFKA_MOCK_CONTROL");
    return control && *control;
}

void set_group_config(const std::string& group, const std::string& name, const std::string& value)
{
#if RD_KAFKA_VERSION >= 0x020200ff
    AdminHandle admin;
    rd_kafka_t* rk = admin.rk;
    rd_kafka_ConfigResource_t* res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_GROUP, group.c_str());
    std::string failure;
    if (rd_kafka_error_t* e = rd_kafka_ConfigResource_add_incremental_config(
            res, name.c_str(), RD_KAFKA_ALTER_CONFIG_OP_TYPE_SET, value.c_str())) {
        failure = rd_kafka_error_string(e);
        rd_kafka_error_destroy(e);
    }
    rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
    if (failure.empty()) {
        rd_kafka_IncrementalAlterConfigs(rk, &res, 1, nullptr, q);
        if (rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000)) {
            if (rd_kafka_event_error(ev)) {
                failure = rd_kafka_event_error_string(ev);
            } else {
                size_t n = 0;
                const rd_kafka_ConfigResource_t** out = rd_kafka_IncrementalAlterConfigs_result_resources(
                    rd_kafka_event_IncrementalAlterConfigs_result(ev), &n);
                for (size_t i = 0; i < n; ++i)
                    if (rd_kafka_ConfigResource_error(out[i]))
                        failure = rd_kafka_ConfigResource_error_string(out[i]);
            }
            rd_kafka_event_destroy(ev);
        } else {
            failure = "IncrementalAlterConfigs timed out after 30 s";
        }
    }
    rd_kafka_ConfigResource_destroy(res);
    rd_kafka_queue_destroy(q);
    if (!failure.empty())
        throw std::runtime_error(fmt::format("setting {}={} on group {}: {}", name, value, group, failure));
#else
    throw std::runtime_error(
        fmt::format("setting {}={} on group {} needs librdkafka 2.2 or later", name, value, group));
#endif
}

void create_topic(const std::string& name, int partitions)
{
    const char* control = std::getenv("IDEMKAFKA_MOCK_CONTROL");
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers().c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
        throw std::runtime_error(err);
    rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (!rk)
        throw std::runtime_error(err);
    std::string failure;
    // -1: the broker's default.replication.factor (3 on a cluster of three test brokers).
    rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(name.c_str(), partitions, -1, err, sizeof err);
    rd_kafka_queue_t* q = rd_kafka_queue_new(rk);
    rd_kafka_event_t* ev = nullptr;
    if (control && *control) {
        write_control(control, fmt::format("create-topic {} {}", name, partitions));
    } else {
        rd_kafka_CreateTopics(rk, &nt, 1, nullptr, q);
        ev = rd_kafka_queue_poll(q, 30000);
        if (!ev)
            failure = "CreateTopics timed out";
    }
    if (ev) {
        if (rd_kafka_event_error(ev)) {
            failure = rd_kafka_event_error_string(ev);
        } else {
            size_t n = 0;
            const rd_kafka_topic_result_t** res =
                rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(ev), &n);
            for (size_t i = 0; i < n; ++i)
                if (rd_kafka_topic_result_error(res[i]) &&
                    rd_kafka_topic_result_error(res[i]) != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
                    failure = rd_kafka_topic_result_error_string(res[i]);
        }
        rd_kafka_event_destroy(ev);
    }
    // Wait until the metadata shows all partitions, so producers and consumers
    // that start next see the topic whole.
    // Lists all topics rather than asking for this one: a request naming the
    // topic could auto-create it with a default partition count.
    for (int i = 0; failure.empty() && i < 200; ++i) {
        const rd_kafka_metadata_t* md = nullptr;
        bool ok = false;
        if (rd_kafka_metadata(rk, 1, nullptr, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
            for (int t = 0; t < md->topic_cnt; ++t)
                if (md->topics[t].topic == name && md->topics[t].err == RD_KAFKA_RESP_ERR_NO_ERROR &&
                    md->topics[t].partition_cnt == partitions)
                    ok = true;
        }
        if (md)
            rd_kafka_metadata_destroy(md);
        if (ok)
            break;
        if (i == 199)
            failure = "topic metadata did not show all partitions in time";
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    rd_kafka_NewTopic_destroy(nt);
    rd_kafka_queue_destroy(q);
    rd_kafka_destroy(rk);
    if (!failure.empty())
        throw std::runtime_error(fmt::format("creating topic {}: {}", name, failure));
}

namespace {

long ack_count(const std::string& ack, std::string* text)
{
    std::FILE* f = std::fopen(ack.c_str(), "r");
    if (!f)
        return 0;
    char buf[512] = {};
    const auto n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    std::string line(buf, n);
    if (text)
        *text = line;
    return std::strtol(line.c_str(), nullptr, 10);
}

} // namespace

void mock_control(const std::string& command)
{
    const char* fifo = std::getenv("IDEMKAFKA_MOCK_CONTROL");
    if (!fifo || !*fifo)
        throw std::runtime_error("IDEMKAFKA_MOCK_CONTROL is not set: this test needs the mock broker's control "
                                 "FIFO (scripts/test.sh starts the broker with one)");
    const std::string ack = std::string(fifo) + ".ack";
    const long before = ack_count(ack, nullptr);
    write_control(fifo, command);
    std::string text;
    if (!wait_until([&] { return ack_count(ack, &text) > before; }, std::chrono::seconds(10)))
        throw std::runtime_error("mock broker did not acknowledge: " + command);
    if (text.find(" ok") == std::string::npos)
        throw std::runtime_error("mock broker refused \"" + command + "\": " + text);
}

void add_partitions(const std::string& topic, int total)
{
    AdminHandle admin;
    char err[512];
    rd_kafka_NewPartitions_t* np =
        rd_kafka_NewPartitions_new(topic.c_str(), static_cast<size_t>(total), err, sizeof err);
    if (!np)
        throw std::runtime_error(err);
    rd_kafka_queue_t* q = rd_kafka_queue_new(admin.rk);
    rd_kafka_CreatePartitions(admin.rk, &np, 1, nullptr, q);
    std::string failure;
    if (rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000)) {
        if (rd_kafka_event_error(ev)) {
            failure = rd_kafka_event_error_string(ev);
        } else {
            size_t n = 0;
            const rd_kafka_topic_result_t** res =
                rd_kafka_CreatePartitions_result_topics(rd_kafka_event_CreatePartitions_result(ev), &n);
            for (size_t i = 0; i < n; ++i)
                if (rd_kafka_topic_result_error(res[i]))
                    failure = rd_kafka_topic_result_error_string(res[i]);
        }
        rd_kafka_event_destroy(ev);
    } else {
        failure = "CreatePartitions timed out after 30 s";
    }
    rd_kafka_NewPartitions_destroy(np);
    rd_kafka_queue_destroy(q);
    if (!failure.empty())
        throw std::runtime_error(fmt::format("adding partitions to {} (to {}): {}", topic, total, failure));
    const bool shown = wait_until(
        [&] {
            const auto leaders = admin.leaders(topic);
            return leaders.size() == static_cast<std::size_t>(total) &&
                   std::find(leaders.begin(), leaders.end(), -1) == leaders.end();
        },
        std::chrono::seconds(30));
    if (!shown)
        throw std::runtime_error(fmt::format("{} did not show {} partitions with leaders within 30 s", topic, total));
}

std::int32_t partition_leader(const std::string& topic, std::int32_t partition)
{
    AdminHandle admin;
    const auto leaders = admin.leaders(topic);
    return partition >= 0 && static_cast<std::size_t>(partition) < leaders.size()
               ? leaders[static_cast<std::size_t>(partition)]
               : -1;
}

void kafka_control(const std::string& command)
{
    const std::string ctl = required_env("IDEMKAFKA_KAFKA_CTL", "an Apache Kafka cluster of the test's own "
                                                                "(run_isolated.sh --own-kafka)");
    const std::string line = ctl + " " + command;
    if (std::system(line.c_str()) != 0)
        throw std::runtime_error("the Kafka control command failed: " + line);
}

std::int64_t committed_offset(const std::string& group, const std::string& topic, std::int32_t partition)
{
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", brokers().c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err);
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err);
    rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        throw std::runtime_error(err);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic.c_str(), partition);
    // Apache Kafka answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS while the group's
    // coordinator moves or loads (librdkafka 2.0 hands them back): asked again for up to 30 s.
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int attempt = 0; attempt < 60; ++attempt) {
        e = rd_kafka_committed(rk, list, 10000);
        if (e != RD_KAFKA_RESP_ERR_NOT_COORDINATOR && e != RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS &&
            e != RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    const std::int64_t offset = list->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(list);
    rd_kafka_destroy(rk);
    if (e)
        throw std::runtime_error(std::string("committed offsets: ") + rd_kafka_err2str(e));
    return offset;
}

namespace {
void fast_mock_consumer_groups();
} // namespace

void reset_group_offsets(const std::string& group, const std::string& topic, int partitions, std::int64_t offset)
{
    // Joins the group as a member (a broker may refuse commits from outside
    // the group), commits the reset offsets, and leaves.
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    // A member of the group's own protocol.
    if (consumer_protocol())
        fast_mock_consumer_groups();
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"bootstrap.servers", brokers()},
             {"group.id", group},
             {"enable.auto.commit", "false"},
             consumer_protocol() ? std::pair<std::string, std::string>{"group.protocol", "consumer"}
                                 : std::pair<std::string, std::string>{"session.timeout.ms", "6000"}})
        rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err);
    rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        throw std::runtime_error(err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t* sub = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(sub, topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(rk, sub);
    rd_kafka_topic_partition_list_destroy(sub);
    const bool joined = wait_until(
        [&] {
            if (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100))
                rd_kafka_message_destroy(m);
            rd_kafka_topic_partition_list_t* a = nullptr;
            rd_kafka_assignment(rk, &a);
            const bool all = a && a->cnt == partitions;
            if (a)
                rd_kafka_topic_partition_list_destroy(a);
            return all;
        },
        std::chrono::seconds(30));
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; ++p)
        rd_kafka_topic_partition_list_add(list, topic.c_str(), p)->offset = offset;
    const auto e = joined ? rd_kafka_commit(rk, list, 0) : RD_KAFKA_RESP_ERR__TIMED_OUT;
    rd_kafka_topic_partition_list_destroy(list);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    if (e)
        throw std::runtime_error(std::string("offset reset: ") + rd_kafka_err2str(e));
}

std::string ReadRecord::header(std::string_view name) const
{
    for (const auto& h : headers)
        if (h.name == name)
            return h.value.value_or("");
    return "";
}

std::vector<ReadRecord> read_topic(const std::string& topic, std::size_t count, std::chrono::milliseconds timeout)
{
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    const std::string group = unique_name("reader");
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{{"bootstrap.servers", brokers()},
                                                                               {"group.id", group},
                                                                               {"enable.auto.commit", "false"},
                                                                               {"auto.offset.reset", "earliest"},
                                                                               {"session.timeout.ms", "6000"}})
        if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
            throw std::runtime_error(err);
    rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk)
        throw std::runtime_error(err);
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic.c_str(), RD_KAFKA_PARTITION_UA);
    rd_kafka_subscribe(rk, list);
    rd_kafka_topic_partition_list_destroy(list);
    std::vector<ReadRecord> out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
        rd_kafka_message_t* m = rd_kafka_consumer_poll(rk, 100);
        if (!m)
            continue;
        if (!m->err) {
            ReadRecord r;
            r.partition = m->partition;
            r.offset = m->offset;
            if (m->key)
                r.key.emplace(static_cast<const char*>(m->key), m->key_len);
            if (m->payload)
                r.value.emplace(static_cast<const char*>(m->payload), m->len);
            rd_kafka_headers_t* hdrs = nullptr;
            if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
                const char* name;
                const void* val;
                size_t size;
                for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == 0; ++i)
                    r.headers.push_back(
                        Header{name, val ? std::optional<std::string>(std::string(static_cast<const char*>(val), size))
                                         : std::nullopt});
            }
            out.push_back(std::move(r));
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return out;
}

std::int64_t scalar(const std::string& sql)
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    return tx.exec(sql)[0][0].as<std::int64_t>();
}

void exec(const std::string& sql)
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    tx.exec(sql);
}

bool consumer_protocol()
{
    const char* v = std::getenv("IDEMKAFKA_TEST_GROUP_PROTOCOL");
    const std::string protocol = v ? v : "";
    if (protocol.empty() || protocol == "classic")
        return false;
    if (protocol == "consumer")
        return true;
    throw std::runtime_error("IDEMKAFKA_TEST_GROUP_PROTOCOL=" + protocol + ": expected classic or consumer");
}

namespace {

// The broker owns a consumer-protocol group's session timeout and heartbeat
// interval (the mock's defaults: 30 s and 3 s). Once per test process, for the
// groups it creates from then on (the tests' groups are all new).
void fast_mock_consumer_groups()
{
    static std::once_flag once;
    std::call_once(once, [] {
        if (const char* control = std::getenv("IDEMKAFKA_MOCK_CONTROL"); control && *control)
            mock_control("group-consumer-timeouts 6000 500");
    });
}

} // namespace

void set_assignment_strategy(ConsumerConfig& cfg, const std::string& strategy)
{
    if (consumer_protocol())
        cfg.kafka["group.remote.assignor"] = strategy == "range" ? "range" : "uniform";
    else
        cfg.kafka["partition.assignment.strategy"] = strategy;
}

ConsumerConfig consumer_config(const std::string& group, const std::string& topic)
{
    ConsumerConfig cfg;
    cfg.brokers = brokers();
    cfg.group_id = group;
    cfg.topics = {topic};
    cfg.postgres = pg();
    if (consumer_protocol()) {
        fast_mock_consumer_groups();
        cfg.kafka["group.protocol"] = "consumer";
    } else {
        cfg.kafka["session.timeout.ms"] = "6000";
        cfg.kafka["heartbeat.interval.ms"] = "500";
    }
    cfg.retry_backoff = std::chrono::milliseconds(50);
    cfg.log = log_sink();
    // The suites again with a transaction per record (a test that sets
    // max_batch itself keeps its units of that size).
    cfg.transaction_per_record = std::getenv("IDEMKAFKA_TEST_PER_RECORD") != nullptr;
    return cfg;
}

LogSink log_sink(LogLevel shown)
{
    const bool verbose = std::getenv("IDEMKAFKA_TEST_VERBOSE") != nullptr;
    return [print = stderr_sink(verbose ? LogLevel::debug : shown)](const LogRecord& r) {
        remember_log_line(fmt::format("{} {}", to_string(r.level), format_text(r)));
        print(r);
    };
}

std::string encode(const TestEvent& e)
{
    return fmt::format("{},{},{}", e.id.to_string(), e.entity, e.amount);
}

TestEvent decode(std::string_view payload)
{
    const auto a = payload.find(',');
    const auto b = payload.find(',', a == std::string_view::npos ? a : a + 1);
    if (a == std::string_view::npos || b == std::string_view::npos)
        throw DecodeError(fmt::format("expected \"id,entity,amount\", got {} bytes", payload.size()));
    TestEvent e;
    e.id = EventId::parse(payload.substr(0, a));
    e.entity = std::string(payload.substr(a + 1, b - a - 1));
    try {
        e.amount = std::stoll(std::string(payload.substr(b + 1)));
    } catch (const std::exception&) {
        throw DecodeError("amount is not a number");
    }
    return e;
}

pid_t spawn_self(const std::string& spec, const std::vector<std::string>& extra_env)
{
    std::vector<std::string> envs;
    for (char** e = environ; *e; ++e)
        envs.emplace_back(*e);
    envs.insert(envs.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& s : envs)
        envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe", tag = spec;
    char* argv[] = {exe.data(), tag.data(), nullptr};
    pid_t pid = 0;
    if (const int err = posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()))
        throw std::runtime_error(fmt::format("cannot start {} {}: error {}", exe, spec, err));
    return pid;
}

} // namespace idemkafka::test
