#include "kafka/share_member.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail::kafka {

void ShareDeleter::operator()(rd_kafka_share_t* p) const noexcept
{
    // Without a close first (a crash, a failed start): pending
    // acknowledgements are dropped and the broker releases the locks.
    if (rd_kafka_error_t* error = rd_kafka_share_destroy_flags(p, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE))
        rd_kafka_error_destroy(error);
}

namespace {

void share_log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf)
{
    auto* owner = static_cast<ClientOwner*>(rd_kafka_opaque(rk));
    std::lock_guard<std::mutex> lock(owner->log_mu);
    if (!owner->log)
        return;
    try {
        emit(owner->log, log_level(level), fmt::format("rdkafka {}: {}", fac, buf), "librdkafka", {{"facility", fac}});
    } catch (...) {
        // out of memory: the line is lost, librdkafka's thread goes on
    }
}

std::string message_of(const rd_kafka_error_t* error)
{
    return error ? rd_kafka_error_string(error) : "";
}

} // namespace

ShareMember::ShareMember(const Settings& settings, LogSink log, Redactor secrets) : secrets_(std::move(secrets))
{
    owner_.log = std::move(log);
    auto conf = make_conf(settings.kafka);
    set(conf.get(), "bootstrap.servers", settings.brokers);
    set(conf.get(), "group.id", settings.group);
    // Explicit: a record is acknowledged only once its outcome is durable.
    set(conf.get(), "share.acknowledgement.mode", "explicit");
    if (!settings.kafka.count("max.poll.records"))
        set(conf.get(), "max.poll.records", std::to_string(settings.max_poll_records));
    rd_kafka_conf_set_opaque(conf.get(), &owner_);
    rd_kafka_conf_set_log_cb(conf.get(), share_log_cb);
    char err[512];
    share_.reset(rd_kafka_share_consumer_new(conf.get(), err, sizeof err));
    if (!share_)
        throw KafkaError(secrets_(fmt::format("cannot create the Kafka share consumer: {}", err)));
    (void)conf.release(); // owned by the share consumer now
    PartitionListPtr topics = make_list(static_cast<int>(settings.topics.size()));
    for (const auto& t : settings.topics)
        rd_kafka_topic_partition_list_add(topics.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
    if (const auto e = rd_kafka_share_subscribe(share_.get(), topics.get()); e != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("cannot subscribe the share consumer: {}", rd_kafka_err2str(e)));
}

ShareMember::~ShareMember()
{
    owner_.silence(); // librdkafka's threads may log while the handle goes
}

ShareMember::Batch ShareMember::poll(std::chrono::milliseconds timeout)
{
    rd_kafka_messages_t* raw = nullptr;
    ErrorPtr error(rd_kafka_share_poll(share_.get(), static_cast<int>(timeout.count()), &raw));
    Batch batch{MessagesPtr(raw)};
    if (error && rd_kafka_error_code(error.get()) != RD_KAFKA_RESP_ERR__TIMED_OUT) {
        say(owner_.log, LogLevel::warning, error_field(message_of(error.get())), "share consumer poll failed: {}",
            message_of(error.get()));
        batch.messages.reset();
        batch.failed = true;
    }
    return batch;
}

bool ShareMember::acknowledge(const rd_kafka_message_t* m, Ack type)
{
    const auto t = type == Ack::accept    ? RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_ACCEPT
                   : type == Ack::release ? RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_RELEASE
                                          : RD_KAFKA_SHARE_ACKNOWLEDGE_TYPE_REJECT;
    const auto e = rd_kafka_share_acknowledge_type(share_.get(), m, t);
    if (e == RD_KAFKA_RESP_ERR_NO_ERROR)
        return true;
    say(owner_.log, LogLevel::error, coordinates(rd_kafka_topic_name(m->rkt), m->partition, m->offset),
        "librdkafka refused to record the acknowledgement of {}/{}@{}: {}", rd_kafka_topic_name(m->rkt), m->partition,
        m->offset, rd_kafka_err2str(e));
    return false;
}

std::vector<ShareMember::Refused> ShareMember::commit(std::chrono::milliseconds timeout)
{
    rd_kafka_topic_partition_list_t* raw = nullptr;
    ErrorPtr error(rd_kafka_share_commit_sync(share_.get(), static_cast<int>(timeout.count()), &raw));
    PartitionListPtr results(raw);
    std::vector<Refused> out;
    if (error)
        out.push_back({"", -1, message_of(error.get())});
    for (int i = 0; results && i < results->cnt; ++i) {
        const auto& p = results->elems[i];
        if (p.err != RD_KAFKA_RESP_ERR_NO_ERROR)
            out.push_back({p.topic, p.partition, rd_kafka_err2name(p.err)});
    }
    return out;
}

void ShareMember::close()
{
    if (closed_)
        return;
    closed_ = true;
    if (rd_kafka_error_t* error = rd_kafka_share_consumer_close(share_.get())) {
        say(owner_.log, LogLevel::warning, error_field(message_of(error)), "share consumer close: {}",
            message_of(error));
        rd_kafka_error_destroy(error);
    }
    // Closed: destroy without a second close.
    if (rd_kafka_error_t* error = rd_kafka_share_destroy(share_.release()))
        rd_kafka_error_destroy(error);
}

} // namespace idemkafka::detail::kafka
