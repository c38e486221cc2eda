// The library behind PgBouncer (Debian's pgbouncer, support/pgbouncer.sh) in front of the test's
// PostgreSQL. The library keeps state on its sessions (the commit guard's temporary table and
// prepared statements, read-only as the default of transactions, lock_timeout, advisory locks):
// in session pooling mode each client session has a server session of its own for its
// lifetime, and everything is exact; in transaction pooling mode a server session serves
// whichever client runs the next transaction, so that state would reach other clients (the
// maintenance thread's DELETE refused as read-only, another service's transactions read-only)
// and the library refuses to start, before leaving anything on a session.

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/retention.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// Runs a shell command (stderr to ours) for at most `bound_s` seconds; its stdout, or throws.
std::string run_script(const std::string& args, int bound_s)
{
    const auto command = fmt::format("timeout -k 5 {} bash '{}' {}", bound_s, IDEMKAFKA_PGBOUNCER_SH, args);
    std::FILE* p = ::popen(command.c_str(), "r");
    if (!p)
        throw std::runtime_error("cannot run " + command);
    std::string out;
    char buf[512];
    std::size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        out.append(buf, n);
    const int status = ::pclose(p);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error(fmt::format("pgbouncer.sh {} failed (its messages are above): {}", args, out));
    return out;
}

std::string value_of(const std::string& out, const std::string& key)
{
    const auto at = out.find(key + "=");
    if (at == std::string::npos)
        return "";
    const auto end = out.find('\n', at);
    return out.substr(at + key.size() + 1, end == std::string::npos ? std::string::npos : end - at - key.size() - 1);
}

// PgBouncer in `mode` in front of the test's server, stopped on destruction.
class Bouncer {
public:
    explicit Bouncer(const std::string& mode)
    {
        pqxx::connection db(pg());
        pqxx::work tx(db);
        const auto row = tx.exec("SELECT split_part(current_setting('unix_socket_directories'), ',', 1), "
                                 "current_setting('port'), current_database()")[0];
        const std::string socket_dir = row[0].c_str();
        database_ = row[2].c_str();
        std::string out;
        try {
            out = run_script(fmt::format("start --watch-pid {} --mode {} --host '{}' --port {}", getpid(), mode,
                                         socket_dir.empty() ? "127.0.0.1" : socket_dir, row[1].c_str()),
                             30);
        } catch (...) {
            dir_ = value_of(out, "dir");
            stop();
            throw;
        }
        dir_ = value_of(out, "dir");
        port_ = value_of(out, "port");
        if (port_.empty()) {
            stop();
            throw std::runtime_error("pgbouncer.sh start printed no port: " + out);
        }
    }
    ~Bouncer() { stop(); }
    Bouncer(const Bouncer&) = delete;
    Bouncer& operator=(const Bouncer&) = delete;

    /// Conninfo of the test's database through the pool.
    std::string dsn() const
    {
        return fmt::format("host=127.0.0.1 port={} dbname={} user=postgres connect_timeout=5", port_, database_);
    }

    void stop() noexcept
    {
        if (dir_.empty())
            return;
        try {
            run_script("stop " + dir_, 30);
        } catch (...) {
            // its watchdog stops it once this process is gone
        }
        dir_.clear();
    }

private:
    std::string database_;
    std::string dir_;
    std::string port_;
};

// What plain clients of the pool see of the settings the library sets on its sessions, and
// of its session objects: several at once, so that they get different server sessions.
void check_clients_see_defaults(const Bouncer& b)
{
    std::vector<std::unique_ptr<pqxx::connection>> clients;
    for (int i = 0; i < 4; ++i)
        clients.push_back(std::make_unique<pqxx::connection>(b.dsn()));
    for (auto& c : clients) {
        pqxx::work tx(*c);
        const auto row = tx.exec("SELECT current_setting('default_transaction_read_only'), "
                                 "current_setting('lock_timeout'), "
                                 "(SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'idemkafka%'), "
                                 "(SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()) > 0")[0];
        CHECK(std::string(row[0].c_str()) == "off");
        CHECK(std::string(row[1].c_str()) == "0");
        CHECK(row[2].as<int>() == 0);
        CHECK_FALSE(row[3].as<bool>());
    }
}

} // namespace

TEST_CASE("behind PgBouncer in transaction pooling mode the consumer refuses to start and leaves nothing on a "
          "session",
          "[fault][pgbouncer]")
{
    const Bouncer b("transaction");
    Fixture f(1);
    f.publish(20);
    auto cfg = f.config();
    cfg.postgres = b.dsn();
    cfg.workers = 2;
    std::string error;
    try {
        Consumer c(cfg, decode, event_id_of,
                   [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
        Runner<Consumer> run(c);
        wait_until([&] { return run.finished() || f.committed_total(1) == 20; }, 30s);
        run.join();
        if (auto e = run.error())
            std::rethrow_exception(e);
    } catch (const ConfigError& e) {
        error = e.what();
    }
    INFO(error);
    CHECK(error.find("transaction pooling") != std::string::npos);
    CHECK(error.find("session") != std::string::npos);
    CHECK(f.rows() == 0);
    check_clients_see_defaults(b);
    // Nor any lock of the library's on a session of the server.
    CHECK(scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                 "database = (SELECT oid FROM pg_database WHERE datname = current_database())") == 0);
}

TEST_CASE("behind PgBouncer in session pooling mode a consumer and maintenance are exact and other clients see "
          "none of the library's settings",
          "[fault][pgbouncer]")
{
    const Bouncer b("session");
    constexpr int events = 200;
    constexpr int resent = 40;
    Fixture f(2);
    f.publish(events);
    {
        // Re-sends: the same payloads again, skipped as duplicates.
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < resent; ++i)
            pub.publish_async(f.topic, f.events[i].entity, encode(f.events[i]));
        pub.flush();
    }
    auto cfg = f.config();
    cfg.postgres = b.dsn();
    cfg.workers = 2;
    cfg.retention.maintenance_interval = 200ms;
    RetentionConfig rcfg;
    rcfg.maintenance_interval = 200ms;
    {
        Consumer c(cfg, decode, event_id_of,
                   [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); });
        MaintenanceRunner maintenance(b.dsn(), ProcessedEventStore("public", "processed_event"), rcfg, log_sink());
        Runner<Consumer> run(c);
        const bool done = wait_until(
            [&] {
                return f.committed_total(2) == events + resent && maintenance.runs() >= 3 &&
                       c.metrics().snapshot().duplicates == resent;
            },
            30s);
        check_clients_see_defaults(b); // beside the library's open sessions
        run.join();
        maintenance.stop();
        fail_if_threw(run.error());
        const auto m = c.metrics().snapshot();
        INFO(nonzero_metrics(c));
        REQUIRE(done);
        CHECK(maintenance.failures() == 0);
        CHECK(m.duplicates == resent);
        CHECK(m.db_failures == 0);
    }
    f.check_exact(events);
    check_clients_see_defaults(b); // the sessions the library had, once PgBouncer reset them
}
