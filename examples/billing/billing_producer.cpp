// Publishes order.confirmed.v1 events, including deliberate re-sends of
// events already published (same event id, same key, new offset): the
// duplicates a consumer sees after producer retries, replays or offset resets.
// Optionally also poison records (payloads no consumer can process), keyed so a
// test can tell which dead-letter reason each one must end with.

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/error.hpp>
#include <idemkafka/publisher.hpp>

#include "cli.hpp"
#include "order_confirmed.hpp"

namespace {

const char* usage = R"(usage: billing-producer [options]

  --brokers HOST:PORT   bootstrap servers (default: $IDEMKAFKA_BROKERS)
  --topic NAME          topic (default order-service.order.confirmed)
  --events N            records to publish in all (default 10000)
  --duplicates RATIO    share of records that re-send an earlier event (default 0.2)
  --poison RATIO        share of poison records (default 0), keyed
                        "poison-NNNNNN:REASON" with REASON the dead-letter reason
                        the consumer must give it: decode_error, missing_event_id,
                        invalid_event_id or empty_payload, in turn
  --rate N              records per second, spread evenly (default 0: as fast as
                        the broker takes them)
  --seed N              random seed (default 1)

Prints progress on stderr and, last, one line on stdout:
  published=N unique_orders=U resent=R poison=P
)";

const char* const poison_reasons[] = {"decode_error", "missing_event_id", "invalid_event_id", "empty_payload"};

// A payload the billing decoder must reject with the given reason. Several
// shapes per reason, so a decoder that catches only the obvious one fails.
std::string poison_payload(std::size_t reason, const billing::OrderConfirmed& e, std::mt19937_64& rng)
{
    const std::string good = billing::encode(e);
    const std::string id = e.event_id.to_string();
    const auto with_id = [&](const std::string& replacement) {
        std::string p = good;
        p.replace(p.find('"' + id + '"'), id.size() + 2, replacement);
        return p;
    };
    switch (reason) {
    case 0: // decode_error
        switch (rng() % 4) {
        case 0:
            return "this is not JSON";
        case 1:
            return good.substr(0, good.size() / 2);
        case 2:
            return "[1,2,3]";
        default: {
            auto bad = e;
            bad.amount_cents = -bad.amount_cents;
            return billing::encode(bad);
        }
        }
    case 1: // missing_event_id: the same object without its first member
        return "{" + good.substr(good.find(",\"type\"") + 1);
    case 2: // invalid_event_id
        switch (rng() % 5) {
        case 0:
            return with_id("\"not-a-uuid\"");
        case 1:
            return with_id("\"00000000-0000-0000-0000-000000000000\"");
        case 2:
            return with_id("\"{" + id + "}\"");
        case 3:
            return with_id('"' + id.substr(0, id.size() - 1) + '"');
        default:
            return with_id("12345");
        }
    default: // empty_payload
        return "";
    }
}

} // namespace

int main(int argc, char** argv)
try {
    billing::Args args(argc, argv,
                       {{"brokers", ""},
                        {"topic", "order-service.order.confirmed"},
                        {"events", "10000"},
                        {"duplicates", "0.2"},
                        {"poison", "0"},
                        {"rate", "0"},
                        {"seed", "1"}},
                       usage);
    const auto brokers = args.get("brokers", "IDEMKAFKA_BROKERS");
    if (brokers.empty())
        billing::Args::fail("--brokers (or IDEMKAFKA_BROKERS) is required", usage);
    const auto total = args.number("events");
    const double ratio = args.real("duplicates");
    const double poison_ratio = args.real("poison");
    const auto rate = args.number("rate");
    if (total <= 0 || ratio < 0 || poison_ratio < 0 || ratio + poison_ratio >= 1 || rate < 0)
        billing::Args::fail("--events must be positive, --duplicates and --poison in [0, 1) with a sum below 1, "
                            "--rate not negative",
                            usage);
    const auto topic = args.get("topic");
    const auto resends = static_cast<long long>(static_cast<double>(total) * ratio);
    const auto poisons = static_cast<long long>(static_cast<double>(total) * poison_ratio);
    const auto unique = total - resends - poisons;

    idemkafka::Publisher pub(idemkafka::PublisherConfig{brokers, {}, {}});
    std::mt19937_64 rng(static_cast<std::uint64_t>(args.number("seed")));
    std::vector<std::string> payloads; // what was sent, to re-send it unchanged
    std::vector<std::string> keys;
    payloads.reserve(static_cast<std::size_t>(unique));
    long long sent_unique = 0, sent_again = 0, sent_poison = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long long i = 0; i < total; ++i) {
        if (rate > 0)
            std::this_thread::sleep_until(t0 + std::chrono::microseconds(i * 1000000 / rate));
        // Interleave re-sends and poison with new events so duplicates arrive at
        // any distance and poison anywhere in a partition.
        const long long remaining_unique = unique - sent_unique;
        const long long remaining_again = sent_unique > 0 ? resends - sent_again : 0;
        const long long remaining_poison = poisons - sent_poison;
        const auto pick = rng() % static_cast<std::uint64_t>(remaining_unique + remaining_again + remaining_poison);
        const bool again = pick < static_cast<std::uint64_t>(remaining_again);
        const bool poison = !again && pick < static_cast<std::uint64_t>(remaining_again + remaining_poison);
        if (poison) {
            billing::OrderConfirmed e;
            e.event_id = idemkafka::new_event_id();
            e.order_id = fmt::format("poison-order-{:06}", sent_poison + 1);
            e.customer_id = "customer-0";
            e.amount_cents = 100;
            e.currency = "EUR";
            const auto reason = static_cast<std::size_t>(sent_poison % 4);
            pub.publish_async(topic, fmt::format("poison-{:06}:{}", sent_poison + 1, poison_reasons[reason]),
                              poison_payload(reason, e, rng));
            ++sent_poison;
        } else if (again) {
            const auto k = rng() % payloads.size();
            pub.publish_async(topic, keys[k], payloads[k]);
            ++sent_again;
        } else {
            billing::OrderConfirmed e;
            e.event_id = idemkafka::new_event_id();
            e.order_id = fmt::format("order-{:06}", sent_unique + 1);
            e.customer_id = fmt::format("customer-{}", rng() % 500);
            e.amount_cents = static_cast<std::int64_t>(100 + rng() % 100000);
            e.currency = "EUR";
            e.occurred_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
            payloads.push_back(billing::encode(e));
            keys.push_back(e.order_id); // key = order id: one order's events stay in one partition
            pub.publish_async(topic, keys.back(), payloads.back());
            ++sent_unique;
        }
        if ((i + 1) % (total / 10 > 0 ? total / 10 : 1) == 0)
            std::fprintf(stderr, "  published %lld/%lld\n", i + 1, total);
    }
    pub.flush();
    const auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "  all %lld records acknowledged by the broker in %.1f s\n", total, secs);
    std::printf("published=%lld unique_orders=%lld resent=%lld poison=%lld\n", total, sent_unique, sent_again,
                sent_poison);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "billing-producer: %s\n", e.what());
    return 1;
}
