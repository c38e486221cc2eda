// HandlerHarness: the consumer's pieces for one record at a time, without
// Kafka. What the engine does with a polled batch (Intake::decode(),
// ClaimTransaction::screen() and run(), the ledger's completion) runs here on
// a batch of one record; the dead-letterer gets a transport that keeps the
// dead letters instead of producing them.

#include "idemkafka/handler_harness.hpp"

#include <chrono>
#include <map>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "consumer/claim_transaction.hpp"
#include "consumer/dead_letterer.hpp"
#include "consumer/intake.hpp"
#include "consumer/item.hpp"
#include "core/ledger.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/store.hpp"
#include "observe/log_context.hpp"
#include "pg/connect.hpp"

namespace idemkafka {

std::string_view to_string(DeliveryOutcome outcome) noexcept
{
    switch (outcome) {
    case DeliveryOutcome::processed:
        return "processed";
    case DeliveryOutcome::duplicate:
        return "duplicate";
    case DeliveryOutcome::dead_lettered:
        return "dead_lettered";
    case DeliveryOutcome::failed:
        return "failed";
    }
    return "unknown";
}

namespace detail {
namespace {

using std::chrono::milliseconds;

// Never contacted: the harness has no Kafka. Validation wants them set.
constexpr const char* stand_in_brokers = "handler-harness.invalid:9092";
constexpr const char* stand_in_topic = "harness";

ConsumerConfig with_stand_ins(ConsumerConfig cfg)
{
    if (cfg.brokers.empty())
        cfg.brokers = stand_in_brokers;
    if (cfg.topics.empty())
        cfg.topics = {stand_in_topic};
    cfg.validate();
    return cfg;
}

std::int64_t now_ms()
{
    return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

} // namespace

struct HarnessCore::Impl {
    ConsumerConfig cfg;
    Stage& stage;
    LogSink log;
    Metrics metrics;
    ProcessedEventStore store;
    const std::optional<OffsetStore> no_offsets; // no Kafka positions to keep
    PartitionLedger ledger{Backoff{cfg.retry_backoff, cfg.retry_backoff_max},
                           Backoff{milliseconds(1000), milliseconds(30000)}};
    Intake intake{cfg, stage, metrics, log};
    std::vector<TestRecord> dead_letters;
    DeadLetterer dead_letterer{cfg,
                               ledger,
                               metrics,
                               log,
                               secrets_of(cfg.postgres, {&cfg.kafka, &cfg.dead_letter_kafka}),
                               [this](const std::vector<OutgoingRecord>& records, milliseconds) {
                                   for (const auto& r : records)
                                       dead_letters.push_back(TestRecord{r.topic, 0,
                                                                         static_cast<std::int64_t>(dead_letters.size()),
                                                                         r.key, r.value, r.headers});
                                   return std::vector<std::string>(records.size()); // all acknowledged
                               }};
    // One record at a time, nothing to pause: every failure is the record's.
    Circuit circuit{[this] {
        auto off = cfg.circuit_breaker;
        off.enabled = false;
        return off;
    }()};
    ClaimTransaction claims{ClaimTransaction::Setup{cfg, stage, metrics, store, no_offsets, ledger, dead_letterer,
                                                    circuit, log, [] { return false; }, false}};
    Worker worker;
    std::map<TopicPartition, std::int64_t> next_offset;
    struct Last {
        TestMessage message;
        std::int64_t offset;
    };
    std::optional<Last> last;

    Impl(ConsumerConfig c, Stage& s)
        : cfg(with_stand_ins(std::move(c))), stage(s),
          log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}},
                           secrets_of(cfg.postgres))),
          store(cfg.schema, cfg.table)
    {
        stage.reserve(1); // one record at a time
        try {
            connect(true);
        } catch (const Error&) {
            throw;
        } catch (const std::exception& e) {
            throw DatabaseError(secrets_of(cfg.postgres)(fmt::format("handler harness: PostgreSQL: {}", e.what())));
        }
    }

    // As the consumer's first worker connection: the schema is created (or
    // checked) and the dedup-horizon guard follows the claims table's layout.
    void connect(bool first)
    {
        worker.connect(cfg.postgres);
        if (first)
            intake.set_layout(claims.settle_schema(*worker.db));
        claims.prepare(worker);
    }

    TopicPartition where(const TestMessage& m) const
    {
        return TopicPartition{m.topic.empty() ? cfg.topics.front() : m.topic, m.partition};
    }

    Delivery deliver(const TestMessage& m)
    {
        const auto tp = where(m);
        auto& next = next_offset[tp];
        const std::int64_t offset = next++;
        last = Last{m, offset};
        return deliver_at(last->message, offset);
    }

    // One record through what the engine does with a polled batch.
    Delivery deliver_at(const TestMessage& m, std::int64_t offset)
    {
        const auto tp = where(m);
        auto* ps = ledger.find(tp.topic, tp.partition);
        if (!ps)
            ps = &ledger.assign(tp);

        std::vector<Item> items;
        items.push_back(polled(m, tp, offset, ps));
        Item& it = items.front();

        Delivery d;
        d.topic = tp.topic;
        d.partition = tp.partition;
        d.offset = offset;
        d.attempt = ledger.attempt_of(*ps, offset);
        const auto letters_before = dead_letters.size();

        metrics.consumed.add(1);
        intake.decode(items, 0);
        reconnect_if_lost();
        const Holds holds = claims.screen(intake, worker, items);
        worker.reset(holds);
        if (it.state == ItemState::pending && !holds.covers(ps, offset)) {
            worker.items.push_back(0);
            claims.run(worker, items, Clock::now() + std::chrono::hours(1));
        }
        d.event_id = it.id;

        throw_if_failed(tp, offset);
        settle(d, it, ps, letters_before);
        if (d.outcome == DeliveryOutcome::failed)
            return d; // not completed: the record comes again
        ledger.complete(*ps, offset);
        ledger.trim(*ps);
        return d;
    }

    // The record as the engine would have polled it.
    Item polled(const TestMessage& m, const TopicPartition& tp, std::int64_t offset, PartitionState* ps) const
    {
        Item it;
        it.record.topic = tp.topic;
        it.record.partition = tp.partition;
        it.record.offset = offset;
        it.record.timestamp_ms = m.timestamp_ms >= 0 ? m.timestamp_ms : now_ms();
        if (m.key)
            it.record.key = std::string_view(*m.key);
        if (m.value)
            it.record.value = std::string_view(*m.value);
        it.record.headers = m.headers;
        it.part = ps;
        return it;
    }

    // The worker's connection, again after it was lost.
    void reconnect_if_lost()
    {
        if (worker.db)
            return;
        try {
            connect(false);
        } catch (const std::exception& e) {
            throw DatabaseError(
                secrets_of(cfg.postgres)(fmt::format("handler harness: PostgreSQL reconnect: {}", e.what())));
        }
    }

    // The worker's transaction failed: what it threw, or a DatabaseError.
    void throw_if_failed(const TopicPartition& tp, std::int64_t offset)
    {
        if (!worker.failed)
            return;
        if (worker.lost_connection)
            worker.disconnect();
        if (worker.error)
            std::rethrow_exception(worker.error);
        throw DatabaseError(
            fmt::format("handler harness: the transaction of {}/{}@{} failed outside the handler (the log says why); "
                        "nothing of it committed",
                        tp.topic, tp.partition, offset));
    }

    // What became of the record: dead-lettered, failed (held, or its key
    // parked), a duplicate, or processed (counted as the engine's merge does).
    void settle(Delivery& d, const Item& it, PartitionState* ps, std::size_t letters_before)
    {
        if (dead_letters.size() > letters_before) {
            d.outcome = DeliveryOutcome::dead_lettered;
            d.reason = it.reason;
            d.error = it.error;
            d.attempt = it.attempts;
            d.dead_letter = dead_letters.back();
        } else if (worker.holds.covers(ps, d.offset, it.record.key)) { // held, or its key parked (Ordering::key)
            d.outcome = DeliveryOutcome::failed;
            d.error = it.error;
        } else if (it.state == ItemState::done) {
            d.outcome = DeliveryOutcome::duplicate; // the reconcile hook skipped it (claimed with its effect)
        } else {
            d.outcome = worker.info.claimed > 0 ? DeliveryOutcome::processed : DeliveryOutcome::duplicate;
            metrics.db_commits.add();
            metrics.batch_records.observe(static_cast<double>(worker.info.records));
            metrics.claimed.add(worker.info.claimed);
            metrics.duplicates.add(worker.info.duplicates);
        }
    }

    Delivery redeliver()
    {
        if (!last)
            throw std::logic_error("HandlerHarness::redeliver(): nothing was delivered yet");
        return deliver_at(last->message, last->offset);
    }

    // A new process: the partition's state starts empty, the connection is new.
    void crash()
    {
        ledger.assign(where(last->message));
        worker.disconnect();
    }
};

HarnessCore::HarnessCore(ConsumerConfig config, Stage& stage) : impl_(std::make_unique<Impl>(std::move(config), stage))
{
}

HarnessCore::~HarnessCore() = default;

Delivery HarnessCore::deliver(const TestMessage& message)
{
    return impl_->deliver(message);
}

Delivery HarnessCore::redeliver()
{
    return impl_->redeliver();
}

DeliveryPair HarnessCore::deliver_twice(const TestMessage& message)
{
    auto first = impl_->deliver(message);
    auto second = impl_->deliver(message);
    return DeliveryPair{std::move(first), std::move(second)};
}

DeliveryPair HarnessCore::deliver_with_crash_after_commit(const TestMessage& message)
{
    auto first = impl_->deliver(message);
    impl_->crash();
    auto second = impl_->redeliver();
    return DeliveryPair{std::move(first), std::move(second)};
}

std::vector<Delivery> HarnessCore::deliver_until_dead_letter(const TestMessage& message)
{
    std::vector<Delivery> out;
    out.push_back(impl_->deliver(message));
    while (out.back().outcome == DeliveryOutcome::failed && static_cast<int>(out.size()) < impl_->cfg.max_attempts)
        out.push_back(impl_->redeliver());
    return out;
}

const std::vector<TestRecord>& HarnessCore::dead_letters() const noexcept
{
    return impl_->dead_letters;
}

const Metrics& HarnessCore::metrics() const noexcept
{
    return impl_->metrics;
}

const ConsumerConfig& HarnessCore::config() const noexcept
{
    return impl_->cfg;
}

} // namespace detail
} // namespace idemkafka
