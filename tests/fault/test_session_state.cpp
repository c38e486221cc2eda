// Session state a handler (or the server's configuration) leaves on the library's connection:
// a session-level SET of statement_timeout, search_path, ROLE, SESSION AUTHORIZATION,
// session_replication_role, synchronous_commit or idle_in_transaction_session_timeout commits
// with the handler's transaction and would stay with the session; a database default of
// synchronous_commit = off or of a short idle_in_transaction_session_timeout applies to every
// session. None of them may stall the consumer, weaken the commit guard, or let the Kafka
// offset move before the commit is durable.

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

// A database default (ALTER DATABASE ... SET) for the sessions opened while it lives; the
// database is this test program's own (run_isolated.sh), and its cases run one at a time.
class DatabaseSetting {
public:
    DatabaseSetting(std::string name, const std::string& value) : name_(std::move(name))
    {
        exec(fmt::format("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET {} = %L', current_database(), '{}'); "
                         "END $$",
                         name_, value));
    }
    ~DatabaseSetting()
    {
        try {
            exec(fmt::format("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET {}', current_database()); END $$",
                             name_));
        } catch (...) {
            // the next case's fresh database settings are what matters; nothing to do here
        }
    }
    DatabaseSetting(const DatabaseSetting&) = delete;
    DatabaseSetting& operator=(const DatabaseSetting&) = delete;

private:
    std::string name_;
};

// Another role the library's session could run as (a superuser: the library's statements work
// as it, so a handler's SET ROLE or SET SESSION AUTHORIZATION to it commits), dropped at the end.
class OtherRole {
public:
    OtherRole() : name_(unique_name("ik_other")) { exec("CREATE ROLE " + name_ + " NOLOGIN SUPERUSER"); }
    ~OtherRole()
    {
        try {
            exec("DROP ROLE " + name_);
        } catch (...) {
            // left behind in a throwaway cluster
        }
    }
    OtherRole(const OtherRole&) = delete;
    OtherRole& operator=(const OtherRole&) = delete;
    const std::string& name() const { return name_; }

private:
    std::string name_;
};

// What a session shows of the settings the library relies on, '|'-separated.
constexpr const char* settings_sql =
    "SELECT concat_ws('|', current_setting('statement_timeout'), current_setting('search_path'), current_user, "
    "session_user, current_setting('session_replication_role'), current_setting('synchronous_commit'), "
    "current_setting('idle_in_transaction_session_timeout'))";

std::string settings_of(pqxx::transaction_base& tx)
{
    return tx.exec(settings_sql)[0][0].c_str();
}

// The handler's COMMIT on the record of amount 33 (counted), swallowing the
// error: it returns normally, and the library finds the transaction ended.
void commit_at_33(pqxx::work& tx, const TestEvent& e, std::atomic<int>& commits)
{
    if (e.amount != 33)
        return;
    ++commits;
    try {
        tx.exec("COMMIT");
    } catch (const pqxx::failure&) {
    }
}

} // namespace

// Each culprit runs its SET at the end of its first call only, in a transaction of its own
// (max_batch 1), which commits it: the next transactions start with it on the session. The
// statement_timeout of 1 ms alone stalled the consumer for good (every claim cancelled, no
// record blamed); search_path made every later record fail; later claims ran as another
// role. Every later call must see the settings a fresh session has (synchronous_commit at
// least local, idle_in_transaction_session_timeout the library's 0), and every record is
// charged once, none dead-lettered, within a bound.
TEST_CASE("a handler's session-level SET of a setting the library relies on stalls nothing and changes no later "
          "transaction",
          "[fault][session-state]")
{
    OtherRole other;
    constexpr int events = 90;
    Fixture f(1);
    f.publish(events);
    const std::map<std::int64_t, std::string> culprits{
        {10, "SET statement_timeout = 1"},
        {20, "SET search_path = pg_catalog"},
        {30, "SET ROLE " + other.name()},
        {40, "SET SESSION AUTHORIZATION " + other.name()},
        {50, "SET session_replication_role = replica"},
        {60, "SET synchronous_commit = off"},
        {70, "SET idle_in_transaction_session_timeout = 1"},
    };
    std::string fresh;
    {
        pqxx::connection db(pg());
        pqxx::work tx(db);
        fresh = settings_of(tx);
    }
    // A fresh session but for what the library pins in its transactions.
    CHECK(fresh.find("|origin|on|0") != std::string::npos);
    auto cfg = f.config();
    cfg.max_batch = 1;
    std::mutex mu;
    std::set<std::int64_t> done;
    std::map<std::int64_t, std::vector<std::string>> seen; // by amount, one per call
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        const auto now = settings_of(tx);
        std::unique_lock<std::mutex> lock(mu);
        seen[e.amount].push_back(now);
        const auto culprit = culprits.find(e.amount);
        if (culprit != culprits.end() && done.insert(e.amount).second) {
            lock.unlock();
            tx.exec(culprit->second);
        }
    });
    run_until(
        c, [&] { return f.committed_total(1) == events; }, 30s);
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_lettered_total() == 0);
    f.check_exact(events);
    std::lock_guard<std::mutex> lock(mu);
    CHECK(seen.size() == static_cast<std::size_t>(events));
    for (const auto& [amount, values] : seen) {
        CAPTURE(amount);
        for (const auto& value : values)
            CHECK(value == fresh);
    }
}

// The commit guard's trigger is an ordinary (origin) trigger: with session_replication_role =
// replica on the session (a superuser handler's session-level SET) it would not fire, and a
// later handler's COMMIT would commit the claims of its batch's records whose handlers never
// ran. The culprit is dead-lettered; every other record commits once with its claim.
TEST_CASE("the commit guard still refuses a handler's COMMIT after a handler set session_replication_role",
          "[fault][session-state]")
{
    constexpr int events = 60;
    Fixture f(1);
    f.publish(events);
    auto cfg = f.config();
    cfg.max_batch = 10;
    cfg.max_attempts = 2;
    std::atomic<bool> replica_set{false};
    std::atomic<int> commits{0};
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (e.amount == 5 && !replica_set.exchange(true))
            tx.exec("SET session_replication_role = replica");
        commit_at_33(tx, e, commits);
    });
    run_until(
        c, [&] { return f.committed_total(1) == events; }, 30s);
    const auto m = c.metrics().snapshot();
    CHECK(replica_set);
    CHECK(commits == cfg.max_attempts);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
    CHECK(m.dead_lettered_total() == 1);
    f.check_exact(events - 1);
}

// The same with replica as the database's default (a superuser's ALTER DATABASE): every session
// starts with it, so the arm finds the session as it was and the next transaction takes the short
// prologue, in which only the claim statement sets the role back to origin for the transaction,
// before its update of the guard row queues the trigger's event.
TEST_CASE("the commit guard refuses a handler's COMMIT when the database's default session_replication_role is "
          "replica",
          "[fault][session-state]")
{
    const DatabaseSetting setting("session_replication_role", "replica");
    constexpr int events = 60;
    Fixture f(1);
    f.publish(events);
    auto cfg = f.config();
    cfg.max_batch = 10;
    cfg.max_attempts = 2;
    std::atomic<int> commits{0};
    std::atomic<int> calls{0};
    std::atomic<int> replica_calls{0}; // calls that saw the database's replica
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        ++calls;
        if (tx.exec("SELECT current_setting('session_replication_role')")[0][0].as<std::string>() != "origin")
            ++replica_calls;
        commit_at_33(tx, e, commits);
    });
    run_until(
        c, [&] { return f.committed_total(1) == events; }, 30s);
    const auto m = c.metrics().snapshot();
    CHECK(commits == cfg.max_attempts);
    CHECK(calls >= events);
    CHECK(replica_calls == 0);
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
    CHECK(m.dead_lettered_total() == 1);
    f.check_exact(events - 1);
}

// A deferred constraint trigger on the effects table notes synchronous_commit at COMMIT (after
// every statement of the transaction, the library's own too): with off, COMMIT returns before
// the WAL is flushed and the offset committed right after would outlive a server crash that
// loses the effects. Raised to local when off; a stronger level is kept.
TEST_CASE("synchronous_commit is at least local when the claims commit, whatever the database or a handler set",
          "[fault][session-state]")
{
    std::string database_default;
    bool handler_sets_off = false;
    std::string expected = "local";
    SECTION("ALTER DATABASE ... SET synchronous_commit = off")
    {
        database_default = "off";
    }
    SECTION("a handler's SET synchronous_commit = off in its transaction")
    {
        handler_sets_off = true;
    }
    SECTION("a stronger level than local is kept")
    {
        database_default = "remote_write";
        expected = "remote_write";
    }
    CAPTURE(database_default, handler_sets_off);
    std::unique_ptr<DatabaseSetting> setting;
    if (!database_default.empty())
        setting = std::make_unique<DatabaseSetting>("synchronous_commit", database_default);
    constexpr int events = 40;
    Fixture f(1);
    const auto noted = unique_name("noted");
    exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, level text NOT NULL);"
                     "CREATE FUNCTION {}_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                     "INSERT INTO {} VALUES (NEW.event_id, current_setting('synchronous_commit')); RETURN NULL; END $$;"
                     "CREATE CONSTRAINT TRIGGER note AFTER INSERT ON {} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                     "EXECUTE FUNCTION {}_note()",
                     noted, noted, noted, f.effects, noted));
    f.publish(events);
    auto cfg = f.config();
    cfg.max_batch = 8;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (handler_sets_off)
            tx.exec(e.amount % 2 ? "SET LOCAL synchronous_commit = off" : "SET synchronous_commit = off");
    });
    run_until(
        c, [&] { return f.committed_total(1) == events; }, 30s);
    f.check_exact(events);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {}", noted)) == events);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE level = '{}'", noted, expected)) == events);
}

// With the server ending sessions idle in a transaction for 500 ms, a handler that spends
// longer than that between two statements (an external call) lost its batch at every attempt,
// and called out again each time. The library's transactions set their own bound.
TEST_CASE("a database's idle_in_transaction_session_timeout shorter than a handler call ends no batch",
          "[fault][session-state]")
{
    const DatabaseSetting setting("idle_in_transaction_session_timeout", "500ms");
    constexpr int events = 20;
    Fixture f(1);
    f.publish(events);
    auto cfg = f.config();
    cfg.max_batch = 5;
    std::mutex mu;
    std::map<std::int64_t, int> calls;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        {
            std::lock_guard<std::mutex> lock(mu);
            ++calls[e.amount];
        }
        if (e.amount % 7 == 3) {
            std::this_thread::sleep_for(700ms); // the external call, with the transaction open
            tx.exec("SELECT 1");
        }
    });
    run_until(
        c, [&] { return f.committed_total(1) == events; }, 30s);
    const auto m = c.metrics().snapshot();
    CHECK(m.db_reconnects == 0);
    CHECK(m.dead_lettered_total() == 0);
    f.check_exact(events);
    std::lock_guard<std::mutex> lock(mu);
    CHECK(calls.size() == static_cast<std::size_t>(events));
    for (const auto& [amount, n] : calls) {
        CAPTURE(amount);
        CHECK(n == 1);
    }
}
