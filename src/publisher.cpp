#include "idemkafka/publisher.hpp"

#include <atomic>
#include <mutex>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "kafka/client.hpp"
#include "log_context.hpp"
#include "trace.hpp"

namespace idemkafka {
namespace {

constexpr std::chrono::milliseconds queue_wait{10000};

struct Waiter {
    std::atomic<bool> done{false};
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
};

} // namespace

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
    // publish_all() one call at a time: its timeout purges every record not
    // yet delivered, which must be its own only.
    std::mutex all_mu;
    std::uint64_t failed_since_flush = 0;
    std::string first_error;

    static void dr_cb(rd_kafka_t*, const rd_kafka_message_t* m, void* opaque)
    {
        auto* self = static_cast<Impl*>(static_cast<detail::kafka::ClientOwner*>(opaque));
        if (m->_private) {
            auto* w = static_cast<Waiter*>(m->_private);
            w->err = m->err;
            w->done.store(true, std::memory_order_release);
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

    void produce(std::string_view topic, std::optional<std::string_view> key, std::optional<std::string_view> payload,
                 const std::vector<Header>& given, Waiter* waiter)
    {
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
        vus[4].u.ptr = waiter;
        std::size_t n = 5;
        if (hdrs) {
            vus[n].vtype = RD_KAFKA_VTYPE_HEADERS;
            vus[n].u.headers = hdrs;
            ++n;
        }
        const auto deadline = std::chrono::steady_clock::now() + queue_wait;
        for (;;) {
            const detail::kafka::ErrorPtr error(rd_kafka_produceva(rk.get(), vus, n));
            if (!error)
                return; // headers now owned by the message
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

Publisher::Publisher(PublisherConfig config) : impl_(std::make_unique<Impl>())
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
    Waiter w;
    impl_->produce(topic, key, payload, headers, &w);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!w.done.load(std::memory_order_acquire)) {
        if (std::chrono::steady_clock::now() >= deadline) {
            // The waiter must outlive the delivery report, which may still come.
            rd_kafka_flush(impl_->rk.get(), -1);
            if (w.err == RD_KAFKA_RESP_ERR_NO_ERROR)
                return;
            break;
        }
        rd_kafka_poll(impl_->rk.get(), 50);
    }
    if (w.err != RD_KAFKA_RESP_ERR_NO_ERROR)
        throw KafkaError(fmt::format("record for {} not acknowledged: {}", topic, rd_kafka_err2str(w.err)));
}

std::vector<std::string> Publisher::publish_all(const std::vector<OutgoingRecord>& records,
                                                std::chrono::milliseconds timeout)
{
    std::lock_guard<std::mutex> serial(impl_->all_mu);
    // Waiters must stay put while delivery reports can still arrive.
    std::vector<Waiter> waiters(records.size());
    std::vector<std::string> result(records.size());
    for (std::size_t i = 0; i < records.size(); ++i) {
        const auto& r = records[i];
        try {
            impl_->produce(r.topic, r.key ? std::optional<std::string_view>(*r.key) : std::nullopt,
                           r.value ? std::optional<std::string_view>(*r.value) : std::nullopt, r.headers,
                           &waiters[i]);
        } catch (const KafkaError& e) {
            result[i] = e.what();
            waiters[i].done.store(true);
            waiters[i].err = RD_KAFKA_RESP_ERR__FAIL;
        }
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto all_done = [&] {
        for (const auto& w : waiters)
            if (!w.done.load(std::memory_order_acquire))
                return false;
        return true;
    };
    while (!all_done()) {
        if (std::chrono::steady_clock::now() >= deadline) {
            // Undelivered records are purged so their reports arrive now, with
            // an error, while the waiters still exist.
            rd_kafka_purge(impl_->rk.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
            rd_kafka_flush(impl_->rk.get(), -1);
            break;
        }
        rd_kafka_poll(impl_->rk.get(), 10);
    }
    for (std::size_t i = 0; i < records.size(); ++i)
        if (result[i].empty() && waiters[i].err != RD_KAFKA_RESP_ERR_NO_ERROR)
            result[i] = rd_kafka_err2str(waiters[i].err);
    return result;
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
