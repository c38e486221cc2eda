// Structured log records and the no-secrets guarantee, against a real
// PostgreSQL and a Kafka-protocol broker: consumers, a maintenance runner and
// an outbox relay whose configuration holds passwords log and throw, and no
// record and no exception text carries a password.

#include <atomic>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/outbox.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/retention.hpp>

#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

// Every secret below contains this; no captured text may.
constexpr std::string_view marker = "S3cret";
const std::string pg_password = "Sup3rS3cret";
// libpq quotes an undecodable URI password back in its error, without its key.
const std::string pg_uri_password = "Sup3r%zzS3cret";
const std::string kafka_password = "Kafka-S3cret-77";

// Adds `key=value` to a key/value connection string or a URI.
std::string with_option(const std::string& conninfo, const std::string& key, const std::string& value)
{
    if (conninfo.find("://") == std::string::npos)
        return conninfo + " " + key + "=" + value;
    return conninfo + (conninfo.find('?') == std::string::npos ? "?" : "&") + key + "=" + value;
}

// Everything the library logged (records of structured sinks, lines of
// (level, message) sinks) and threw.
class Capture {
public:
    LogSink structured()
    {
        return [this](const LogRecord& r) {
            std::lock_guard<std::mutex> lock(mu_);
            records_.push_back(r);
        };
    }
    LogSink plain()
    {
        return [this](LogLevel level, std::string_view line) {
            std::lock_guard<std::mutex> lock(mu_);
            records_.push_back(LogRecord{level, std::string(line), {}});
        };
    }
    void thrown(const std::exception& e)
    {
        std::lock_guard<std::mutex> lock(mu_);
        errors_.emplace_back(e.what());
    }
    std::vector<LogRecord> records() const
    {
        std::lock_guard<std::mutex> lock(mu_);
        return records_;
    }
    std::vector<std::string> errors() const
    {
        std::lock_guard<std::mutex> lock(mu_);
        return errors_;
    }
    // The first record whose message holds `part` (and whose fields `pred` accepts).
    std::optional<LogRecord> find(std::string_view part,
                                  const std::function<bool(const LogRecord&)>& pred = nullptr) const
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& r : records_)
            if (r.message.find(part) != std::string::npos && (!pred || pred(r)))
                return r;
        return std::nullopt;
    }
    std::size_t count_component(std::string_view component) const
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::size_t n = 0;
        for (const auto& r : records_)
            if (r.field(log_field::component) == component)
                ++n;
        return n;
    }

private:
    mutable std::mutex mu_;
    std::vector<LogRecord> records_;
    std::vector<std::string> errors_;
};

void check_no_secret(const Capture& capture)
{
    const auto records = capture.records();
    const auto errors = capture.errors();
    // Not vacuous: there were lines and exceptions to look at.
    REQUIRE(records.size() >= 10);
    REQUIRE_FALSE(errors.empty());
    for (const auto& r : records) {
        const auto text = format_text(r);
        INFO(text);
        CHECK(text.find(marker) == std::string::npos);
        CHECK(format_json(r).find(marker) == std::string::npos);
    }
    for (const auto& e : errors) {
        INFO(e);
        CHECK(e.find(marker) == std::string::npos);
    }
}

std::int64_t count_in(const std::string& conninfo, const std::string& sql)
{
    pqxx::connection c(conninfo);
    pqxx::nontransaction tx(c);
    return tx.exec(sql)[0][0].as<std::int64_t>();
}

void exec_in(const std::string& conninfo, const std::string& sql)
{
    pqxx::connection c(conninfo);
    pqxx::nontransaction tx(c);
    tx.exec(sql);
}

// A database of its own, so that refusing connections to it (an outage) cannot
// touch other tests. Dropped at the end, also on failure.
struct ScratchDatabase {
    std::string name = unique_name("ik_log_db");
    ScratchDatabase() { exec("CREATE DATABASE " + name); }
    ~ScratchDatabase()
    {
        try {
            exec("ALTER DATABASE " + name + " ALLOW_CONNECTIONS true");
            exec("DROP DATABASE " + name + " WITH (FORCE)");
        } catch (...) {
        }
    }
    std::string conninfo() const { return with_option(pg(), "dbname", name); }
};

} // namespace

TEST_CASE("a consumer whose configuration holds passwords never logs or throws them", "[integration][logging]")
{
    Capture capture;
    ScratchDatabase db;
    exec_in(db.conninfo(), "CREATE TABLE effect (event_id uuid PRIMARY KEY)");

    const auto topic = unique_name("log");
    const auto group = unique_name("g");
    create_topic(topic, 2);
    std::vector<TestEvent> events;
    auto publish = [&](int n) {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < n; ++i) {
            TestEvent e{new_event_id(), fmt::format("order-{}", events.size()), 100};
            events.push_back(e);
            pub.publish_async(topic, e.entity, encode(e));
        }
        pub.flush();
    };
    publish(20);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        pub.publish(topic, std::string("poison"), "not an event");
    }
    const EventId fails_once = events[3].id;

    auto cfg = consumer_config(group, topic);
    // Trust authentication: the server ignores the password, the library must hide it.
    cfg.postgres = with_option(db.conninfo(), "password", pg_password);
    // Accepted by librdkafka with security.protocol=plaintext (SASL and the key
    // password only apply to sasl_* and ssl), so the mock broker still connects;
    // debug=conf makes librdkafka log its configuration.
    cfg.kafka["sasl.username"] = "bob";
    cfg.kafka["sasl.password"] = kafka_password;
    cfg.kafka["ssl.key.password"] = kafka_password;
    cfg.kafka["debug"] = "conf";
    cfg.log = capture.structured();
    std::atomic<bool> failed_once{false};
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        if (e.id == fails_once && !failed_once.exchange(true))
            throw std::runtime_error("payment service refused host=pay password=" + pg_password);
        detail::pg::exec_params(tx, "INSERT INTO effect (event_id) VALUES ($1::uuid)", e.id.to_string());
    });
    {
        Runner<Consumer> run(consumer);
        REQUIRE(wait_until([&] { return count_in(db.conninfo(), "SELECT count(*) FROM effect") == 20; }, 60s));
        REQUIRE(wait_until([&] { return capture.find("dead-lettered").has_value(); }, 30s));

        // An outage: the connections are dropped and new ones refused, so the
        // consumer logs lost connections and failed reconnects.
        exec("ALTER DATABASE " + db.name + " ALLOW_CONNECTIONS false");
        exec(fmt::format("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'", db.name));
        publish(5);
        CHECK(wait_until([&] { return capture.find("PostgreSQL reconnect failed").has_value(); }, 30s));
        exec("ALTER DATABASE " + db.name + " ALLOW_CONNECTIONS true");
        REQUIRE(wait_until([&] { return count_in(db.conninfo(), "SELECT count(*) FROM effect") == 25; }, 60s));
        run.join();
        if (auto e = run.error()) {
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                capture.thrown(ex);
                FAIL(ex.what());
            }
        }
    }

    // The fields known at each call site.
    const auto retry = capture.find("handler failed on");
    REQUIRE(retry);
    CHECK(retry->message.find("password=***") != std::string::npos); // redacted, not dropped
    CHECK(retry->field(log_field::component) == std::string_view("consumer"));
    CHECK(retry->field(log_field::group) == std::string_view(group));
    CHECK(retry->field(log_field::topic) == std::string_view(topic));
    CHECK(retry->field(log_field::partition).has_value());
    CHECK(retry->field(log_field::offset).has_value());
    CHECK(retry->field(log_field::event_id) == std::string_view(fails_once.to_string()));
    CHECK(retry->field(log_field::error).has_value());
    const auto dead = capture.find("dead-lettered");
    REQUIRE(dead);
    CHECK(dead->field(log_field::topic) == std::string_view(topic));
    CHECK(dead->field("reason") == std::string_view("decode_error"));
    CHECK(dead->field(log_field::group) == std::string_view(group));
    const auto reconnect = capture.find("PostgreSQL reconnect failed");
    REQUIRE(reconnect);
    CHECK(reconnect->field(log_field::error).has_value());
    // librdkafka's own lines (its configuration dump among them), tagged with the group.
    CHECK(capture.find("rdkafka", [&](const LogRecord& r) {
        return r.field(log_field::component) == std::string_view("librdkafka") &&
               r.field(log_field::group) == std::string_view(group);
    }));
    CHECK(capture.find("sasl.password"));
    for (const auto& r : capture.records()) {
        INFO(format_text(r));
        CHECK(r.field(log_field::component).has_value());
        CHECK(r.field(log_field::group) == std::string_view(group));
    }

    // A second run against a server that is not there: the start fails, and the
    // error names the problem without the password, in both connection string forms.
    for (const auto& bad : {"host=127.0.0.1 port=1 dbname=x user=bob connect_timeout=3 password=" + pg_password,
                            "postgresql://bob:" + pg_uri_password + "@127.0.0.1:1/x?connect_timeout=3"}) {
        auto cfg2 = cfg;
        cfg2.postgres = bad;
        Consumer broken(cfg2, decode, event_id_of, [](pqxx::work&, const TestEvent&, const Context&) {});
        try {
            broken.run();
            FAIL("run() should have thrown");
        } catch (const DatabaseError& e) {
            capture.thrown(e);
            CHECK(std::string_view(e.what()).find("cannot start") != std::string_view::npos);
        }
    }
    const auto errors = capture.errors();
    REQUIRE(errors.size() == 2);
    CHECK(errors[1].find("invalid percent-encoded token: \"***\"") != std::string::npos);

    check_no_secret(capture);
}

TEST_CASE("maintenance and outbox relay never log or throw the password of their connection string",
          "[integration][logging]")
{
    Capture capture;
    const std::vector<std::string> unreachable = {
        "host=127.0.0.1 port=1 dbname=x user=bob connect_timeout=3 password=" + pg_password,
        "host=127.0.0.1 port=1 dbname=x user=bob connect_timeout=3 password='" + pg_password + " x'",
        "postgresql://bob:" + pg_password + "@127.0.0.1:1/x?connect_timeout=3",
        "postgresql://bob:" + pg_uri_password + "@127.0.0.1:1/x",
    };
    RetentionConfig rc;
    rc.maintenance_interval = 100ms;
    for (const auto& conninfo : unreachable) {
        INFO(conninfo);
        // The (level, message) form of sink, as sinks were before structured fields.
        MaintenanceRunner runner(conninfo, ProcessedEventStore("public", "processed_event"), rc, capture.plain());
        REQUIRE(wait_until([&] { return runner.failures() >= 1; }, 30s));
        runner.stop();

        PublisherConfig pc{brokers(), {{"sasl.password", kafka_password}}, capture.structured()};
        OutboxRelayOptions options;
        options.log = capture.structured();
        options.poll_interval = 20ms;
        options.retry_backoff = 20ms;
        OutboxRelay relay(conninfo, Outbox("public", "outbox"), pc, options);
        try {
            relay.run_once();
            FAIL("run_once() should have thrown");
        } catch (const DatabaseError& e) {
            capture.thrown(e);
        }
        relay.start();
        REQUIRE(wait_until([&] { return relay.stats().errors >= 3; }, 30s));
        relay.stop();
    }
    const auto maintenance = capture.find("maintenance of");
    REQUIRE(maintenance);
    CHECK(maintenance->level == LogLevel::warning);
    const auto cycle = capture.find("cycle failed");
    REQUIRE(cycle);
    CHECK(cycle->field(log_field::component) == std::string_view("relay"));
    CHECK(cycle->field(log_field::error).has_value());
    // The undecodable URI password is quoted by libpq without its key: masked as a known secret.
    CHECK(capture.find("invalid percent-encoded token: \"***\""));
    CHECK(capture.count_component("relay") >= 4);
    CHECK(capture.errors().size() == unreachable.size());

    check_no_secret(capture);
}
