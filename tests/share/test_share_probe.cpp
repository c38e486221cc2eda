// librdkafka's share consumer (KIP-932, a preview in 2.15) against the mock broker process:
// the facts IdempotentShareConsumer is to be built on (docs/share-groups.md), each pinned by a
// test case, so that a librdkafka release that changes one of them fails here first.
//
// It needs the mock broker and its control FIFO (IDEMKAFKA_TEST_BROKERS and
// IDEMKAFKA_MOCK_CONTROL, as tests/support/run_isolated.sh starts it): the lock duration, the
// delivery-count limit and the session timeout are settings of the share group, which a share
// consumer cannot set and the mock takes only through its own API.
//
// The program uses librdkafka alone, not the library: nothing of it exists for share groups yet.

#include <librdkafka/rdkafka.h>

#include "catch_compat.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto ack_accept = RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_ACCEPT;
constexpr auto ack_release = RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_RELEASE;
constexpr auto ack_reject = RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_REJECT;

std::string required_env(const char* name)
{
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0')
        throw std::runtime_error(std::string(name) + " is not set: the share probe runs against the mock broker "
                                                     "(tests/support/run_isolated.sh starts one with a control FIFO)");
    return value;
}

std::string unique_name(const char* prefix)
{
    static std::atomic<int> counter{0};
    return std::string(prefix) + "_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
}

// The count of commands the mock broker handled, from its ack file ("<count> ok").
long ack_count(const std::string& path, std::string* text)
{
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr)
        return 0;
    char buf[512] = {};
    const auto n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    if (text != nullptr)
        *text = std::string(buf, n);
    return std::strtol(buf, nullptr, 10);
}

// One command to the mock broker's control FIFO, waited for until it was applied.
void mock_control(const std::string& command)
{
    const std::string fifo = required_env("IDEMKAFKA_MOCK_CONTROL");
    const std::string ack = fifo + ".ack";
    const long before = ack_count(ack, nullptr);
    const std::string line = command + "\n";
    std::FILE* f = std::fopen(fifo.c_str(), "w");
    if (f == nullptr)
        throw std::runtime_error("cannot open the mock broker's control FIFO " + fifo);
    const bool written = std::fwrite(line.data(), 1, line.size(), f) == line.size();
    std::fclose(f);
    if (!written)
        throw std::runtime_error("cannot write to the mock broker's control FIFO " + fifo);
    std::string text;
    const auto deadline = Clock::now() + 10s;
    while (ack_count(ack, &text) <= before) {
        if (Clock::now() > deadline)
            throw std::runtime_error("the mock broker did not answer: " + command);
        std::this_thread::sleep_for(10ms);
    }
    if (text.find(" ok") == std::string::npos)
        throw std::runtime_error("the mock broker refused \"" + command + "\": " + text);
}

// A share-group setting of the mock cluster for one test case; the default comes back after it.
class ShareSetting {
public:
    ShareSetting(const std::string& setting, const std::string& value, std::string default_value)
        : setting_(setting), default_(std::move(default_value))
    {
        mock_control("share-group " + setting + " " + value);
    }
    ShareSetting(const ShareSetting&) = delete;
    ShareSetting& operator=(const ShareSetting&) = delete;
    ~ShareSetting()
    {
        try {
            mock_control("share-group " + setting_ + " " + default_);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "share probe: cannot restore %s: %s\n", setting_.c_str(), e.what());
        }
    }

private:
    std::string setting_;
    std::string default_;
};

// A topic of the mock cluster, created before any share consumer names it (they resolve topics
// by id and create none). Share groups start at the end of a partition by default: earliest
// lets a case produce first and consume afterwards.
std::string new_topic(const char* prefix, int partitions)
{
    mock_control("share-group auto-offset-reset earliest");
    std::string topic = unique_name(prefix);
    mock_control("create-topic " + topic + " " + std::to_string(partitions));
    return topic;
}

struct KafkaDeleter {
    void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct ConfDeleter {
    void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct ShareDeleter {
    void operator()(rd_kafka_share_t* share) const
    {
        if (rd_kafka_error_t* error = rd_kafka_share_destroy(share))
            rd_kafka_error_destroy(error);
    }
};
struct MessagesDeleter {
    void operator()(rd_kafka_messages_t* messages) const { rd_kafka_messages_destroy(messages); }
};
struct ErrorDeleter {
    void operator()(rd_kafka_error_t* error) const { rd_kafka_error_destroy(error); }
};
struct PartitionsDeleter {
    void operator()(rd_kafka_topic_partition_list_t* list) const { rd_kafka_topic_partition_list_destroy(list); }
};
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using Batch = std::unique_ptr<rd_kafka_messages_t, MessagesDeleter>;
using ErrorPtr = std::unique_ptr<rd_kafka_error_t, ErrorDeleter>;

ConfPtr base_conf()
{
    ConfPtr conf{rd_kafka_conf_new()};
    char errstr[512];
    if (rd_kafka_conf_set(conf.get(), "bootstrap.servers", required_env("IDEMKAFKA_TEST_BROKERS").c_str(), errstr,
                          sizeof errstr) != RD_KAFKA_CONF_OK)
        throw std::runtime_error(errstr);
    return conf;
}

void set(rd_kafka_conf_t* conf, const char* name, const char* value)
{
    char errstr[512];
    if (rd_kafka_conf_set(conf, name, value, errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
        throw std::runtime_error(std::string(name) + ": " + errstr);
}

extern "C" void count_failed_delivery(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque)
{
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
        ++*static_cast<int*>(opaque);
}

// Produces `values` to one partition and waits for every acknowledgement.
void produce(const std::string& topic, std::int32_t partition, const std::vector<std::string>& values)
{
    int failed = 0;
    ConfPtr conf = base_conf();
    rd_kafka_conf_set_dr_msg_cb(conf.get(), count_failed_delivery);
    rd_kafka_conf_set_opaque(conf.get(), &failed);
    char errstr[512];
    std::unique_ptr<rd_kafka_t, KafkaDeleter> producer{
        rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr)};
    REQUIRE(producer);
    (void)conf.release(); // rd_kafka_new took it
    for (const std::string& value : values) {
        const rd_kafka_resp_err_t err =
            rd_kafka_producev(producer.get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition),
                              RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        REQUIRE(err == RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    REQUIRE(rd_kafka_flush(producer.get(), 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    REQUIRE(failed == 0);
}

std::vector<std::string> values(const std::string& prefix, int count)
{
    std::vector<std::string> out;
    out.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i)
        out.push_back(prefix + std::to_string(i));
    return out;
}

// One delivery of a record to a member, as the share consumer reports it.
struct Delivery {
    std::string value;
    std::int32_t partition = -1;
    std::int64_t offset = -1;
    std::int16_t count = 0; // rd_kafka_message_delivery_count()
};

Delivery delivery_of(const rd_kafka_message_t* m)
{
    REQUIRE(m->err == RD_KAFKA_RESP_ERR_NO_ERROR);
    Delivery d;
    d.value.assign(static_cast<const char*>(m->payload), m->len);
    d.partition = m->partition;
    d.offset = m->offset;
    d.count = rd_kafka_message_delivery_count(m);
    return d;
}

// A share consumer in explicit acknowledgement mode, used from one thread.
class Member {
public:
    Member(const std::string& group, const std::string& topic)
    {
        ConfPtr conf = base_conf();
        set(conf.get(), "group.id", group.c_str());
        set(conf.get(), "share.acknowledgement.mode", "explicit");
        char errstr[512];
        share_.reset(rd_kafka_share_consumer_new(conf.get(), errstr, sizeof errstr));
        if (!share_)
            throw std::runtime_error(std::string("rd_kafka_share_consumer_new: ") + errstr);
        (void)conf.release(); // the share consumer took it
        std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionsDeleter> topics{
            rd_kafka_topic_partition_list_new(1)};
        rd_kafka_topic_partition_list_add(topics.get(), topic.c_str(), RD_KAFKA_PARTITION_UA);
        REQUIRE(rd_kafka_share_subscribe(share_.get(), topics.get()) == RD_KAFKA_RESP_ERR_NO_ERROR);
    }
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    ~Member()
    {
        if (share_)
            ErrorPtr{rd_kafka_share_consumer_close(share_.get())};
    }

    /// One poll: a batch (null when none came within `timeout`) and the poll's error code.
    Batch poll(std::chrono::milliseconds timeout, rd_kafka_resp_err_t& err)
    {
        rd_kafka_messages_t* batch = nullptr;
        ErrorPtr error{rd_kafka_share_poll(share_.get(), static_cast<int>(timeout.count()), &batch)};
        err = error ? rd_kafka_error_code(error.get()) : RD_KAFKA_RESP_ERR_NO_ERROR;
        return Batch{batch};
    }

    /// The first batch within `timeout` (null when none came); a poll error fails the test.
    Batch next(std::chrono::milliseconds timeout)
    {
        const auto deadline = Clock::now() + timeout;
        while (Clock::now() < deadline) {
            rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
            Batch batch = poll(200ms, err);
            INFO("rd_kafka_share_poll: " << rd_kafka_err2name(err));
            REQUIRE(err == RD_KAFKA_RESP_ERR_NO_ERROR);
            if (batch && rd_kafka_messages_count(batch.get()) > 0)
                return batch;
        }
        return nullptr;
    }

    void acknowledge(const rd_kafka_message_t* m, rd_kafka_share_AcknowledgeType_t type)
    {
        REQUIRE(rd_kafka_share_acknowledge_type(share_.get(), m, type) == RD_KAFKA_RESP_ERR_NO_ERROR);
    }

    /// rd_kafka_share_commit_sync: the broker's answer per partition (empty: nothing was pending).
    std::map<std::int32_t, rd_kafka_resp_err_t> commit()
    {
        rd_kafka_topic_partition_list_t* raw = nullptr;
        ErrorPtr error{rd_kafka_share_commit_sync(share_.get(), 10000, &raw)};
        std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionsDeleter> results{raw};
        INFO("rd_kafka_share_commit_sync: " << (error ? rd_kafka_error_string(error.get()) : "ok"));
        REQUIRE(!error);
        std::map<std::int32_t, rd_kafka_resp_err_t> out;
        for (int i = 0; results && i < results->cnt; ++i)
            out[results->elems[i].partition] = results->elems[i].err;
        return out;
    }

    /// Acknowledges every record of `batch` as `decide` says, commits, and requires the broker to
    /// have taken every acknowledgement. Returns the deliveries.
    template <class Decide> std::vector<Delivery> settle(const Batch& batch, Decide&& decide)
    {
        std::vector<Delivery> out;
        for (std::size_t i = 0; i < rd_kafka_messages_count(batch.get()); ++i) {
            const rd_kafka_message_t* m = rd_kafka_messages_get(batch.get(), i);
            out.push_back(delivery_of(m));
            acknowledge(m, decide(out.back()));
        }
        for (const auto& [partition, err] : commit()) {
            INFO("partition " << partition << ": " << rd_kafka_err2name(err));
            CHECK(err == RD_KAFKA_RESP_ERR_NO_ERROR);
        }
        return out;
    }

    /// Polls for `how_long`, accepting whatever comes; returns it (the cases expect nothing).
    std::vector<Delivery> quiet(std::chrono::milliseconds how_long)
    {
        std::vector<Delivery> out;
        const auto until = Clock::now() + how_long;
        while (Clock::now() < until) {
            if (Batch batch = next(200ms)) {
                for (Delivery& d : settle(batch, [](const Delivery&) { return ack_accept; }))
                    out.push_back(std::move(d));
            }
        }
        return out;
    }

    /// Gone as a kill -9 leaves it: no close, no final acknowledgement, its connections dropped.
    void crash()
    {
        if (rd_kafka_error_t* error =
                rd_kafka_share_destroy_flags(share_.release(), RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE))
            rd_kafka_error_destroy(error);
    }

private:
    std::unique_ptr<rd_kafka_share_t, ShareDeleter> share_;
};

std::string describe(const std::vector<Delivery>& deliveries)
{
    std::string out;
    for (const Delivery& d : deliveries)
        out += (out.empty() ? "" : ", ") + d.value + "@" + std::to_string(d.partition) + ":" +
               std::to_string(d.offset) + " (delivery " + std::to_string(d.count) + ")";
    return out.empty() ? "nothing" : out;
}

} // namespace

TEST_CASE("explicit acknowledgement: ACCEPT ends a record, RELEASE brings it back with delivery count 2, REJECT "
          "ends it unprocessed; no poll while a record is unacknowledged",
          "[share]")
{
    const std::string topic = new_topic("share_ack", 1);
    produce(topic, 0, values("v", 10));
    Member member(unique_name("share_ack_group"), topic);

    std::map<std::string, std::vector<std::int16_t>> counts; // value -> delivery counts, in order
    bool refused_checked = false;
    const auto deadline = Clock::now() + 30s;
    const auto all_seen = [&] {
        const auto v3 = counts.find("v3");
        return counts.size() == 10 && v3 != counts.end() && v3->second.size() == 2;
    };
    while (Clock::now() < deadline && !all_seen()) {
        Batch batch = member.next(1s);
        if (!batch)
            continue;
        if (!refused_checked) {
            // Explicit mode: the next poll is refused while one record of this batch is
            // unacknowledged, and fetches nothing.
            rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
            const Batch refused = member.poll(100ms, err);
            CHECK(err == RD_KAFKA_RESP_ERR__STATE);
            CHECK(!refused);
            refused_checked = true;
        }
        for (const Delivery& d : member.settle(batch, [](const Delivery& d) {
                 if (d.value == "v3" && d.count == 1)
                     return ack_release;
                 return d.value == "v5" ? ack_reject : ack_accept;
             }))
            counts[d.value].push_back(d.count);
    }

    CHECK(refused_checked);
    REQUIRE(counts.size() == 10);
    for (const auto& [value, seen] : counts) {
        INFO(value);
        CHECK(seen == (value == "v3" ? std::vector<std::int16_t>{1, 2} : std::vector<std::int16_t>{1}));
    }
    // Neither the accepted records nor the rejected one come again.
    const auto later = member.quiet(3s);
    INFO("after the acknowledgements: " << describe(later));
    CHECK(later.empty());
}

TEST_CASE("the acquisition lock: a record not acknowledged within it comes again with delivery count 2, and the "
          "late ACCEPT is refused for its partition",
          "[share]")
{
    const ShareSetting lock("lock-duration-ms", "1000", "30000");
    const std::string topic = new_topic("share_lock", 1);
    produce(topic, 0, {"slow"});
    Member member(unique_name("share_lock_group"), topic);

    Batch batch = member.next(15s);
    REQUIRE(batch);
    REQUIRE(rd_kafka_messages_count(batch.get()) == 1);
    const rd_kafka_message_t* m = rd_kafka_messages_get(batch.get(), 0);
    CHECK(delivery_of(m).count == 1);

    // A handler slower than the lock (the mock looks for expired locks once a second).
    std::this_thread::sleep_for(2500ms);
    member.acknowledge(m, ack_accept); // taken locally: the client does not know the lock's age
    const auto results = member.commit();
    REQUIRE(results.count(0) == 1);
    INFO("the late ACCEPT: " << rd_kafka_err2name(results.at(0)));
    CHECK(results.at(0) == RD_KAFKA_RESP_ERR_INVALID_RECORD_STATE);
    batch.reset();

    Batch again = member.next(15s);
    REQUIRE(again);
    const auto redelivered = member.settle(again, [](const Delivery&) { return ack_accept; });
    INFO("redelivered: " << describe(redelivered));
    REQUIRE(redelivered.size() == 1);
    CHECK(redelivered[0].value == "slow");
    CHECK(redelivered[0].count == 2);
    const auto later = member.quiet(2s);
    INFO("after the second ACCEPT: " << describe(later));
    CHECK(later.empty());
}

TEST_CASE("the delivery-count limit: the delivery whose count reaches the limit is the last one; released, the "
          "record is archived without a word",
          "[share]")
{
    const ShareSetting limit("delivery-limit", "3", "5");
    const std::string topic = new_topic("share_limit", 1);
    produce(topic, 0, {"poison"});
    Member member(unique_name("share_limit_group"), topic);

    for (std::int16_t expected = 1; expected <= 3; ++expected) {
        Batch batch = member.next(15s);
        REQUIRE(batch);
        const auto got = member.settle(batch, [](const Delivery&) { return ack_release; });
        INFO("delivery " << expected << ": " << describe(got));
        REQUIRE(got.size() == 1);
        CHECK(got[0].count == expected);
    }
    const auto later = member.quiet(3s);
    INFO("after the third RELEASE: " << describe(later));
    CHECK(later.empty());
}

TEST_CASE("a member that dies without acknowledging: another member gets its records with delivery count 2, long "
          "before their locks expire",
          "[share]")
{
    // A dead member keeps its partitions in the mock until its share session times out.
    const ShareSetting session("session-timeout-ms", "3000", "45000");
    const ShareSetting heartbeat("heartbeat-interval-ms", "500", "5000");
    const std::string topic = new_topic("share_crash", 1);
    produce(topic, 0, values("c", 5));
    const std::string group = unique_name("share_crash_group");

    std::size_t taken = 0;
    {
        Member doomed(group, topic);
        Batch batch = doomed.next(15s);
        REQUIRE(batch);
        taken = rd_kafka_messages_count(batch.get());
        for (std::size_t i = 0; i < taken; ++i)
            CHECK(delivery_of(rd_kafka_messages_get(batch.get(), i)).count == 1);
        batch.reset();
        doomed.crash();
    }
    const auto crashed = Clock::now();

    Member heir(group, topic);
    std::vector<Delivery> inherited;
    while (inherited.size() < 5 && Clock::now() < crashed + 25s) {
        if (Batch batch = heir.next(1s)) {
            for (Delivery& d : heir.settle(batch, [](const Delivery&) { return ack_accept; }))
                inherited.push_back(std::move(d));
        }
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - crashed);
    std::printf("share probe: %zu records taken by the member that died came to the next one after %lld ms\n", taken,
                static_cast<long long>(waited.count()));
    INFO("inherited: " << describe(inherited));
    REQUIRE(inherited.size() == 5);
    for (const Delivery& d : inherited) {
        INFO(d.value);
        // The records the dead member held were delivered a second time; the others a first.
        CHECK(d.count == (d.offset < static_cast<std::int64_t>(taken) ? 2 : 1));
    }
    CHECK(waited < 20s); // the lock is 30 s: the mock released them when the connection dropped
}

TEST_CASE("three members on two partitions: the mock assigns each partition to one member, and each record is "
          "delivered once",
          "[share]")
{
    const ShareSetting session("session-timeout-ms", "3000", "45000");
    const ShareSetting heartbeat("heartbeat-interval-ms", "500", "5000");
    const std::string topic = new_topic("share_three", 2);
    const std::string group = unique_name("share_three_group");
    std::vector<std::unique_ptr<Member>> members;
    for (int i = 0; i < 3; ++i)
        members.push_back(std::make_unique<Member>(group, topic));
    // Every member joined and the assignment settled (heartbeats every 500 ms).
    for (const auto& m : members)
        CHECK(m->quiet(1s).empty());

    produce(topic, 0, values("p0-", 20));
    produce(topic, 1, values("p1-", 20));

    std::map<std::string, std::vector<std::int16_t>> counts;
    std::map<std::int32_t, std::set<std::size_t>> members_of; // partition -> members it went to
    std::set<std::size_t> busy;
    std::size_t total = 0;
    const auto deadline = Clock::now() + 30s;
    while (total < 40 && Clock::now() < deadline) {
        for (std::size_t i = 0; i < members.size(); ++i) {
            if (Batch batch = members[i]->next(200ms)) {
                for (const Delivery& d : members[i]->settle(batch, [](const Delivery&) { return ack_accept; })) {
                    counts[d.value].push_back(d.count);
                    members_of[d.partition].insert(i);
                    busy.insert(i);
                    ++total;
                }
            }
        }
    }
    std::printf("share probe: 3 members, 2 partitions: %zu member(s) received records\n", busy.size());
    REQUIRE(total == 40);
    CHECK(counts.size() == 40);
    for (const auto& [value, seen] : counts) {
        INFO(value);
        CHECK(seen == std::vector<std::int16_t>{1});
    }
    CHECK(busy.size() == 2);
    for (const auto& [partition, to] : members_of) {
        INFO("partition " << partition);
        CHECK(to.size() == 1);
    }
}
