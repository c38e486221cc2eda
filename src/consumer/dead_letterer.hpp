#pragma once
// The one owner of the dead-letter producer: builds each dead letter,
// produces it, waits for the broker's acknowledgement, and records the
// outcome in the partition ledger. Private to the library.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "consumer/item.hpp"
#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/publisher.hpp"
#include "idemkafka/redact.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail {

/// Dead letters sent but not answered within dead_letter_timeout, by their
/// record (topic, partition, offset): the record's next try waits for that
/// one instead of writing a second copy. A revoked partition's entries go:
/// its records' next tries belong to their new owner.
class LetterFlights {
public:
    using Key = std::tuple<std::string, std::int32_t, std::int64_t>;
    /// The dead letter in flight for the record, if any.
    const DeliveryStatus* find(const Key& k) const
    {
        const auto f = by_record_.find(k);
        return f == by_record_.end() ? nullptr : &f->second;
    }
    void put(const Key& k, const DeliveryStatus& d) { by_record_[k] = d; }
    void erase(const Key& k) { by_record_.erase(k); }
    /// Drops the entries of the partitions.
    void forget(const std::set<TopicPartition>& tps)
    {
        for (auto it = by_record_.begin(); it != by_record_.end();)
            it = tps.count({std::get<0>(it->first), std::get<1>(it->first)}) ? by_record_.erase(it) : std::next(it);
    }
    std::size_t size() const noexcept { return by_record_.size(); }

private:
    std::map<Key, DeliveryStatus> by_record_;
};

class DeadLetterer {
public:
    /// Where dead letters go: produces the records and returns, per record, an
    /// empty string when it was acknowledged and the error otherwise (as
    /// Publisher::publish_all). HandlerHarness keeps them instead of producing.
    using Transport =
        std::function<std::vector<std::string>(const std::vector<OutgoingRecord>&, std::chrono::milliseconds)>;

    /// Dead letters go to the dead-letter topic through a Publisher created on
    /// the first one, or to `transport` when one is given. Their error header
    /// is masked by `secrets` as the log is.
    DeadLetterer(const ConsumerConfig& cfg, PartitionLedger& ledger, Metrics& metrics, LogSink log, Redactor secrets,
                 Transport transport = nullptr);
    ~DeadLetterer();

    /// Produces the items to the dead-letter topic and waits for the
    /// acknowledgements (at most ConsumerConfig::dead_letter_timeout).
    /// Acknowledged items are done; for the others the partition is held at
    /// the record in `holds`, so its offset never moves before the dead letter
    /// is safe, and they are tried again after a backoff that grows with each
    /// refusal (a topic that refuses for good stalls only that partition,
    /// visibly: dead_letter_failures and an error line per try). Safe to call
    /// from several workers at once.
    void send(const std::vector<Item*>& items, Holds& holds);

    /// Creates the dead-letter producer now instead of at the first dead
    /// letter (no-op with a transport): its start-up connections then close
    /// before anything else of the consumer is under way.
    void open()
    {
        if (!transport_)
            (void)producer();
    }

    /// The partitions were revoked: their dead letters in flight are no
    /// longer waited for here (the records' new owner writes its own).
    void forget(const std::set<TopicPartition>& tps)
    {
        std::lock_guard<std::mutex> lock(flight_mu_);
        in_flight_.forget(tps);
    }

    /// The record produced for `it` (before the size limit is applied: see send()).
    OutgoingRecord record_of(const Item& it, int attempts) const;

private:
    Publisher& producer();
    std::size_t budget() const;
    std::vector<std::string> publish(const std::vector<Item*>& items, const std::vector<OutgoingRecord>& records);
    void fit(OutgoingRecord& out, std::size_t original_headers) const;

    const ConsumerConfig& cfg_;
    PartitionLedger& ledger_;
    Metrics& metrics_;
    LogSink log_;
    Redactor secrets_;
    std::string topic_;
    Transport transport_;
    std::mutex mu_;
    std::unique_ptr<Publisher> producer_; // created on the first dead letter
    std::mutex flight_mu_;
    LetterFlights in_flight_;
};

} // namespace idemkafka::detail
