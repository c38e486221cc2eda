#include "idemkafka/publisher.hpp"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "kafka/client.hpp"
#include "observe/log_context.hpp"
#include "observe/trace.hpp"

namespace idemkafka {
namespace {

constexpr std::chrono::milliseconds queue_wait{10000};

// After a timeout: how long the delivery reports of withdrawn records may take to arrive.
constexpr std::chrono::milliseconds withdraw_wait{1000};

} // namespace

namespace detail {

// One tracked record's outcome, shared by its DeliveryStatus handles and, until its
// delivery report arrives, by librdkafka (the message's opaque holds a
// reference, released by the report).
struct DeliveryState {
    std::atomic<bool> done{false};
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR; // written before `done`
    std::string timeout_note;                             // the call that gave up waiting: why
};

} // namespace detail

using Waiter = detail::DeliveryState;

DeliveryStatus::State DeliveryStatus::state() const noexcept
{
    if (!s_ || !s_->done.load(std::memory_order_acquire))
        return State::in_flight;
    return s_->err == RD_KAFKA_RESP_ERR_NO_ERROR ? State::acknowledged : State::failed;
}

std::string DeliveryStatus::error() const
{
    switch (state()) {
    case State::acknowledged:
        return {};
    case State::failed:
        return rd_kafka_err2str(s_->err);
    case State::in_flight:
        break;
    }
    return s_ && !s_->timeout_note.empty() ? s_->timeout_note : "in flight";
}

void PublisherConfig::validate() const
{
    if (brokers.empty())
        throw ConfigError("brokers: must name at least one bootstrap server");
    for (const auto& [k, v] : kafka) {
        if (k == "enable.idempotence" && v != "true")
            throw ConfigError(fmt::format("kafka[\"enable.idempotence\"]={}: refused, the publisher is always "
                                          "idempotent so a retried send cannot duplicate a record",
                                          v));
        if ((k == "acks" || k == "request.required.acks") && v != "all" && v != "-1")
            throw ConfigError(fmt::format("kafka[\"{}\"]={}: refused, only acks=all keeps an acknowledged "
                                          "record through a broker failure",
                                          k, v));
        if (k == "bootstrap.servers" || k == "metadata.broker.list")
            throw ConfigError(fmt::format("kafka[\"{}\"]: set PublisherConfig::brokers instead", k));
    }
}

struct Publisher::Impl : detail::kafka::ClientOwner { // its log: of the publisher and of librdkafka
    detail::kafka::HandlePtr rk;
    std::atomic<std::uint64_t> delivered{0}, failed{0};
    std::mutex mu;
    // send_all() one call at a time: its timeout withdraws every record not
    // sent yet.
    std::mutex all_mu;
    std::uint64_t failed_since_flush = 0;
    std::string first_error;

    static void dr_cb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque)
    {
        auto* self = static_cast<Impl*>(static_cast<detail::kafka::ClientOwner*>(opaque));
        if (m->_private) {
            // The reference produce() gave the message.
            const std::unique_ptr<std::shared_ptr<Waiter>> ref(static_cast<std::shared_ptr<Waiter>*>(m->_private));
            (*ref)->err = m->err;
            (*ref)->done.store(true, std::memory_order_release);
        }
        if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            self->delivered.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        self->failed.fetch_add(1, std::memory_order_relaxed);
        const std::string reason = fmt::format("delivery to {}/{} failed: {}", rd_kafka_topic_name(m->rkt),
                                               m->partition, rd_kafka_err2str(m->err));
        detail::emit(self->log, LogLevel::error, reason, "publisher",
                     {{log_field::topic, rd_kafka_topic_name(m->rkt)},
                      {log_field::partition, std::to_string(m->partition)},
                      {log_field::error, rd_kafka_err2str(m->err)}});
        if (!m->_private) {
            std::lock_guard<std::mutex> lock(self->mu);
            if (self->failed_since_flush++ == 0)
                self->first_error = reason;
        }
    }

    // `waiter`, when given, learns the record's outcome: the message holds a
    // reference to it until its delivery report.
    void produce(std::string_view topic, std::optional<std::string_view> key, std::optional<std::string_view> payload,
                 const std::vector<Header>& given, const std::shared_ptr<Waiter>& waiter)
    {
        std::unique_ptr<std::shared_ptr<Waiter>> ref;
        if (waiter)
            ref = std::make_unique<std::shared_ptr<Waiter>>(waiter);
        std::vector<Header> traced;
        const auto& headers = detail::with_trace(given, traced); // inside a handler: the record's trace context
        rd_kafka_headers_t* hdrs = nullptr;
        if (!headers.empty()) {
            hdrs = rd_kafka_headers_new(headers.size());
            for (const auto& h : headers)
                rd_kafka_header_add(hdrs, h.name.data(), static_cast<ssize_t>(h.name.size()),
                                    h.value ? h.value->data() : nullptr,
                                    h.value ? static_cast<ssize_t>(h.value->size()) : 0);
        }
        const std::string topic_s(topic);
        // rd_kafka_produceva() rather than rd_kafka_producev(): the RD_KAFKA_V_*
        // macros expand to GNU statement expressions, which -Wpedantic refuses
        // under clang. Same contract: the headers stay ours when it fails.
        rd_kafka_vu_t vus[6] = {};
        vus[0].vtype = RD_KAFKA_VTYPE_TOPIC;
        vus[0].u.cstr = topic_s.c_str();
        vus[1].vtype = RD_KAFKA_VTYPE_KEY;
        vus[1].u.mem.ptr = key ? const_cast<char*>(key->data()) : nullptr;
        vus[1].u.mem.size = key ? key->size() : 0;
        vus[2].vtype = RD_KAFKA_VTYPE_VALUE;
        vus[2].u.mem.ptr = payload ? const_cast<char*>(payload->data()) : nullptr;
        vus[2].u.mem.size = payload ? payload->size() : 0;
        vus[3].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vus[3].u.i = RD_KAFKA_MSG_F_COPY;
        vus[4].vtype = RD_KAFKA_VTYPE_OPAQUE;
        vus[4].u.ptr = ref.get();
        std::size_t n = 5;
        if (hdrs) {
            vus[n].vtype = RD_KAFKA_VTYPE_HEADERS;
            vus[n].u.headers = hdrs;
            ++n;
        }
        const auto deadline = std::chrono::steady_clock::now() + queue_wait;
        for (;;) {
            const detail::kafka::ErrorPtr error(rd_kafka_produceva(rk.get(), vus, n));
            if (!error) {
                (void)ref.release(); // the message's now, freed by its delivery report
                return;              // the headers too
            }
            const auto err = rd_kafka_error_code(error.get());
            if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && std::chrono::steady_clock::now() < deadline) {
                rd_kafka_poll(rk.get(), 100);
                continue;
            }
            if (hdrs)
                rd_kafka_headers_destroy(hdrs);
            throw KafkaError(
                fmt::format("cannot enqueue record for {}: {}", topic, rd_kafka_error_string(error.get())));
        }
    }
};

Publisher::Publisher(const PublisherConfig& config) : impl_(std::make_unique<Impl>())
{
    config.validate();
    const Redactor secrets = detail::secrets_of({}, {&config.kafka});
    impl_->log = detail::with_context(config.log ? config.log : stderr_sink(), {}, secrets);
    std::map<std::string, std::string> props = {{"linger.ms", "5"}};
    for (const auto& [k, v] : config.kafka)
        props[k] = v;
    props["bootstrap.servers"] = config.brokers;
    props["enable.idempotence"] = "true";
    props["acks"] = "all";
    impl_->rk = detail::kafka::make_client(
        RD_KAFKA_PRODUCER, props, *impl_, [](rd_kafka_conf_t* conf) { rd_kafka_conf_set_dr_msg_cb(conf, Impl::dr_cb); },
        secrets);
}

Publisher::~Publisher()
{
    if (rd_kafka_flush(impl_->rk.get(), 10000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        try {
            detail::emit(
                impl_->log, LogLevel::error,
                fmt::format("publisher closed with {} record(s) not acknowledged", rd_kafka_outq_len(impl_->rk.get())),
                "publisher");
        } catch (...) {
        }
    }
}

void Publisher::publish_async(std::string_view topic, std::optional<std::string_view> key, std::string_view payload,
                              const std::vector<Header>& headers)
{
    impl_->produce(topic, key, payload, headers, nullptr);
    rd_kafka_poll(impl_->rk.get(), 0);
}

void Publisher::publish(std::string_view topic, std::optional<std::string_view> key, std::string_view payload,
                        const std::vector<Header>& headers, std::chrono::milliseconds timeout)
{
    const auto w = std::make_shared<Waiter>();
    impl_->produce(topic, key, payload, headers, w);
    if (!wait({DeliveryStatus(w)}, timeout))
        throw KafkaError(fmt::format("record for {} not acknowledged within {} ms (it may still be delivered)", topic,
                                     timeout.count()));
    if (w->err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("record for {} not acknowledged: {}", topic, rd_kafka_err2str(w->err)));
}

std::vector<std::string> Publisher::publish_all(const std::vector<OutgoingRecord>& records,
                                                std::chrono::milliseconds timeout)
{
    const auto deliveries = send_all(records, timeout);
    std::vector<std::string> result(records.size());
    for (std::size_t i = 0; i < records.size(); ++i)
        result[i] = deliveries[i].error();
    return result;
}

std::vector<DeliveryStatus> Publisher::send_all(const std::vector<OutgoingRecord>& records,
                                                std::chrono::milliseconds timeout)
{
    std::lock_guard<std::mutex> serial(impl_->all_mu);
    std::vector<DeliveryStatus> out;
    out.reserve(records.size());
    for (const auto& r : records) {
        auto w = std::make_shared<Waiter>();
        try {
            impl_->produce(r.topic, r.key ? std::optional<std::string_view>(*r.key) : std::nullopt,
                           r.value ? std::optional<std::string_view>(*r.value) : std::nullopt, r.headers, w);
        } catch (const KafkaError&) {
            w->err = RD_KAFKA_RESP_ERR__FAIL;
            w->done.store(true);
        }
        out.push_back(DeliveryStatus(std::move(w)));
    }
    if (wait(out, timeout))
        return out;
    // Withdrawn: the records not sent yet (they are never written); their
    // reports come at once. What was sent stays in flight.
    rd_kafka_purge(impl_->rk.get(), RD_KAFKA_PURGE_F_QUEUE);
    wait(out, withdraw_wait);
    for (auto& d : out)
        if (d.state() == DeliveryStatus::State::in_flight)
            d.s_->timeout_note =
                fmt::format("not acknowledged within {} ms; sent, so it may still be written", timeout.count());
    return out;
}

bool Publisher::wait(const std::vector<DeliveryStatus>& deliveries, std::chrono::milliseconds timeout)
{
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const bool pending = std::any_of(deliveries.begin(), deliveries.end(), [](const DeliveryStatus& d) {
            return d.state() == DeliveryStatus::State::in_flight;
        });
        if (!pending)
            return true;
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return false;
        rd_kafka_poll(impl_->rk.get(), static_cast<int>(std::min<std::int64_t>(left.count(), 10)));
    }
}

void Publisher::flush(std::chrono::milliseconds timeout)
{
    const auto err = rd_kafka_flush(impl_->rk.get(), static_cast<int>(timeout.count()));
    std::uint64_t failures;
    std::string first;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        failures = impl_->failed_since_flush;
        first = impl_->first_error;
        impl_->failed_since_flush = 0;
        impl_->first_error.clear();
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("flush: {} record(s) still not acknowledged after {} ms",
                                     rd_kafka_outq_len(impl_->rk.get()), timeout.count()));
    if (failures)
        throw KafkaError(fmt::format("{} record(s) failed delivery; first: {}", failures, first));
}

PublisherStats Publisher::stats() const noexcept
{
    return {impl_->delivered.load(), impl_->failed.load()};
}

} // namespace idemkafka
