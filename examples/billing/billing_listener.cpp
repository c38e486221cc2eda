// The billing service: consumes order.confirmed.v1 and charges each order
// exactly once into the `charge` table, passing the event id as the payment
// provider's Idempotency-Key.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/health.hpp>
#include <idemkafka/store.hpp>

#include "charge.hpp"
#include "cli.hpp"
#include "order_confirmed.hpp"
#include "payment_client.hpp"

#ifdef BILLING_METRICS_HTTP
#include <httplib.h>
#endif

namespace {

const char* usage = R"(usage: billing-listener [options]

  --brokers HOST:PORT   bootstrap servers (default: $IDEMKAFKA_BROKERS)
  --postgres CONNINFO   libpq connection string (default: $IDEMKAFKA_POSTGRES)
  --topic NAME          topic (default order-service.order.confirmed)
  --group NAME          consumer group (default billing-service)
  --max-batch N         records per transaction (default 500)
  --charge-table NAME   table of the charges (default charge)
  --claims-table NAME   table of the dedup claims (default processed_event)
  --dead-letter-topic NAME  where poison records go (default GROUP.dlq)
  --until-drained N     stop once N records were consumed and the lag is 0
                        (default 0: run until SIGINT/SIGTERM)
  --progress SECONDS    progress line interval on stderr (default 1, 0 = none)
  --metrics-port N      serve Prometheus metrics at http://BIND:N/metrics while running
                        (default 0: off; needs a build with cpp-httplib)
  --metrics-bind ADDR   address of the metrics endpoint (default 127.0.0.1)
  --group-protocol P    classic (default: 6 s session timeout) or consumer (KIP-848:
                        the broker sets the session timeout; librdkafka 2.12 or later)

Prints one summary line on stdout when it stops:
  consumed=N charged=C duplicates=D poison=P charges_in_db=X unique_orders_in_db=U
)";

using Consumer = idemkafka::IdempotentConsumer<billing::OrderConfirmed>;
std::atomic<Consumer*> g_consumer{nullptr};

extern "C" void on_signal(int)
{
    if (auto* c = g_consumer.load())
        c->stop(); // async-signal-safe; a second signal forces a fast exit
}

#ifdef BILLING_METRICS_HTTP
// GET /metrics in the Prometheus text format, served by one thread of its own
// for as long as this object lives.
class MetricsEndpoint {
public:
    MetricsEndpoint(const Consumer& consumer, const std::string& group, const std::string& bind, int port)
    {
        server_.new_task_queue = [] { return new httplib::ThreadPool(1); };
        server_.Get("/metrics", [&consumer, group](const httplib::Request&, httplib::Response& res) {
            res.set_content(consumer.metrics().snapshot().to_prometheus(group),
                            "text/plain; version=0.0.4; charset=utf-8");
        });
        // Probes for a supervisor (Kubernetes livenessProbe / readinessProbe): 200 or 503,
        // with the reasons as JSON.
        auto probe = [&consumer](bool want_live) {
            return [&consumer, want_live](const httplib::Request&, httplib::Response& res) {
                const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
                const auto h = idemkafka::health_of(consumer.metrics().snapshot(), now_ms);
                res.status = (want_live ? h.live : h.ready) ? 200 : 503;
                res.set_content(h.to_json(), "application/json");
            };
        };
        server_.Get("/livez", probe(true));
        server_.Get("/readyz", probe(false));
        if (!server_.bind_to_port(bind, port))
            throw std::runtime_error(fmt::format("--metrics-port: cannot listen on {}:{}", bind, port));
        thread_ = std::thread([this] {
            server_.listen_after_bind();
            finished_ = true;
        });
    }
    MetricsEndpoint(const MetricsEndpoint&) = delete;
    MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

    ~MetricsEndpoint()
    {
        // stop() is a no-op until the listen loop runs, so wait for it to start.
        while (!server_.is_running() && !finished_)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        server_.stop();
        thread_.join();
    }

private:
    httplib::Server server_;
    std::atomic<bool> finished_{false};
    std::thread thread_;
};
#endif

std::int64_t scalar(const std::string& conninfo, const std::string& sql)
{
    pqxx::connection c(conninfo);
    pqxx::nontransaction tx(c);
    return tx.exec(sql)[0][0].as<std::int64_t>();
}

} // namespace

int main(int argc, char** argv)
try {
    billing::Args args(argc, argv,
                       {{"brokers", ""},
                        {"postgres", ""},
                        {"topic", "order-service.order.confirmed"},
                        {"group", "billing-service"},
                        {"max-batch", "500"},
                        {"until-drained", "0"},
                        {"progress", "1"},
                        {"charge-table", "charge"},
                        {"claims-table", "processed_event"},
                        {"dead-letter-topic", ""},
                        {"metrics-port", "0"},
                        {"metrics-bind", "127.0.0.1"},
                        {"group-protocol", "classic"}},
                       usage);
    idemkafka::ConsumerConfig cfg;
    cfg.brokers = args.get("brokers", "IDEMKAFKA_BROKERS");
    cfg.postgres = args.get("postgres", "IDEMKAFKA_POSTGRES");
    cfg.group_id = args.get("group");
    cfg.topics = {args.get("topic")};
    cfg.max_batch = static_cast<std::size_t>(args.number("max-batch"));
    cfg.table = args.get("claims-table");
    cfg.dead_letter_topic = args.get("dead-letter-topic");
    // Quoted once here; every statement below splices only this.
    const std::string charge_table = idemkafka::quote_identifier(args.get("charge-table"));
    // The consumer protocol (KIP-848) refuses a client-side session timeout.
    if (args.get("group-protocol") == "consumer")
        cfg.kafka["group.protocol"] = "consumer";
    else if (args.get("group-protocol") == "classic")
        cfg.kafka["session.timeout.ms"] = "6000";
    else
        billing::Args::fail("--group-protocol: expected classic or consumer", usage);
    const auto until_drained = args.number("until-drained");
    const auto progress = std::chrono::seconds(args.number("progress"));
    const auto metrics_port = args.number("metrics-port");
    const auto metrics_bind = args.get("metrics-bind");
    if (metrics_port < 0 || metrics_port > 65535)
        billing::Args::fail("--metrics-port: not a port number: " + std::to_string(metrics_port), usage);
#ifndef BILLING_METRICS_HTTP
    if (metrics_port != 0)
        billing::Args::fail("--metrics-port: this billing-listener was built without cpp-httplib, so it has no "
                            "/metrics endpoint (install libcpp-httplib-dev and rebuild)",
                            usage);
#endif
    if (cfg.brokers.empty() || cfg.postgres.empty())
        billing::Args::fail("--brokers and --postgres (or IDEMKAFKA_BROKERS / IDEMKAFKA_POSTGRES) are required", usage);

    {
        pqxx::connection c(cfg.postgres);
        billing::create_charge_table(c, charge_table);
    }

    billing::SimulatedPaymentProvider payments;
    Consumer consumer(cfg, billing::decode, billing::event_id_of, billing::ChargeHandler(payments, charge_table));
#ifdef BILLING_METRICS_HTTP
    std::optional<MetricsEndpoint> metrics_endpoint;
    if (metrics_port != 0) {
        metrics_endpoint.emplace(consumer, cfg.group_id, metrics_bind, static_cast<int>(metrics_port));
        std::fprintf(stderr, "  metrics at http://%s:%lld/metrics\n", metrics_bind.c_str(), metrics_port);
    }
#endif
    g_consumer = &consumer;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);

    std::atomic<bool> done{false};
    std::thread watcher([&] {
        auto next_progress = std::chrono::steady_clock::now() + progress;
        int drained_checks = 0;
        while (!done) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const auto m = consumer.metrics().snapshot();
            if (progress.count() > 0 && std::chrono::steady_clock::now() >= next_progress) {
                next_progress += progress;
                if (m.assigned_partitions == 0)
                    std::fprintf(stderr, "  waiting for a partition assignment from the consumer group\n");
                else
                    std::fprintf(stderr, "  consumed %llu, charged %llu, duplicates skipped %llu, lag %lld\n",
                                 static_cast<unsigned long long>(m.consumed),
                                 static_cast<unsigned long long>(m.claimed),
                                 static_cast<unsigned long long>(m.duplicates), static_cast<long long>(m.lag));
            }
            if (until_drained > 0) {
                // Drained: everything expected arrived and the lag stayed 0 for 0.5 s.
                const bool drained = m.consumed >= static_cast<std::uint64_t>(until_drained) && m.lag == 0;
                drained_checks = drained ? drained_checks + 1 : 0;
                if (drained_checks >= 5) {
                    consumer.stop();
                    return;
                }
            }
        }
    });
    try {
        consumer.run();
    } catch (...) {
        done = true;
        watcher.join();
        throw;
    }
    done = true;
    watcher.join();
    g_consumer = nullptr;

    const auto m = consumer.metrics().snapshot();
    std::printf("consumed=%llu charged=%llu duplicates=%llu poison=%llu charges_in_db=%lld unique_orders_in_db=%lld "
                "provider_calls=%llu provider_charges=%llu\n",
                static_cast<unsigned long long>(m.consumed), static_cast<unsigned long long>(m.claimed),
                static_cast<unsigned long long>(m.duplicates),
                static_cast<unsigned long long>(m.decode_errors + m.invalid_event_ids),
                static_cast<long long>(scalar(cfg.postgres, "SELECT count(*) FROM " + charge_table)),
                static_cast<long long>(scalar(cfg.postgres, "SELECT count(DISTINCT order_id) FROM " + charge_table)),
                static_cast<unsigned long long>(payments.calls()), static_cast<unsigned long long>(payments.charges()));
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "billing-listener: %s\n", e.what());
    return 1;
}
