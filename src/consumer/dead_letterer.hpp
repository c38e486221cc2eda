#pragma once
// The one owner of the dead-letter producer: builds each dead letter,
// produces it, waits for the broker's acknowledgement, and records the
// outcome in the partition ledger. Private to the library.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "consumer/batch.hpp"
#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/publisher.hpp"
#include "idemkafka/redact.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail {

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
    // Dead letters sent but not answered within dead_letter_timeout, by their
    // record (topic, partition, offset): the record's next try waits for that
    // one instead of writing a second copy.
    std::mutex flight_mu_;
    std::map<std::tuple<std::string, std::int32_t, std::int64_t>, DeliveryStatus> in_flight_;
};

} // namespace idemkafka::detail
