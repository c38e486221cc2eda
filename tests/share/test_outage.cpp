// Outages are not poison in a share group either: a PostgreSQL that is away
// for a few seconds, or a downstream service that fails every handler call
// for a few seconds, must not spend the deliveries of the records acquired
// meanwhile (the broker counts deliveries, and archives or we dead-letter a
// record at its limit), and records given back past the batch budget must
// not reach the limit without ever being tried. After each: every effect
// exactly once, no dead letter.

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "catch_compat.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int delivery_limit = 3; // few deliveries: a flood shows at once

// The effects and dead letters once every record has settled somewhere.
void check_exact(const Consumer& c, const std::string& table, int n)
{
    const auto m = c.metrics().snapshot();
    const auto& s = c.share_metrics();
    WARN(fmt::format("{} records: {} effects, {} dead letters, {} handler failures, {} released, {} outages, {} "
                     "pauses, {} resumes",
                     n, effects(table), m.dead_lettered_total(), m.handler_failures, s.released.get(), s.outages.get(),
                     s.acquisition_pauses.get(), s.acquisition_resumes.get()));
    CHECK(m.dead_lettered_total() == 0);
    CHECK(s.delivery_limit_dead_letters.get() == 0);
    CHECK(s.archived_without_dead_letter.get() == 0);
    CHECK(effects(table) == n);
    CHECK(distinct_effects(table) == n);
}

// Settled: every record has its effect or a dead letter (bounded).
bool settle(const Consumer& c, const std::string& table, int n, Runner<Consumer>& runner)
{
    return wait_until(
        [&] {
            return effects(table) + static_cast<std::int64_t>(c.metrics().snapshot().dead_lettered_total()) >= n ||
                   runner.finished();
        },
        50s);
}

// Runs until settled, stops, and rethrows what run() threw.
void drain(const Consumer& c, const std::string& table, int n, Runner<Consumer>& runner)
{
    REQUIRE(settle(c, table, n, runner));
    runner.join();
    if (auto error = runner.error())
        std::rethrow_exception(error);
}

// The test database refuses connections and every session of the consumer
// on it is ended, until lifted: PostgreSQL away, as a restart or a failover
// shows it to a client. The test keeps one session of its own to lift it.
class DatabaseAway {
public:
    DatabaseAway() : db_(scalar_text("SELECT current_database()")), admin_(pg() + " dbname=postgres")
    {
        pqxx::nontransaction tx(admin_);
        tx.exec("ALTER DATABASE " + tx.quote_name(db_) + " ALLOW_CONNECTIONS false");
        tx.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = " + tx.quote(db_));
    }
    ~DatabaseAway() { lift(); }
    void lift()
    {
        if (lifted_)
            return;
        pqxx::nontransaction tx(admin_);
        tx.exec("ALTER DATABASE " + tx.quote_name(db_) + " ALLOW_CONNECTIONS true");
        lifted_ = true;
    }

private:
    static std::string scalar_text(const std::string& sql)
    {
        pqxx::connection c(pg());
        pqxx::nontransaction tx(c);
        return tx.exec(sql)[0][0].as<std::string>();
    }
    std::string db_;
    pqxx::connection admin_;
    bool lifted_ = false;
};

} // namespace

TEST_CASE("share: PostgreSQL away for a few seconds spends no deliveries: exact effects, no dead letter", "[share]")
{
    constexpr int n = 600;
    const auto topic = share_topic("share_db_outage", 2);
    const auto group = unique_name("share_db_outage_g");
    share_setting(group, "delivery-limit", std::to_string(delivery_limit));
    share_setting(group, "lock-duration-ms", "4000");
    const auto table = make_effect_table(unique_name("share_effects"));
    publish(topic, new_events("db", n));

    auto cfg = share_config(group, topic);
    cfg.delivery_limit = delivery_limit;
    cfg.lock_duration = 4000ms; // a batch budget of 2 s: shorter than the outage
    cfg.members = 2;
    cfg.consumer.max_batch = 50;
    cfg.consumer.postgres = pg() + " connect_timeout=2";
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        std::this_thread::sleep_for(2ms); // the records flow for a while
        insert_effect(tx, table, e, ctx);
        ++calls;
    });
    Runner<Consumer> runner(c);
    REQUIRE(wait_until([&] { return calls.load() >= 100 || runner.finished(); }, 30s));
    {
        DatabaseAway away;
        std::this_thread::sleep_for(6s); // the outage itself: what it lasts is the test's subject
    }
    drain(c, table, n, runner);
    check_exact(c, table, n);
    CHECK(c.share_metrics().outages.get() >= 1);
    CHECK(c.share_metrics().acquisition_pauses.get() >= 1);
}

TEST_CASE("share: a downstream outage of a few seconds over every key: exact effects, no dead letter", "[share]")
{
    constexpr int n = 600;
    const auto topic = share_topic("share_handler_outage", 2);
    const auto group = unique_name("share_handler_outage_g");
    share_setting(group, "delivery-limit", std::to_string(delivery_limit));
    share_setting(group, "lock-duration-ms", "4000");
    const auto table = make_effect_table(unique_name("share_effects"));
    publish(topic, new_events("down", n));

    auto cfg = share_config(group, topic);
    cfg.delivery_limit = delivery_limit;
    cfg.lock_duration = 4000ms; // a batch budget of 2 s: the outage outlasts it, the members pause
    cfg.members = 2;
    cfg.consumer.max_batch = 50;
    cfg.consumer.circuit_breaker.backoff = 500ms;
    cfg.consumer.circuit_breaker.backoff_max = 2s;
    std::mutex mu;
    std::atomic<int> calls{0};
    std::optional<Clock::time_point> down_until;
    std::atomic<int> failed_calls{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        std::this_thread::sleep_for(2ms);
        {
            std::lock_guard<std::mutex> lock(mu);
            if (++calls == 100)
                down_until = Clock::now() + 5s; // from the 100th call on, every call fails for 5 s
            if (down_until && Clock::now() < *down_until) {
                ++failed_calls;
                throw std::runtime_error("payment provider unavailable (503)");
            }
        }
        insert_effect(tx, table, e, ctx);
    });
    Runner<Consumer> runner(c);
    drain(c, table, n, runner);
    CHECK(failed_calls.load() > 0);
    check_exact(c, table, n);
    CHECK(c.metrics().snapshot().circuit_opened >= 1);
    CHECK(c.share_metrics().outages.get() >= 1);
    CHECK(c.share_metrics().acquisition_pauses.get() >= 1);
    CHECK(c.share_metrics().acquisition_resumes.get() >= 1);
}

TEST_CASE("share: records given back past the batch budget are tried before they reach the delivery limit", "[share]")
{
    constexpr int n = 400;
    const auto topic = share_topic("share_budget", 4);
    const auto group = unique_name("share_budget_g");
    share_setting(group, "delivery-limit", std::to_string(delivery_limit));
    share_setting(group, "lock-duration-ms", "3000");
    const auto table = make_effect_table(unique_name("share_effects"));
    publish(topic, new_events("slow", n));

    auto cfg = share_config(group, topic);
    cfg.delivery_limit = delivery_limit;
    cfg.lock_duration = 3000ms; // a batch budget of 1.5 s: about 100 calls of 15 ms
    cfg.consumer.max_batch = 500;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        std::this_thread::sleep_for(15ms);
        insert_effect(tx, table, e, ctx);
    });
    Runner<Consumer> runner(c);
    drain(c, table, n, runner);
    CHECK(c.share_metrics().budget_given_back.get() > 0);
    check_exact(c, table, n);
}
