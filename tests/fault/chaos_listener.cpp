// The torture test's misbehaving listener: billing-listener's command line,
// decoder and charge, with handlers written the way real services get them
// wrong, for a subset of orders chosen by misbehaviour.hpp:
//   swallow       inserts its charge, runs a statement that fails (a unique
//                 violation on <charge table>_taken), catches the
//                 pqxx::sql_error, then writes a row to <charge table>_after_error
//                 (which must never commit) and returns normally;
//   throw_always  inserts its charge, then throws std::runtime_error;
//   throw_once    the same on attempt 1 only.
// The driver (torture.cpp --misbehaving) computes the same subset and checks
// the dead letters, charges and rows that follow. max_attempts is 3
// (misbehaviour.hpp says why).

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/store.hpp>

#include "cli.hpp"
#include "misbehaviour.hpp"
#include "order_confirmed.hpp"
#include "payment_client.hpp"
#include "pg/exec.hpp"

namespace {

namespace pg = idemkafka::detail::pg;
using idemkafka::torture::Misbehaviour;

const char* usage = R"(usage: idemkafka-chaos-listener [options]

  billing-listener's options --brokers, --postgres, --topic, --group, --max-batch,
  --charge-table, --claims-table, --dead-letter-topic and --progress, and:
  --misbehave-seed N       seed of the rule choosing the misbehaving orders (default 0)
  --misbehave-per-mille N  orders per thousand misbehaving in each of the three ways
                           (default 10)
  --ordering O             partition (default) or key: Ordering::key with 2 workers
  --transaction-per-record 1
                           a transaction per record (ConsumerConfig::transaction_per_record)
                           (default 0)
  --batches-per-unit N     transactions per unit of work (ConsumerConfig::batches_per_unit)
                           (default 1)

Prints one summary line on stdout when it stops (SIGINT/SIGTERM):
  consumed=N charged=C duplicates=D poison=P handler_failures=F handler_aborted=A retries=R
)";

using Consumer = idemkafka::IdempotentConsumer<billing::OrderConfirmed>;
std::atomic<Consumer*> g_consumer{nullptr};

extern "C" void on_signal(int)
{
    if (auto* c = g_consumer.load())
        c->stop();
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
                        {"progress", "1"},
                        {"charge-table", "charge"},
                        {"claims-table", "processed_event"},
                        {"dead-letter-topic", ""},
                        {"misbehave-seed", "0"},
                        {"misbehave-per-mille", "10"},
                        {"group-protocol", "classic"},
                        {"ordering", "partition"},
                        {"transaction-per-record", "0"},
                        {"batches-per-unit", "1"}},
                       usage);
    idemkafka::ConsumerConfig cfg;
    cfg.brokers = args.get("brokers", "IDEMKAFKA_BROKERS");
    cfg.postgres = args.get("postgres", "IDEMKAFKA_POSTGRES");
    if (cfg.brokers.empty() || cfg.postgres.empty())
        billing::Args::fail("--brokers and --postgres are required", usage);
    cfg.group_id = args.get("group");
    cfg.topics = {args.get("topic")};
    cfg.max_batch = static_cast<std::size_t>(args.number("max-batch"));
    cfg.transaction_per_record = args.get("transaction-per-record") == "1";
    cfg.batches_per_unit = static_cast<std::size_t>(args.number("batches-per-unit"));
    cfg.table = args.get("claims-table");
    cfg.dead_letter_topic = args.get("dead-letter-topic");
    if (args.get("group-protocol") == "consumer")
        cfg.kafka["group.protocol"] = "consumer"; // KIP-848: the broker's session timeout
    else
        cfg.kafka["session.timeout.ms"] = "6000";
    cfg.max_attempts = idemkafka::torture::max_attempts;
    // A listener that starts after the producer is done may find nothing but
    // the always-failing orders left: the circuit breaker takes them for an
    // outage until give_up_after. The final run drains within 120 s.
    cfg.circuit_breaker.give_up_after = std::chrono::seconds(20);
    cfg.circuit_breaker.backoff_max = std::chrono::seconds(5);
    if (args.get("ordering") == "key") {
        // A failing order parks only its key; two workers split each partition by key.
        cfg.ordering = idemkafka::Ordering::key;
        cfg.workers = 2;
    } else if (args.get("ordering") != "partition") {
        billing::Args::fail("--ordering: expected partition or key", usage);
    }
    const auto progress = std::chrono::seconds(args.number("progress"));
    const auto seed = static_cast<std::uint64_t>(args.number("misbehave-seed"));
    const auto per_mille = static_cast<int>(args.number("misbehave-per-mille"));
    const auto charge_table = idemkafka::quote_identifier(args.get("charge-table"));
    const auto taken_table = idemkafka::quote_identifier(args.get("charge-table") + "_taken");
    const auto after_error_table = idemkafka::quote_identifier(args.get("charge-table") + "_after_error");

    {
        pqxx::connection c(cfg.postgres);
        pqxx::work tx(c);
        tx.exec("CREATE TABLE IF NOT EXISTS " + charge_table +
                " (id bigserial PRIMARY KEY, order_id text NOT NULL, customer_id text NOT NULL,"
                " amount_cents bigint NOT NULL, currency text NOT NULL, payment_id text NOT NULL,"
                " idempotency_key uuid NOT NULL, charged_at timestamptz NOT NULL DEFAULT now())");
        tx.exec("CREATE TABLE IF NOT EXISTS " + taken_table + " (id int PRIMARY KEY)");
        tx.exec("INSERT INTO " + taken_table + " VALUES (1) ON CONFLICT DO NOTHING");
        tx.exec("CREATE TABLE IF NOT EXISTS " + after_error_table + " (order_id text NOT NULL)");
        tx.commit();
    }

    billing::SimulatedPaymentProvider payments;
    const auto insert = "INSERT INTO " + charge_table +
                        " (order_id, customer_id, amount_cents, currency, payment_id, idempotency_key)"
                        " VALUES ($1, $2, $3, $4, $5, $6::uuid)";
    Consumer consumer(
        cfg, billing::decode, billing::event_id_of,
        [&](pqxx::work& tx, const billing::OrderConfirmed& e, const idemkafka::Context& ctx) {
            const auto how = idemkafka::torture::misbehaviour_of(e.order_id, seed, per_mille);
            const auto key = ctx.idempotency_key();
            pg::exec_params(tx, insert, e.order_id, e.customer_id, e.amount_cents, e.currency,
                            payments.charge(e.order_id, e.amount_cents, e.currency, key), key);
            if (how == Misbehaviour::throw_always || (how == Misbehaviour::throw_once && ctx.attempt() == 1))
                throw std::runtime_error(fmt::format("{} (order {}, attempt {})", idemkafka::torture::thrown_message,
                                                     e.order_id, ctx.attempt()));
            if (how != Misbehaviour::swallow)
                return;
            try {
                tx.exec("INSERT INTO " + taken_table + " VALUES (1)"); // 23505
            } catch (const pqxx::sql_error&) {
                // "already there, fine", says this handler, without a savepoint
            }
            try {
                pg::exec_params(tx, "INSERT INTO " + after_error_table + " VALUES ($1)", e.order_id);
            } catch (const pqxx::sql_error&) {
            }
        });
    g_consumer = &consumer;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);

    // The progress line the driver reads (the same as billing-listener's).
    std::atomic<bool> done{false};
    std::thread watcher([&] {
        while (progress.count() > 0 && !done) {
            for (auto t = std::chrono::milliseconds(0); t < progress && !done; t += std::chrono::milliseconds(100))
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            const auto m = consumer.metrics().snapshot();
            if (m.assigned_partitions > 0)
                fmt::print(stderr, "  consumed {}, charged {}, duplicates skipped {}, lag {}\n", m.consumed, m.claimed,
                           m.duplicates, m.lag);
        }
    });
    struct JoinOnExit {
        std::atomic<bool>& done;
        std::thread& thread;
        ~JoinOnExit()
        {
            done = true;
            thread.join();
        }
    } join_on_exit{done, watcher};
    consumer.run();
    g_consumer = nullptr;

    const auto m = consumer.metrics().snapshot();
    fmt::print("consumed={} charged={} duplicates={} poison={} handler_failures={} handler_aborted={} retries={}\n",
               m.consumed, m.claimed, m.duplicates, m.decode_errors + m.invalid_event_ids, m.handler_failures,
               m.handler_aborted_transactions, m.retries);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "chaos-listener: %s\n", e.what());
    return 1;
}
