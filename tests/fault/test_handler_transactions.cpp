// Handlers that end the library's transaction themselves: tx.commit(), COMMIT, END, ROLLBACK,
// ABORT, COMMIT; BEGIN, ROLLBACK; BEGIN, COMMIT AND CHAIN, ROLLBACK AND CHAIN, PREPARE
// TRANSACTION, run by the handler after its own insert for a few records. All of a
// transaction's event ids are claimed before its first handler call, so a COMMIT there would
// commit the claims of records whose handlers never ran (lost), and a new transaction begun
// there would commit effects without claims (doubled on redelivery). Whatever the statement:
// every other record's effect commits once with its claim, the culprit's writes never commit,
// and the culprit is retried, then dead-lettered naming what it did.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
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

// What a culprit's handler does after its insert.
struct Statement {
    const char* name;
    const char* sql; // nullptr: tx.commit()
};

const std::vector<Statement> statements{
    {"tx.commit()", nullptr},
    {"COMMIT", "COMMIT"},
    {"END", "END"},
    {"ROLLBACK", "ROLLBACK"},
    {"ABORT", "ABORT"},
    {"COMMIT; BEGIN", "COMMIT; BEGIN"},
    {"ROLLBACK; BEGIN", "ROLLBACK; BEGIN"},
    {"COMMIT AND CHAIN", "COMMIT AND CHAIN"},
    {"ROLLBACK AND CHAIN", "ROLLBACK AND CHAIN"},
    {"PREPARE TRANSACTION", "PREPARE TRANSACTION '{}'"},
};

} // namespace

// A batch handler call for several records runs them in one go: a record's ROLLBACK AND CHAIN
// there leaves a read-write transaction of the handler's own that a later record's COMMIT in
// the same call would commit (the guard guards the library's transactions only; see
// docs/failures.md). So each batch run has one kind of statement; the per-record runs mix them all.
TEST_CASE("a handler that ends the library's transaction: no other record is lost or doubled, the culprit is "
          "dead-lettered, nothing it wrote commits",
          "[fault][handler-transaction]")
{
    constexpr int partitions = 2;
    std::string shape;
    int workers = 1;
    SECTION("per-record handler")
    {
        shape = "records";
    }
    SECTION("batch handler")
    {
        shape = "batch";
    }
    SECTION("per-record handler, 2 workers")
    {
        shape = "records";
        workers = 2;
    }
    CAPTURE(shape, workers);
    auto run = [&](const std::vector<const Statement*>& kinds, int events, std::size_t every) {
        Fixture f(partitions);
        f.publish(events);
        std::map<EventId, const Statement*> culprit; // what each culprit's handler runs
        for (std::size_t i = 0; i < f.events.size(); i += every)
            culprit[f.events[i].id] = kinds[culprit.size() % kinds.size()];
        const auto culprits = static_cast<std::int64_t>(culprit.size());
        auto cfg = f.config();
        cfg.max_attempts = 2;
        cfg.workers = workers;
        std::atomic<int> bad_calls{0};
        auto handle = [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
            f.insert(tx, e, ctx);
            const auto found = culprit.find(e.id);
            if (found == culprit.end())
                return;
            ++bad_calls;
            const Statement& st = *found->second;
            try {
                if (!st.sql)
                    tx.commit();
                else
                    tx.exec(fmt::format(fmt::runtime(st.sql), unique_name("ik_prepared")));
            } catch (const pqxx::failure&) {
                // a handler that treats the error as harmless and returns normally
            }
        };

        std::unique_ptr<Consumer> c;
        if (shape == "batch")
            c = std::make_unique<Consumer>(cfg, decode, event_id_of, [&](pqxx::work& tx, const Batch<TestEvent>& b) {
                for (const auto& entry : b)
                    handle(tx, entry.event, entry.context);
            });
        else
            c = std::make_unique<Consumer>(cfg, decode, event_id_of, handle);
        // Done when every offset is committed: a dead letter's only after the broker took it.
        run_until(
            *c, [&] { return f.committed_total(partitions) == events; }, 90s);
        const auto m = c->metrics().snapshot();

        // Every other record once, with its claim; the culprits neither.
        f.check_exact(static_cast<std::size_t>(events - culprits));
        for (const auto& [id, st] : culprit) {
            CAPTURE(st->name);
            CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", f.effects, id.to_string())) == 0);
            CHECK(scalar(fmt::format(
                      "SELECT count(*) FROM processed_event WHERE consumer_group = '{}' AND event_id = '{}'", f.group,
                      id.to_string())) == 0);
        }
        CHECK(scalar("SELECT count(*) FROM pg_prepared_xacts") == 0);
        CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == static_cast<std::uint64_t>(culprits));
        CHECK(m.dead_lettered_total() == static_cast<std::uint64_t>(culprits));
        if (shape == "records")
            CHECK(bad_calls == culprits * cfg.max_attempts);
        const auto dlq = read_topic(f.group + ".dlq", static_cast<std::size_t>(culprits), 30s);
        CHECK(dlq.size() == static_cast<std::size_t>(culprits));
        std::set<std::string> dead;
        for (const auto& r : dlq) {
            const auto id = r.header("idemkafka.event_id");
            const auto found = culprit.find(EventId::parse(id));
            REQUIRE(found != culprit.end());
            CAPTURE(found->second->name, r.header("idemkafka.error"));
            CHECK(r.header("idemkafka.reason") == "handler_failed");
            // "transaction ended inside the handler: ...", with libpqxx 6 also "transaction aborted or ended inside
            // the handler" (it rolls back a caught failed COMMIT itself, as it does any failed statement).
            CHECK(r.header("idemkafka.error").find("ended inside the handler") != std::string::npos);
            dead.insert(id);
        }
        CHECK(dead.size() == culprit.size());
    };
    std::vector<const Statement*> all;
    for (const auto& st : statements)
        all.push_back(&st);
    if (shape == "batch") {
        for (const auto* st : all) {
            CAPTURE(st->name);
            run({st}, 60, 30); // 2 culprits
        }
    } else {
        run(all, 300, 30); // 10 culprits, one per statement, several in a batch
    }
}

// A handler's session-level SET (not SET LOCAL) or RESET ALL commits with its transaction and
// would stay with the session: lock_timeout 0 (a claim waiting on a frozen member for ever),
// or read-write as the default of later transactions (a later handler's ROLLBACK followed by
// writes would commit them alone). Each library transaction puts the settings back first.
TEST_CASE("a handler's session-level SET or RESET ALL does not change the library's settings for later "
          "transactions",
          "[fault][handler-transaction]")
{
    Fixture f(1);
    f.publish(30);
    auto cfg = f.config();
    cfg.max_batch = 1; // a transaction per record: what one commits, the next one starts with
    cfg.max_attempts = 2;
    cfg.lock_timeout = 4321ms;
    std::mutex mu;
    std::map<std::int64_t, std::vector<std::string>> lock_timeouts; // by amount, one per call
    std::vector<std::string> read_only_defaults;                    // record 20's calls, after their ROLLBACK
    auto show = [](pqxx::work& tx, const char* name) {
        return std::string(tx.exec(std::string("SHOW ") + name)[0][0].c_str());
    };
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        std::lock_guard<std::mutex> lock(mu);
        lock_timeouts[e.amount].push_back(show(tx, "lock_timeout"));
        if (e.amount == 5)
            tx.exec("SET lock_timeout = 0; SET default_transaction_read_only = off");
        if (e.amount == 10)
            tx.exec("RESET ALL");
        if (e.amount == 20) {
            // Ends the library's transaction (the record is a culprit, dead-lettered after its
            // attempts) to look at the session's own default from outside any transaction.
            tx.exec("ROLLBACK");
            read_only_defaults.push_back(show(tx, "default_transaction_read_only"));
        }
    });
    run_until(
        c, [&] { return f.committed_total(1) == 30; }, 90s);
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_lettered_for(DeadLetterReason::handler_failed) == 1);
    CHECK(m.dead_lettered_total() == 1);
    f.check_exact(29);
    std::lock_guard<std::mutex> lock(mu);
    CHECK(lock_timeouts.size() == 30);
    for (const auto& [amount, seen] : lock_timeouts) {
        CAPTURE(amount);
        for (const auto& value : seen)
            CHECK(value == "4321ms");
    }
    REQUIRE(read_only_defaults.size() == 2);
    for (const auto& value : read_only_defaults)
        CHECK(value == "on");
}

TEST_CASE("a handler that drops the session's prepared statements or temporary tables loses nothing and "
          "doubles nothing",
          "[fault][handler-transaction]")
{
    // DEALLOCATE ALL is not transactional: the library's claim and commit-guard statements are
    // gone from the session for good, and the next statement that needs one fails (the check
    // before COMMIT, or the next claim where libpqxx 6 prepares that check only on its first
    // use); that transaction is rolled back and runs again on a new session. DISCARD TEMP
    // would drop the commit guard's table, which PostgreSQL refuses while the claim's update of
    // it waits for COMMIT: that call fails and is retried. Each culprit does it on its first
    // call only.
    Fixture f(1);
    f.publish(30);
    auto cfg = f.config();
    cfg.max_batch = 10; // the two culprits in transactions of their own
    cfg.max_attempts = 3;
    std::mutex mu;
    std::set<std::int64_t> done; // culprits that did it once
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        const char* sql = e.amount == 7 ? "DEALLOCATE ALL" : e.amount == 17 ? "DISCARD TEMP" : nullptr;
        std::unique_lock<std::mutex> lock(mu);
        if (sql && done.insert(e.amount).second) {
            lock.unlock();
            tx.exec(sql);
        }
    });
    run_until(
        c, [&] { return f.committed_total(1) == 30; }, 90s);
    const auto m = c.metrics().snapshot();
    CHECK(m.dead_lettered_total() == 0);
    CHECK(m.db_reconnects >= 1);    // after DEALLOCATE ALL
    CHECK(m.handler_failures >= 1); // DISCARD TEMP refused
    f.check_exact(30);
}
