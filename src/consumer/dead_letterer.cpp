#include "consumer/dead_letterer.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "kafka/client.hpp"

namespace idemkafka::detail {
namespace {

std::size_t header_bytes(const std::vector<Header>& headers)
{
    std::size_t n = 0;
    for (const auto& h : headers)
        n += h.name.size() + (h.value ? h.value->size() : 0);
    return n;
}

} // namespace

DeadLetterer::DeadLetterer(const ConsumerConfig& cfg, PartitionLedger& ledger, Metrics& metrics, LogSink log,
                           Redactor secrets, Transport transport)
    : cfg_(cfg), ledger_(ledger), metrics_(metrics), log_(std::move(log)), secrets_(std::move(secrets)),
      topic_(cfg.effective_dead_letter_topic()), transport_(std::move(transport))
{
}

DeadLetterer::~DeadLetterer() = default;

Publisher& DeadLetterer::producer()
{
    std::lock_guard<std::mutex> lock(mu_);
    if (!producer_) {
        PublisherConfig pc;
        pc.brokers = cfg_.brokers;
        pc.kafka = kafka::connection_settings(cfg_.kafka);
        for (const auto& [k, v] : cfg_.dead_letter_kafka)
            pc.kafka[k] = v;
        pc.log = log_;
        producer_ = std::make_unique<Publisher>(std::move(pc));
    }
    return *producer_;
}

// The producer's record size limit (librdkafka's message.max.bytes), less
// room for the record's framing.
std::size_t DeadLetterer::budget() const
{
    std::size_t limit = 1000000;
    auto m = cfg_.dead_letter_kafka.find("message.max.bytes");
    if (m != cfg_.dead_letter_kafka.end()) {
        try {
            limit = std::stoull(m->second);
        } catch (const std::exception&) {
            // not a number: the producer's own error names the property
        }
    }
    constexpr std::size_t framing = 1024;
    return limit > 2 * framing ? limit - framing : limit / 2;
}

OutgoingRecord DeadLetterer::record_of(const Item& it, int attempts) const
{
    const auto& r = it.record;
    OutgoingRecord out;
    out.topic = topic_;
    if (r.key)
        out.key.emplace(*r.key);
    if (r.value)
        out.value.emplace(*r.value);
    out.headers = r.headers;
    auto add = [&](const char* name, std::string value) { out.headers.push_back(Header{name, std::move(value)}); };
    constexpr std::size_t max_error = 4096; // an exception's text can be anything
    add(dead_letter_header::reason, std::string(to_string(it.reason)));
    // Masked as the log is: an error text may quote a connection string, a
    // server's DETAIL, a token (the topic is read by more people than the log).
    const auto error = secrets_(it.error);
    add(dead_letter_header::error, error.size() > max_error ? error.substr(0, max_error) + "..." : error);
    add(dead_letter_header::original_topic, std::string(r.topic));
    add(dead_letter_header::original_partition, std::to_string(r.partition));
    add(dead_letter_header::original_offset, std::to_string(r.offset));
    add(dead_letter_header::original_timestamp, std::to_string(r.timestamp_ms));
    if (!it.id.is_nil())
        add(dead_letter_header::event_id, it.id.to_string());
    add(dead_letter_header::attempts, std::to_string(attempts));
    add(dead_letter_header::consumer_group, cfg_.group_id);
    fit(out, r.headers.size());
    return out;
}

// A dead letter always fits the producer's limit: what does not fit is left
// out (the value first, then the original headers, then the key), and
// headers say what and how large it was.
void DeadLetterer::fit(OutgoingRecord& out, std::size_t original_headers) const
{
    const std::size_t limit = budget();
    auto size = [&] {
        return (out.key ? out.key->size() : 0) + (out.value ? out.value->size() : 0) + header_bytes(out.headers) +
               64; // the headers added below
    };
    if (size() <= limit)
        return;
    if (out.value) {
        const auto bytes = out.value->size();
        out.value.reset();
        out.headers.push_back(Header{dead_letter_header::original_value_bytes, std::to_string(bytes)});
    }
    if (size() > limit && original_headers > 0) {
        out.headers.erase(out.headers.begin(), out.headers.begin() + static_cast<std::ptrdiff_t>(original_headers));
        out.headers.push_back(Header{dead_letter_header::original_headers_dropped, std::to_string(original_headers)});
    }
    if (size() > limit && out.key) {
        const auto bytes = out.key->size();
        out.key.reset();
        out.headers.push_back(Header{dead_letter_header::original_key_bytes, std::to_string(bytes)});
    }
}

// Each dead letter is written once per delivery of its record: one sent
// earlier and still unanswered (the broker slower than dead_letter_timeout)
// is waited for, not sent again; it counts as acknowledged once the broker
// says so. Records not sent by the timeout are withdrawn, so they are never
// written, and go again. Bounded by dead_letter_timeout.
std::vector<std::string> DeadLetterer::publish(const std::vector<Item*>& items,
                                               const std::vector<OutgoingRecord>& records)
{
    const auto started = Clock::now();
    std::vector<DeliveryStatus> deliveries(items.size());
    std::vector<OutgoingRecord> fresh;
    std::vector<std::size_t> fresh_of;
    std::vector<DeliveryStatus> earlier;
    {
        std::lock_guard<std::mutex> lock(flight_mu_);
        for (std::size_t k = 0; k < items.size(); ++k) {
            const auto& r = items[k]->record;
            const auto* f = in_flight_.find({std::string(r.topic), r.partition, r.offset});
            if (f && f->state() != DeliveryStatus::State::failed) {
                deliveries[k] = *f;
                earlier.push_back(*f);
                continue;
            }
            fresh.push_back(records[k]);
            fresh_of.push_back(k);
        }
    }
    auto& p = producer();
    const auto sent = p.send_all(fresh, cfg_.dead_letter_timeout);
    for (std::size_t j = 0; j < sent.size(); ++j)
        deliveries[fresh_of[j]] = sent[j];
    if (!earlier.empty())
        p.wait(earlier, std::max(std::chrono::milliseconds(0),
                                 cfg_.dead_letter_timeout -
                                     std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started)));
    std::vector<std::string> errors(items.size());
    std::lock_guard<std::mutex> lock(flight_mu_);
    for (std::size_t k = 0; k < items.size(); ++k) {
        const auto& r = items[k]->record;
        const LetterFlights::Key key{std::string(r.topic), r.partition, r.offset};
        if (deliveries[k].state() == DeliveryStatus::State::in_flight) {
            in_flight_.put(key, deliveries[k]);
            errors[k] = deliveries[k].error() + " (not sent again until the broker answers)";
            continue;
        }
        in_flight_.erase(key);
        errors[k] = deliveries[k].error();
    }
    return errors;
}

void DeadLetterer::send(const std::vector<Item*>& items, Holds& holds)
{
    if (items.empty())
        return;
    std::vector<OutgoingRecord> records;
    records.reserve(items.size());
    for (auto* it : items) {
        if (it->attempts < 0)
            it->attempts = ledger_.attempt_of(*it->part, it->record.offset) - 1;
        records.push_back(record_of(*it, it->attempts));
    }
    std::vector<std::string> errors;
    try {
        errors = transport_ ? transport_(records, cfg_.dead_letter_timeout) : publish(items, records);
        if (errors.size() != records.size())
            throw std::logic_error("dead-letter transport answered for a different number of records");
    } catch (const std::exception& e) {
        errors.assign(items.size(), e.what());
    }
    for (std::size_t k = 0; k < items.size(); ++k) {
        auto& it = *items[k];
        const auto& r = it.record;
        if (errors[k].empty()) {
            it.state = ItemState::done;
            ledger_.dead_lettered(*it.part, r.offset);
            metrics_.dead_lettered[static_cast<std::size_t>(it.reason)].add();
            auto fields = it.log_fields(it.error);
            fields.push_back({"reason", std::string(to_string(it.reason))});
            say(log_, LogLevel::error, std::move(fields), "dead-lettered {} to {} (reason {}{}{}): {}", it.where(),
                topic_, to_string(it.reason), it.id.is_nil() ? "" : ", event ",
                it.id.is_nil() ? std::string() : it.id.to_string(), it.error);
            continue;
        }
        const int refusals = ledger_.dead_letter_refused(*it.part, r.offset, it.reason, it.error, it.attempts);
        metrics_.dead_letter_failures.add();
        auto fields = it.log_fields(errors[k]);
        fields.push_back({"refusals", std::to_string(refusals)});
        say(log_, LogLevel::error, std::move(fields),
            "dead letter for {} not acknowledged ({}); its offset does not move, next try in {} ms (refusal {})",
            it.where(), errors[k], ledger_.retry_backoff(refusals).count(), refusals);
        holds.add(it.part, r.offset, refusals);
    }
}

} // namespace idemkafka::detail
