// TestBroker: librdkafka's mock cluster in the test process, behind RAII.
//
// Only mock functions that librdkafka 2.0 already has are used (cluster_new,
// topic_create, push_request_errors_array, clear_request_errors,
// broker_set_down/up): the Debian lane runs 2.0.2.

#include "idemkafka/testing.hpp"

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "idemkafka/config.hpp"
#include "idemkafka/error.hpp"
#include "kafka/record_of.hpp"

namespace idemkafka {
namespace {

constexpr std::int16_t api_offset_commit = 8; // Kafka protocol ApiKey of OffsetCommit
constexpr auto produce_timeout = std::chrono::seconds(10);
constexpr auto topic_timeout = std::chrono::seconds(30);

struct RdKafkaDeleter {
    void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct ConfDeleter {
    void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct MockClusterDeleter {
    void operator()(rd_kafka_mock_cluster_t* mc) const { rd_kafka_mock_cluster_destroy(mc); }
};
struct MetadataDeleter {
    void operator()(const rd_kafka_metadata_t* md) const { rd_kafka_metadata_destroy(md); }
};
struct PartitionListDeleter {
    void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); }
};
struct MessageDeleter {
    void operator()(rd_kafka_message_t* m) const { rd_kafka_message_destroy(m); }
};
struct HeadersDeleter {
    void operator()(rd_kafka_headers_t* h) const { rd_kafka_headers_destroy(h); }
};
using RdKafkaPtr = std::unique_ptr<rd_kafka_t, RdKafkaDeleter>;
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using MockClusterPtr = std::unique_ptr<rd_kafka_mock_cluster_t, MockClusterDeleter>;
using MetadataPtr = std::unique_ptr<const rd_kafka_metadata_t, MetadataDeleter>;
using PartitionListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionListDeleter>;
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;
using HeadersPtr = std::unique_ptr<rd_kafka_headers_t, HeadersDeleter>;

void set(rd_kafka_conf_t* conf, const char* key, const std::string& value)
{
    char err[512];
    if (rd_kafka_conf_set(conf, key, value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
        throw KafkaError(fmt::format("TestBroker: librdkafka refused {}={}: {}", key, value, err));
}

// The kit's own clients report failures as exceptions; their connection
// notices (every take_down() makes some) would only clutter the test's output.
extern "C" void on_log(const rd_kafka_t*, int level, const char* facility, const char* message)
{
    if (level <= 2) // LOG_CRIT and worse
        std::fprintf(stderr, "idemkafka::TestBroker: librdkafka %s: %s\n", facility, message);
}

void quiet(rd_kafka_conf_t* conf)
{
    rd_kafka_conf_set_log_cb(conf, on_log);
}

RdKafkaPtr new_client(rd_kafka_type_t type, ConfPtr conf, const char* what)
{
    char err[512];
    RdKafkaPtr rk{rd_kafka_new(type, conf.get(), err, sizeof err)};
    if (!rk)
        throw KafkaError(fmt::format("TestBroker: cannot create the {}: {}", what, err));
    (void)conf.release(); // rd_kafka_new() took it
    return rk;
}

std::string err_text(rd_kafka_resp_err_t err)
{
    return fmt::format("{} ({})", rd_kafka_err2str(err), rd_kafka_err2name(err));
}

// Partition count of `topic` as the cluster's metadata shows it, nullopt when
// it is not listed, or an error. Lists all topics rather than naming this one:
// a request naming a topic makes librdkafka 2.0's mock cluster create it.
struct TopicMetadata {
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    bool listed = false;
    rd_kafka_resp_err_t topic_err = RD_KAFKA_RESP_ERR_NO_ERROR;
    int partitions = 0;
};

TopicMetadata topic_metadata(rd_kafka_t* rk, const std::string& topic, std::chrono::milliseconds timeout)
{
    TopicMetadata out;
    const rd_kafka_metadata_t* raw = nullptr;
    out.err = rd_kafka_metadata(rk, 1, nullptr, &raw, static_cast<int>(timeout.count()));
    const MetadataPtr md{raw};
    if (out.err != RD_KAFKA_RESP_ERR_NO_ERROR || !md)
        return out;
    for (int t = 0; t < md->topic_cnt; ++t) {
        if (md->topics[t].topic != topic)
            continue;
        out.listed = true;
        out.topic_err = md->topics[t].err;
        out.partitions = md->topics[t].partition_cnt;
    }
    return out;
}

int ms_left(std::chrono::steady_clock::time_point deadline)
{
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

// Delivery reports by request id. A report that arrives after produce() gave
// up finds no entry and is dropped, so it never writes to a dead waiter.
struct Deliveries {
    std::mutex mu;
    std::uint64_t next_id = 1;
    struct Result {
        bool done = false;
        rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
        std::int64_t offset = -1;
    };
    std::map<std::uint64_t, Result> pending;
};

extern "C" void on_delivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque)
{
    auto* deliveries = static_cast<Deliveries*>(opaque);
    const auto id = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(m->_private));
    std::lock_guard<std::mutex> lock(deliveries->mu);
    const auto it = deliveries->pending.find(id);
    if (it == deliveries->pending.end())
        return;
    it->second.done = true;
    it->second.err = m->err;
    it->second.offset = m->offset;
}

} // namespace

std::optional<std::string> TestRecord::header(std::string_view name) const
{
    for (const auto& h : headers)
        if (h.name == name)
            return h.value;
    return std::nullopt;
}

struct TestBroker::Impl {
    int brokers = 1;
    RdKafkaPtr host; // hosts the mock cluster's thread; never produces
    MockClusterPtr cluster;
    std::string bootstraps;

    // The kit's own producer (produce(), create_topic()'s metadata waits),
    // created on first use; one caller at a time.
    std::mutex producer_mu;
    Deliveries deliveries;
    RdKafkaPtr producer;
    std::set<std::string> known_topics;

    ~Impl()
    {
        producer.reset();
        cluster.reset(); // before its host handle
        host.reset();
    }

    rd_kafka_t* client()
    {
        if (!producer) {
            ConfPtr conf{rd_kafka_conf_new()};
            set(conf.get(), "bootstrap.servers", bootstraps);
            set(conf.get(), "client.id", "idemkafka-test-broker-producer");
            set(conf.get(), "linger.ms", "0");
            set(conf.get(), "message.timeout.ms", std::to_string(produce_timeout.count() * 1000));
            quiet(conf.get());
            rd_kafka_conf_set_dr_msg_cb(conf.get(), on_delivery);
            rd_kafka_conf_set_opaque(conf.get(), &deliveries);
            producer = new_client(RD_KAFKA_PRODUCER, std::move(conf), "producer");
        }
        return producer.get();
    }

    // Producing names the topic in a metadata request, and librdkafka 2.0's
    // mock cluster creates any topic named there (4 partitions): refuse a
    // topic create_topic() did not make, on every librdkafka alike.
    void require_topic(rd_kafka_t* rk, const std::string& topic)
    {
        if (known_topics.count(topic) != 0)
            return;
        const TopicMetadata md = topic_metadata(rk, topic, produce_timeout);
        if (md.err != RD_KAFKA_RESP_ERR_NO_ERROR)
            throw KafkaError(
                fmt::format("TestBroker::produce to {}: metadata request failed: {}", topic, err_text(md.err)));
        if (!md.listed)
            throw KafkaError(
                fmt::format("TestBroker::produce to {}: no such topic (create it with create_topic())", topic));
        known_topics.insert(topic);
    }

    std::int64_t produce(const std::string& topic, std::int32_t partition, const std::optional<std::string>& key,
                         const std::optional<std::string>& value, const std::vector<Header>& headers)
    {
        std::lock_guard<std::mutex> lock(producer_mu);
        rd_kafka_t* rk = client();
        require_topic(rk, topic);
        std::uint64_t id = 0;
        {
            std::lock_guard<std::mutex> dl(deliveries.mu);
            id = deliveries.next_id++;
            deliveries.pending.emplace(id, Deliveries::Result{});
        }
        try {
            send(rk, topic, partition, key, value, headers, id);
        } catch (const KafkaError&) {
            std::lock_guard<std::mutex> dl(deliveries.mu);
            deliveries.pending.erase(id);
            throw;
        }
        return await_delivery(rk, topic, id);
    }

    // Hands the record to librdkafka; its delivery report comes with `id`.
    static void send(rd_kafka_t* rk, const std::string& topic, std::int32_t partition,
                     const std::optional<std::string>& key, const std::optional<std::string>& value,
                     const std::vector<Header>& headers, std::uint64_t id)
    {
        HeadersPtr hdrs{rd_kafka_headers_new(headers.size())};
        for (const auto& h : headers)
            rd_kafka_header_add(hdrs.get(), h.name.data(), static_cast<ssize_t>(h.name.size()),
                                h.value ? h.value->data() : nullptr,
                                h.value ? static_cast<ssize_t>(h.value->size()) : 0);
        // rd_kafka_produceva(), not the producev() macros: those use GNU
        // statement expressions, which -Wpedantic refuses under clang.
        rd_kafka_vu_t vus[7] = {};
        vus[0].vtype = RD_KAFKA_VTYPE_TOPIC;
        vus[0].u.cstr = topic.c_str();
        vus[1].vtype = RD_KAFKA_VTYPE_PARTITION;
        vus[1].u.i32 = partition;
        vus[2].vtype = RD_KAFKA_VTYPE_KEY; // copied (RD_KAFKA_MSG_F_COPY), so const_cast is safe
        vus[2].u.mem.ptr = key ? const_cast<char*>(key->data()) : nullptr;
        vus[2].u.mem.size = key ? key->size() : 0;
        vus[3].vtype = RD_KAFKA_VTYPE_VALUE;
        vus[3].u.mem.ptr = value ? const_cast<char*>(value->data()) : nullptr;
        vus[3].u.mem.size = value ? value->size() : 0;
        vus[4].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vus[4].u.i = RD_KAFKA_MSG_F_COPY;
        vus[5].vtype = RD_KAFKA_VTYPE_HEADERS;
        vus[5].u.headers = hdrs.get();
        vus[6].vtype = RD_KAFKA_VTYPE_OPAQUE;
        // librdkafka hands the opaque back as the delivery report's id.
        // NOLINTNEXTLINE(performance-no-int-to-ptr)
        vus[6].u.ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(id));
        if (rd_kafka_error_t* error = rd_kafka_produceva(rk, vus, std::size(vus))) {
            const std::string why = fmt::format("{} ({})", rd_kafka_error_string(error), rd_kafka_error_name(error));
            rd_kafka_error_destroy(error);
            throw KafkaError(fmt::format("TestBroker::produce to {}: {}", topic, why));
        }
        (void)hdrs.release(); // the message owns them now
    }

    // The offset of the record sent with `id`, once acknowledged; throws when
    // it failed or produce_timeout passed first.
    std::int64_t await_delivery(rd_kafka_t* rk, const std::string& topic, std::uint64_t id)
    {
        const auto deadline = std::chrono::steady_clock::now() + produce_timeout;
        for (;;) {
            rd_kafka_poll(rk, std::min(100, ms_left(deadline)));
            std::lock_guard<std::mutex> dl(deliveries.mu);
            const auto result = deliveries.pending.at(id);
            if (result.done) {
                deliveries.pending.erase(id);
                if (result.err != RD_KAFKA_RESP_ERR_NO_ERROR)
                    throw KafkaError(fmt::format("TestBroker::produce to {}: {}", topic, err_text(result.err)));
                return result.offset;
            }
            if (ms_left(deadline) == 0) {
                deliveries.pending.erase(id);
                break;
            }
        }
        // Not sent again behind the caller's back once it was told it failed.
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(rk, 0);
        throw KafkaError(fmt::format("TestBroker::produce to {}: not acknowledged within {} s (are the brokers down?)",
                                     topic, produce_timeout.count()));
    }
};

TestBroker::TestBroker(int brokers) : impl_(std::make_unique<Impl>())
{
    if (brokers < 1 || brokers > 64)
        throw ConfigError(fmt::format("TestBroker: brokers must be 1 to 64, not {}", brokers));
    impl_->brokers = brokers;
    ConfPtr conf{rd_kafka_conf_new()};
    set(conf.get(), "client.id", "idemkafka-test-broker");
    // Keeps the host handle's notice about its own missing bootstrap.servers quiet.
    set(conf.get(), "log_level", "4");
    impl_->host = new_client(RD_KAFKA_PRODUCER, std::move(conf), "mock cluster's host handle");
    impl_->cluster.reset(rd_kafka_mock_cluster_new(impl_->host.get(), brokers));
    if (!impl_->cluster)
        throw KafkaError(fmt::format("TestBroker: librdkafka {} could not create a mock cluster of {} broker(s)",
                                     rd_kafka_version_str(), brokers));
    impl_->bootstraps = rd_kafka_mock_cluster_bootstraps(impl_->cluster.get());
}

TestBroker::~TestBroker() = default;
TestBroker::TestBroker(TestBroker&&) noexcept = default;
TestBroker& TestBroker::operator=(TestBroker&&) noexcept = default;

std::string TestBroker::bootstrap_servers() const
{
    return impl_->bootstraps;
}

int TestBroker::broker_count() const noexcept
{
    return impl_->brokers;
}

void TestBroker::configure(ConsumerConfig& cfg) const
{
    cfg.brokers = impl_->bootstraps;
    const auto protocol = cfg.kafka.find("group.protocol");
    if (protocol != cfg.kafka.end() && protocol->second == "consumer")
        return;
    cfg.kafka.emplace("session.timeout.ms", "6000");
    cfg.kafka.emplace("heartbeat.interval.ms", "500");
}

void TestBroker::create_topic(const std::string& name, int partitions)
{
    if (name.empty())
        throw ConfigError("TestBroker::create_topic: empty topic name");
    if (partitions < 1 || partitions > 100000)
        throw ConfigError(
            fmt::format("TestBroker::create_topic {}: partitions must be 1 to 100000, not {}", name, partitions));
    const rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(impl_->cluster.get(), name.c_str(), partitions, 1);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("TestBroker::create_topic {}: {}", name, err_text(err)));

    std::lock_guard<std::mutex> lock(impl_->producer_mu);
    rd_kafka_t* rk = impl_->client();
    const auto deadline = std::chrono::steady_clock::now() + topic_timeout;
    TopicMetadata md;
    for (;;) {
        md = topic_metadata(rk, name, std::chrono::milliseconds(std::clamp(ms_left(deadline), 1, 2000)));
        if (md.err == RD_KAFKA_RESP_ERR_NO_ERROR && md.listed && md.topic_err == RD_KAFKA_RESP_ERR_NO_ERROR &&
            md.partitions == partitions) {
            impl_->known_topics.insert(name);
            return;
        }
        if (ms_left(deadline) == 0)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string seen = md.err != RD_KAFKA_RESP_ERR_NO_ERROR ? "metadata request failed: " + err_text(md.err)
                             : !md.listed                         ? std::string("topic not listed")
                                          : fmt::format("{} of {} partitions listed ({})", md.partitions, partitions,
                                                        err_text(md.topic_err));
    throw KafkaError(fmt::format("TestBroker::create_topic {}: metadata not complete within {} s: {}", name,
                                 topic_timeout.count(), seen));
}

std::int64_t TestBroker::produce(const std::string& topic, const std::optional<std::string>& key,
                                 const std::optional<std::string>& value, const std::vector<Header>& headers)
{
    return impl_->produce(topic, RD_KAFKA_PARTITION_UA, key, value, headers);
}

std::int64_t TestBroker::produce(const std::string& topic, std::int32_t partition,
                                 const std::optional<std::string>& key, const std::optional<std::string>& value,
                                 const std::vector<Header>& headers)
{
    if (partition < 0)
        throw ConfigError(fmt::format("TestBroker::produce to {}: partition {} is negative", topic, partition));
    return impl_->produce(topic, partition, key, value, headers);
}

namespace {

TestRecord record_of(const std::string& topic, const rd_kafka_message_t* m)
{
    const Record read = detail::kafka::record_of(*m);
    TestRecord r;
    r.topic = topic;
    r.partition = read.partition;
    r.offset = read.offset;
    r.key = detail::kafka::owned(read.key);
    r.value = detail::kafka::owned(read.value);
    r.headers = read.headers;
    return r;
}

// Assigns every non-empty partition from its beginning; returns each one's
// high watermark (partition -> the end still to reach).
template <class Fail>
std::map<std::int32_t, std::int64_t> assign_to_ends(rd_kafka_t* rk, const std::string& topic, int partitions,
                                                    std::chrono::steady_clock::time_point deadline, const Fail& fail)
{
    std::map<std::int32_t, std::int64_t> ends;
    PartitionListPtr assignment{rd_kafka_topic_partition_list_new(partitions)};
    for (std::int32_t p = 0; p < partitions; ++p) {
        std::int64_t low = 0;
        std::int64_t high = 0;
        const rd_kafka_resp_err_t err =
            rd_kafka_query_watermark_offsets(rk, topic.c_str(), p, &low, &high, std::max(1, ms_left(deadline)));
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
            throw fail(fmt::format("watermarks of partition {}: {}", p, err_text(err)));
        if (high > low) {
            ends[p] = high;
            rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), p)->offset = RD_KAFKA_OFFSET_BEGINNING;
        }
    }
    if (!ends.empty())
        if (const rd_kafka_resp_err_t err = rd_kafka_assign(rk, assignment.get()))
            throw fail("assign: " + err_text(err));
    return ends;
}

// A consumer of the cluster at `bootstraps` for read_all(): it joins no
// group (assign, not subscribe) and commits nothing.
RdKafkaPtr reader(const std::string& bootstraps)
{
    ConfPtr conf{rd_kafka_conf_new()};
    set(conf.get(), "bootstrap.servers", bootstraps);
    set(conf.get(), "client.id", "idemkafka-test-broker-reader");
    // Needed by the consumer API; no group is joined (assign, not subscribe) and nothing is committed.
    set(conf.get(), "group.id", "idemkafka-test-broker-reader");
    set(conf.get(), "enable.auto.commit", "false");
    set(conf.get(), "enable.auto.offset.store", "false");
    set(conf.get(), "enable.partition.eof", "true");
    quiet(conf.get());
    RdKafkaPtr rk = new_client(RD_KAFKA_CONSUMER, std::move(conf), "reader");
    rd_kafka_poll_set_consumer(rk.get());
    return rk;
}

// Reads the assigned partitions of `topic` up to `ends` (partition -> its
// high watermark as the call started), by partition and offset.
template <class Fail>
std::vector<TestRecord> read_to_ends(rd_kafka_t* rk, const std::string& topic,
                                     std::map<std::int32_t, std::int64_t> ends,
                                     std::chrono::steady_clock::time_point deadline, const Fail& fail)
{
    std::vector<TestRecord> out;
    const std::map<std::int32_t, std::int64_t> limits = ends;
    while (!ends.empty()) {
        const int wait = std::min(100, ms_left(deadline));
        if (wait == 0) {
            std::string open;
            for (const auto& [p, end] : ends)
                open += fmt::format("{}partition {} (end {})", open.empty() ? "" : ", ", p, end);
            throw fail("did not reach the end of " + open + " in time (are the brokers down?)");
        }
        const MessagePtr m{rd_kafka_consumer_poll(rk, wait)};
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            const auto it = ends.find(m->partition);
            if (it != ends.end() && m->offset >= it->second)
                ends.erase(it);
            continue;
        }
        if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            // Transport errors while brokers are down are retried until the deadline.
            if (m->err == RD_KAFKA_RESP_ERR__TRANSPORT || m->err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN)
                continue;
            throw fail(fmt::format("{}", rd_kafka_message_errstr(m.get())));
        }
        TestRecord r = record_of(topic, m.get());
        const auto it = ends.find(r.partition);
        if (it != ends.end() && r.offset + 1 >= it->second)
            ends.erase(it);
        // Records produced after the call started are not part of the answer.
        if (const auto limit = limits.find(r.partition); limit != limits.end() && r.offset < limit->second)
            out.push_back(std::move(r));
    }
    std::sort(out.begin(), out.end(), [](const TestRecord& a, const TestRecord& b) {
        return a.partition != b.partition ? a.partition < b.partition : a.offset < b.offset;
    });
    return out;
}

} // namespace

std::vector<TestRecord> TestBroker::read_all(const std::string& topic, std::chrono::milliseconds timeout) const
{
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const auto fail = [&](const std::string& why) {
        return KafkaError(fmt::format("TestBroker::read_all {}: {} (timeout {} ms)", topic, why, timeout.count()));
    };
    RdKafkaPtr rk = reader(impl_->bootstraps);

    const TopicMetadata md = topic_metadata(rk.get(), topic, std::chrono::milliseconds(std::max(1, ms_left(deadline))));
    if (md.err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw fail("metadata request failed: " + err_text(md.err));
    if (!md.listed)
        return {};
    if (md.topic_err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw fail("metadata: " + err_text(md.topic_err));

    // The end of each partition as the call starts; partitions already at it are done.
    std::map<std::int32_t, std::int64_t> ends = assign_to_ends(rk.get(), topic, md.partitions, deadline, fail);
    if (ends.empty())
        return {};
    return read_to_ends(rk.get(), topic, std::move(ends), deadline, fail);
}

void TestBroker::fail_next_offset_commits(int n)
{
    if (n < 0)
        throw ConfigError(fmt::format("TestBroker::fail_next_offset_commits: n must be 0 or more, not {}", n));
    if (n == 0)
        return;
    const std::vector<rd_kafka_resp_err_t> errors(static_cast<std::size_t>(n), RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS);
    rd_kafka_mock_push_request_errors_array(impl_->cluster.get(), api_offset_commit, errors.size(), errors.data());
}

void TestBroker::clear_offset_commit_failures()
{
    rd_kafka_mock_clear_request_errors(impl_->cluster.get(), api_offset_commit);
}

void TestBroker::take_down()
{
    for (std::int32_t id = 1; id <= impl_->brokers; ++id)
        if (const rd_kafka_resp_err_t err = rd_kafka_mock_broker_set_down(impl_->cluster.get(), id))
            throw KafkaError(fmt::format("TestBroker::take_down: broker {}: {}", id, err_text(err)));
}

void TestBroker::bring_up()
{
    for (std::int32_t id = 1; id <= impl_->brokers; ++id)
        if (const rd_kafka_resp_err_t err = rd_kafka_mock_broker_set_up(impl_->cluster.get(), id))
            throw KafkaError(fmt::format("TestBroker::bring_up: broker {}: {}", id, err_text(err)));
}

} // namespace idemkafka
