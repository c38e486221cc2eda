// A handler tested with the installed kit: every event charged once, a re-sent
// event skipped, a poison record dead-lettered. Plain main(): exit 0 or 1.
#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <idemkafka/consumer.hpp>
#include <idemkafka/testing.hpp>

namespace {

struct Charge {
    idemkafka::EventId id;
};

int failures = 0;

void expect(bool ok, const char* what)
{
    if (!ok) {
        std::printf("FAILED: %s\n", what);
        ++failures;
    }
}

} // namespace

int main()
{
    try {
        idemkafka::TestBroker broker;
        idemkafka::TestDatabase db; // IDEMKAFKA_TEST_PG, else a throwaway cluster
        broker.create_topic("charges", 1);
        broker.create_topic("billing.dlq", 1);
        db.exec("CREATE TABLE charge (event_id uuid NOT NULL)");

        const auto first = idemkafka::new_event_id().to_string();
        broker.produce("charges", std::string("a"), first);
        broker.produce("charges", std::string("b"), idemkafka::new_event_id().to_string());
        broker.produce("charges", std::string("a"), first); // re-sent
        broker.produce("charges", std::string("c"), std::string("garbage"));

        idemkafka::ConsumerConfig cfg;
        cfg.group_id = "billing";
        cfg.topics = {"charges"};
        broker.configure(cfg);
        db.configure(cfg);
        cfg.log = idemkafka::stderr_sink(idemkafka::LogLevel::error);
        idemkafka::IdempotentConsumer<Charge> consumer(
            cfg,
            [](std::string_view payload) {
                try {
                    return Charge{idemkafka::EventId::parse(payload)};
                } catch (const idemkafka::InvalidEventId& e) {
                    throw idemkafka::DecodeError(e.what());
                }
            },
            [](const Charge& c) { return c.id; },
            [](pqxx::work& tx, const Charge& c, const idemkafka::Context&) {
                tx.exec("INSERT INTO charge VALUES (" + tx.quote(c.id.to_string()) + ")");
            });
        std::exception_ptr run_error;
        std::thread runner([&] {
            try {
                consumer.run();
            } catch (...) {
                run_error = std::current_exception();
            }
        });
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (consumer.metrics().snapshot().dead_lettered_total() + consumer.metrics().snapshot().claimed +
                       consumer.metrics().snapshot().duplicates <
                   4 &&
               std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        consumer.stop();
        runner.join();
        if (run_error)
            std::rethrow_exception(run_error);

        const auto m = consumer.metrics().snapshot();
        expect(m.claimed == 2, "two events claimed");
        expect(m.duplicates == 1, "the re-sent event skipped as a duplicate");
        expect(db.scalar("SELECT count(*) FROM charge") == 2, "two charges, none doubled");
        const auto dead = broker.read_all("billing.dlq");
        expect(dead.size() == 1 && dead[0].header("idemkafka.reason") == std::optional<std::string>("decode_error"),
               "the poison record dead-lettered with reason decode_error");
    } catch (const std::exception& e) {
        std::printf("FAILED: %s\n", e.what());
        return 1;
    }
    if (failures == 0)
        std::puts("kit ok: 2 charged, 1 duplicate, 1 dead-lettered");
    return failures == 0 ? 0 : 1;
}
