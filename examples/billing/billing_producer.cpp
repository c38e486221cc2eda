// Publishes order.confirmed.v1 events, including deliberate re-sends of
// events already published (same event id, same key, new offset): the
// duplicates a consumer sees after producer retries, replays or offset resets.

#include <chrono>
#include <cstdio>
#include <random>
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
  --seed N              random seed (default 1)

Prints progress on stderr and, last, one line on stdout:
  published=N unique_orders=U resent=R
)";

} // namespace

int main(int argc, char** argv)
try {
    billing::Args args(argc, argv,
                       {{"brokers", ""}, {"topic", "order-service.order.confirmed"}, {"events", "10000"},
                        {"duplicates", "0.2"}, {"seed", "1"}},
                       usage);
    const auto brokers = args.get("brokers", "IDEMKAFKA_BROKERS");
    if (brokers.empty())
        billing::Args::fail("--brokers (or IDEMKAFKA_BROKERS) is required", usage);
    const auto total = args.number("events");
    const double ratio = args.real("duplicates");
    if (total <= 0 || ratio < 0 || ratio >= 1)
        billing::Args::fail("--events must be positive and --duplicates in [0, 1)", usage);
    const auto topic = args.get("topic");
    const auto resends = static_cast<long long>(static_cast<double>(total) * ratio);
    const auto unique = total - resends;

    idemkafka::Publisher pub(idemkafka::PublisherConfig{brokers, {}, {}});
    std::mt19937_64 rng(static_cast<std::uint64_t>(args.number("seed")));
    std::vector<std::string> payloads; // what was sent, to re-send it unchanged
    std::vector<std::string> keys;
    payloads.reserve(static_cast<std::size_t>(unique));
    long long sent_unique = 0, sent_again = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long long i = 0; i < total; ++i) {
        // Interleave re-sends with new events so duplicates arrive at any distance.
        const long long remaining_unique = unique - sent_unique;
        const long long remaining_again = resends - sent_again;
        const bool again = sent_unique > 0 && remaining_again > 0 &&
                           rng() % static_cast<std::uint64_t>(remaining_unique + remaining_again) <
                               static_cast<std::uint64_t>(remaining_again);
        if (again) {
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
    std::printf("published=%lld unique_orders=%lld resent=%lld\n", total, sent_unique, sent_again);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "billing-producer: %s\n", e.what());
    return 1;
}
