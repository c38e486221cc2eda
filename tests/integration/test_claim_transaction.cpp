// ClaimTransaction against a real PostgreSQL, without Kafka: a scripted
// handler per record (commit, throw, swallow an SQL error, end the
// transaction itself, a stale epoch at the position write), and for each the
// outcome of the attempt and what the claims table and the effects table hold
// afterwards, read back from the server.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/error.hpp>
#include <idemkafka/offset_store.hpp>
#include <idemkafka/store.hpp>

#include "catch_compat.hpp"
#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;
using namespace idemkafka::test;
using std::chrono::milliseconds;

namespace idemkafka::detail {

// The friend ClaimTransaction names: one attempt (one transaction) and its outcome.
struct ClaimTransactionProbe {
    static ClaimTransaction::Outcome attempt(ClaimTransaction& claims, Worker& w, std::vector<Item>& items,
                                             ClaimTransaction::Failure& failure)
    {
        ClaimTransaction::Batch b{items, Clock::now() + std::chrono::hours(1)};
        return claims.attempt(w, b, failure);
    }
};

} // namespace idemkafka::detail

namespace {

using Outcome = ClaimTransaction::Outcome;

// The handler: what each record (by its Stage slot) does after writing its effect.
using Script = std::function<void(pqxx::work& tx)>;

class ScriptedStage final : public Stage {
public:
    explicit ScriptedStage(std::string effects) : effects_(std::move(effects)) {}
    std::map<std::size_t, Script> script; // slot -> what follows the effect; none: return
    std::vector<std::size_t> calls;       // slots, in call order

    void reserve(std::size_t) override {}
    EventId decode(std::size_t, const Record&) override { throw std::logic_error("not decoded here"); }
    bool batched() const noexcept override { return false; }
    void handle_batch(pqxx::work&, const std::size_t*, const Context*, std::size_t) override
    {
        throw std::logic_error("not a batch handler");
    }
    void handle(std::size_t slot, pqxx::work& tx, const Context& ctx) override
    {
        calls.push_back(slot);
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, kafka_offset) VALUES ($1::uuid, $2)", effects_),
                                ctx.event_id().to_string(), ctx.offset());
        const auto then = script.find(slot);
        if (then != script.end())
            then->second(tx);
    }

private:
    std::string effects_;
};

ConsumerConfig config_of(bool offsets_in_database)
{
    ConsumerConfig cfg;
    cfg.brokers = "claim-transaction.invalid:9092"; // never contacted: no Kafka here
    cfg.topics = {"orders"};
    cfg.group_id = unique_name("claims");
    cfg.postgres = idemkafka::test::pg();
    cfg.offsets_in_database = offsets_in_database;
    cfg.max_attempts = 3;
    cfg.retry_backoff = milliseconds(10);
    cfg.log = log_sink();
    cfg.validate();
    return cfg;
}

// One ClaimTransaction on one worker connection, with what it needs of a consumer.
struct Fixture {
    std::string effects = unique_name("effect");
    ConsumerConfig cfg;
    ScriptedStage stage{effects};
    Metrics metrics;
    ProcessedEventStore store{cfg.schema, cfg.table};
    std::optional<OffsetStore> offsets;
    PartitionLedger ledger{Backoff{cfg.retry_backoff, cfg.retry_backoff_max},
                           Backoff{milliseconds(10), milliseconds(100)}};
    std::vector<OutgoingRecord> dead_letters;
    DeadLetterer dead_letterer{cfg,
                               ledger,
                               metrics,
                               cfg.log,
                               secrets_of(cfg.postgres),
                               [this](const std::vector<OutgoingRecord>& records, milliseconds) {
                                   dead_letters.insert(dead_letters.end(), records.begin(), records.end());
                                   return std::vector<std::string>(records.size()); // all acknowledged
                               }};
    Circuit circuit{[this] {
        auto off = cfg.circuit_breaker;
        off.enabled = false;
        return off;
    }()};
    ClaimTransaction claims{ClaimTransaction::Setup{cfg, stage, metrics, store, offsets, ledger, dead_letterer, circuit,
                                                    cfg.log, [] { return false; }, false}};
    Worker worker;
    PartitionState& part = ledger.assign({"orders", 0});
    std::deque<std::string> payloads; // the records' views point into them: never moved
    std::vector<Item> items;

    explicit Fixture(bool offsets_in_database = false) : cfg(config_of(offsets_in_database))
    {
        if (offsets_in_database)
            offsets.emplace(cfg.schema, cfg.offsets_table);
        exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, kafka_offset bigint NOT NULL)", effects));
        worker.connect(cfg.postgres);
        claims.settle_schema(*worker.db);
        claims.prepare(worker);
    }

    // n more records of orders/0, each its own event id and slot; those
    // before them are done.
    void records(std::size_t n)
    {
        for (auto& it : items)
            it.state = ItemState::done;
        for (std::size_t i = items.size(), end = i + n; i < end; ++i) {
            payloads.push_back(fmt::format("payload-{}", i));
            Item it;
            it.record.topic = "orders";
            it.record.partition = 0;
            it.record.offset = static_cast<std::int64_t>(i);
            it.record.value = std::string_view(payloads.back());
            it.id = new_event_id();
            it.part = &part;
            it.slot = i;
            items.push_back(std::move(it));
        }
        reset();
    }

    // The worker's share: every record, nothing held.
    void reset()
    {
        worker.reset(Holds{});
        for (std::size_t i = 0; i < items.size(); ++i)
            worker.items.push_back(i);
    }

    Outcome attempt(ClaimTransaction::Failure& failure)
    {
        return ClaimTransactionProbe::attempt(claims, worker, items, failure);
    }

    // Event ids claimed by this group, and effects written, read back from the server.
    std::int64_t claimed(std::size_t i) const
    {
        return scalar(fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}' AND event_id = '{}'",
                                  store.qualified_name(), cfg.group_id, items[i].id.to_string()));
    }
    std::int64_t claims_total() const
    {
        return scalar(
            fmt::format("SELECT count(*) FROM {} WHERE consumer_group = '{}'", store.qualified_name(), cfg.group_id));
    }
    std::int64_t effects_of(std::size_t i) const
    {
        return scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", effects, items[i].id.to_string()));
    }
    std::int64_t effects_total() const { return scalar("SELECT count(*) FROM " + effects); }
};

} // namespace

TEST_CASE("claim transaction: handlers that return commit their effects with their claims, once", "[claim_transaction]")
{
    Fixture f;
    f.records(3);
    ClaimTransaction::Failure failure;
    REQUIRE(f.attempt(failure) == Outcome::committed);
    CHECK(f.worker.info.records == 3);
    CHECK(f.worker.info.claimed == 3);
    CHECK(f.worker.info.duplicates == 0);
    CHECK_FALSE(f.worker.failed);
    CHECK(f.stage.calls == std::vector<std::size_t>{0, 1, 2});
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(f.claimed(i) == 1);
        CHECK(f.effects_of(i) == 1);
    }

    // The same records again (a redelivery): all duplicates, no handler call.
    f.reset();
    REQUIRE(f.attempt(failure) == Outcome::committed);
    CHECK(f.worker.info.claimed == 0);
    CHECK(f.worker.info.duplicates == 3);
    CHECK(f.stage.calls.size() == 3);
    CHECK(f.claims_total() == 3);
    CHECK(f.effects_total() == 3);
}

TEST_CASE("claim transaction: a handler that throws fails its record; nothing of the attempt commits",
          "[claim_transaction]")
{
    Fixture f;
    f.records(3);
    f.stage.script[1] = [](pqxx::work&) { throw std::runtime_error("card declined"); };
    ClaimTransaction::Failure failure;
    REQUIRE(f.attempt(failure) == Outcome::handler_failed);
    CHECK(failure.index == 1);
    CHECK(failure.what == "card declined");
    CHECK(failure.retryable);
    CHECK_FALSE(failure.batch_call);
    CHECK(f.stage.calls == std::vector<std::size_t>{0, 1}); // record 2 never ran
    CHECK(f.claims_total() == 0);                           // record 0's claim and effect rolled back too
    CHECK(f.effects_total() == 0);

    // run(): the failing record is held (a retry later), the record before it commits.
    f.reset();
    f.stage.calls.clear();
    f.claims.run(f.worker, f.items, Clock::now() + std::chrono::hours(1));
    CHECK_FALSE(f.worker.failed);
    CHECK(f.worker.holds.covers(&f.part, 1));
    CHECK(f.ledger.attempt_of(f.part, 1) == 2);
    CHECK(f.claimed(0) == 1);
    CHECK(f.effects_of(0) == 1);
    CHECK(f.claimed(1) == 0);
    CHECK(f.effects_of(1) == 0);
    CHECK(f.claimed(2) == 0); // behind the held record of its partition
    CHECK(f.effects_of(2) == 0);
    CHECK(f.metrics.snapshot().handler_failures == 1);
    CHECK(f.dead_letters.empty());
}

TEST_CASE("claim transaction: a NonRetryableError sends its record to the dead letter, the rest commits",
          "[claim_transaction]")
{
    Fixture f;
    f.records(3);
    f.stage.script[1] = [](pqxx::work&) { throw NonRetryableError("unknown currency"); };
    ClaimTransaction::Failure failure;
    REQUIRE(f.attempt(failure) == Outcome::handler_failed);
    CHECK(failure.index == 1);
    CHECK_FALSE(failure.retryable);

    f.reset();
    f.claims.run(f.worker, f.items, Clock::now() + std::chrono::hours(1));
    CHECK_FALSE(f.worker.failed);
    REQUIRE(f.dead_letters.size() == 1);
    CHECK(f.items[1].state == ItemState::done);
    CHECK(f.items[1].reason == DeadLetterReason::non_retryable);
    CHECK(f.claimed(0) == 1);
    CHECK(f.claimed(1) == 0);
    CHECK(f.claimed(2) == 1);
    CHECK(f.effects_of(0) == 1);
    CHECK(f.effects_of(1) == 0);
    CHECK(f.effects_of(2) == 1);
}

TEST_CASE("claim transaction: a handler that swallows an SQL error fails its record", "[claim_transaction]")
{
    Fixture f;
    f.records(2);
    f.stage.script[0] = [](pqxx::work& tx) {
        try {
            tx.exec("SELECT 1 / 0");
        } catch (const pqxx::sql_error&) {
            // swallowed: the transaction is aborted all the same
        }
    };
    ClaimTransaction::Failure failure;
    REQUIRE(f.attempt(failure) == Outcome::handler_failed);
    CHECK(failure.index == 0);
    CHECK(failure.what.find("returned normally") != std::string::npos);
    CHECK(f.stage.calls == std::vector<std::size_t>{0}); // record 1 never ran on the aborted transaction
    CHECK(f.metrics.snapshot().handler_aborted_transactions == 1);
    CHECK(f.claims_total() == 0);
    CHECK(f.effects_total() == 0);
}

TEST_CASE("claim transaction: a handler that ends the transaction fails its record; nothing commits",
          "[claim_transaction]")
{
    // What the handler does after its effect, and whether it then returns normally (the
    // library finds the transaction ended) or throws (the refused COMMIT's error).
    struct Ending {
        const char* name;
        Script run;
        bool returns;
    };
    const std::vector<Ending> endings{
        {"tx.commit()", [](pqxx::work& tx) { tx.commit(); }, false},
        {"COMMIT", [](pqxx::work& tx) { tx.exec("COMMIT"); }, false},
        {"COMMIT, its error caught",
         [](pqxx::work& tx) {
             try {
                 tx.exec("COMMIT");
             } catch (const pqxx::sql_error&) {
             }
         },
         true},
        {"ROLLBACK; BEGIN", [](pqxx::work& tx) { tx.exec("ROLLBACK; BEGIN"); }, true},
    };
    for (const auto& ending : endings) {
        SECTION(ending.name)
        {
            Fixture f;
            f.records(3);
            f.stage.script[1] = ending.run;
            ClaimTransaction::Failure failure;
            const auto outcome = f.attempt(failure);
            INFO(ending.name << ": " << failure.what);
            const bool replaced = std::string(ending.name) == "ROLLBACK; BEGIN";
            if (!replaced || f.worker.db->server_version() >= 140000) {
                CHECK(outcome == Outcome::handler_failed);
                CHECK(failure.index == 1);
                // Thrown: the refused COMMIT's error; returned: what the library found after the call.
                CHECK(failure.what.find(ending.returns ? "returned normally" : pg::transaction_ended) !=
                      std::string::npos);
            } else {
                // Before PostgreSQL 14 a new transaction is seen only at COMMIT: nobody is named.
                CHECK(outcome == Outcome::db_failed);
            }
            CHECK(f.metrics.snapshot().handler_aborted_transactions == (ending.returns ? 1u : 0u));
            // The claims taken before the handler, and records 0 and 1's effects: none committed.
            CHECK(f.claims_total() == 0);
            CHECK(f.effects_total() == 0);
            CHECK(f.stage.calls == std::vector<std::size_t>{0, 1});

            // The worker's next transaction, on the same connection, commits.
            f.stage.script.clear();
            f.stage.calls.clear();
            f.reset();
            REQUIRE(f.attempt(failure) == Outcome::committed);
            CHECK(f.stage.calls == std::vector<std::size_t>{0, 1, 2});
            CHECK(f.claims_total() == 3);
            CHECK(f.effects_total() == 3);
        }
    }
}

namespace {

// What `conn` sent while `run` ran, from libpq's trace: each simple query,
// and each Sync that ends an extended-protocol exchange, a line; each waits
// for the server's answer (a round trip).
std::vector<std::string> sent(pqxx::connection& conn, const std::function<void()>& run)
{
    std::FILE* trace = std::tmpfile();
    REQUIRE(trace != nullptr);
    conn.trace(trace);
    run();
    conn.trace(nullptr);
    std::fflush(trace);
    std::rewind(trace);
    std::vector<std::string> out;
    std::string text;
    char chunk[4096];
    while (std::fgets(chunk, sizeof chunk, trace)) {
        text += chunk;
        if (text.back() != '\n' && !std::feof(trace))
            continue; // a line longer than the chunk: read on
        if (text.find("\tF\t") != std::string::npos &&
            (text.find("\tQuery\t") != std::string::npos || text.find("\tSync") != std::string::npos))
            out.push_back(text);
        text.clear();
    }
    std::fclose(trace);
    return out;
}

std::size_t round_trips(pqxx::connection& conn, const std::function<void()>& run)
{
    return sent(conn, run).size();
}

// Which claim statements `lines` (sent()'s) ran, in order: "new" for the
// claim of ids expected new, "on conflict" for the one with ON CONFLICT.
std::vector<std::string> claims_made(const std::vector<std::string>& lines)
{
    const std::string as_new = std::string("EXECUTE ") + new_claim_statement + "(";
    const std::string on_conflict = std::string("EXECUTE ") + claim_statement + "(";
    std::vector<std::string> out;
    for (const auto& line : lines) {
        if (line.find(as_new) != std::string::npos)
            out.emplace_back("new");
        else if (line.find(on_conflict) != std::string::npos)
            out.emplace_back("on conflict");
    }
    return out;
}

// Claims `id` for `group` in a transaction of its own, committed.
void claim_elsewhere(const Fixture& f, const EventId& id)
{
    pqxx::connection c(idemkafka::test::pg());
    pqxx::work tx(c);
    REQUIRE(f.store.claim(tx, f.cfg.group_id, {id}).size() == 1);
    tx.commit();
}

} // namespace

TEST_CASE("claim transaction: a transaction of one record is three round trips", "[claim_transaction]")
{
    // BEGIN goes with the claim, COMMIT with the guard's arm: the claim, the
    // handler's statement, the end. Only the connection's first transaction
    // (or the first after a failure) pays libpqxx's BEGIN of its own.
    Fixture f;
    f.records(1);
    ClaimTransaction::Failure failure;
    REQUIRE(f.attempt(failure) == Outcome::committed);
    for (int i = 0; i < 3; ++i) {
        f.records(1); // one more record; those before it are done
        Outcome outcome{};
        const auto trips = round_trips(*f.worker.db, [&] { outcome = f.attempt(failure); });
        REQUIRE(outcome == Outcome::committed);
        CHECK(f.worker.info.claimed == 1);
        CHECK(trips == 3);
    }
    CHECK(f.stage.calls.size() == 4); // one call per record
    CHECK(f.claims_total() == 4);
    CHECK(f.effects_total() == 4);
    // The server's transactions ended: nothing idles in a transaction between them.
    CHECK(pg::state_of(f.worker.kept.on(*f.worker.db)) == pg::TxState::ended);
}

TEST_CASE("claim transaction: ids are claimed as new; one claimed already rolls the claim back, made with ON CONFLICT",
          "[claim_transaction]")
{
    Fixture f;
    REQUIRE(f.cfg.optimistic_claims); // the default
    f.records(4);
    claim_elsewhere(f, f.items[2].id);
    ClaimTransaction::Failure failure;
    Outcome outcome{};
    auto lines = sent(*f.worker.db, [&] { outcome = f.attempt(failure); });
    REQUIRE(outcome == Outcome::committed);
    // As new first (it failed on record 2's id), then with ON CONFLICT, in one attempt.
    CHECK(claims_made(lines) == std::vector<std::string>{"new", "on conflict"});
    CHECK(f.metrics.snapshot().optimistic_claim_fallbacks == 1);
    CHECK(f.worker.info.claimed == 3);
    CHECK(f.worker.info.duplicates == 1);
    CHECK(f.stage.calls == std::vector<std::size_t>{0, 1, 3}); // no handler ran in the rolled-back one
    CHECK(f.claims_total() == 4);
    CHECK(f.effects_total() == 3);
    CHECK(f.effects_of(2) == 0);

    // The next claims keep to ON CONFLICT: claims_before_optimism of them
    // after the last that met a claimed id (this one meets one: counted from it).
    f.records(1);
    claim_elsewhere(f, f.items.back().id);
    lines = sent(*f.worker.db, [&] { outcome = f.attempt(failure); });
    REQUIRE(outcome == Outcome::committed);
    CHECK(claims_made(lines) == std::vector<std::string>{"on conflict"});
    CHECK(f.worker.info.duplicates == 1);
    for (std::size_t i = 0; i < claims_before_optimism; ++i) {
        f.records(1);
        lines = sent(*f.worker.db, [&] { outcome = f.attempt(failure); });
        REQUIRE(outcome == Outcome::committed);
        CHECK(claims_made(lines) == std::vector<std::string>{"on conflict"});
        CHECK(f.worker.info.claimed == 1);
    }
    // Then as new again: no round trip more than with ON CONFLICT.
    f.records(2);
    lines = sent(*f.worker.db, [&] { outcome = f.attempt(failure); });
    REQUIRE(outcome == Outcome::committed);
    CHECK(claims_made(lines) == std::vector<std::string>{"new"});
    CHECK(lines.size() == 4); // the claim, two handler statements, the end
    CHECK(f.worker.info.claimed == 2);
    CHECK(f.metrics.snapshot().optimistic_claim_fallbacks == 1);
    const auto records = static_cast<std::int64_t>(f.items.size());
    CHECK(f.claims_total() == records);
    CHECK(f.effects_total() == records - 2); // the two claimed elsewhere
    CHECK(f.stage.calls.size() == f.items.size() - 2);
}

TEST_CASE("claim transaction: a claim as new waits for another session's claim of an id, then counts it once",
          "[claim_transaction]")
{
    // The other session's INSERT of the id is not committed yet: the claim
    // as new waits for its end, as ON CONFLICT does. Committed, the id is a
    // duplicate; rolled back, it is this transaction's.
    for (const bool commits : {true, false}) {
        DYNAMIC_SECTION((commits ? "the other commits" : "the other rolls back"))
        {
            Fixture f;
            f.records(3);
            pqxx::connection other(idemkafka::test::pg());
            pqxx::work otx(other);
            REQUIRE(f.store.claim(otx, f.cfg.group_id, {f.items[1].id}).size() == 1);
            const int pid = f.worker.db->backendpid();
            ClaimTransaction::Failure failure;
            std::optional<Outcome> outcome;
            std::thread attempt([&] { outcome = f.attempt(failure); });
            const bool waited = wait_until(
                [&] {
                    return scalar(fmt::format("SELECT count(*) FROM pg_stat_activity WHERE pid = {} AND "
                                              "wait_event_type = 'Lock'",
                                              pid)) == 1;
                },
                std::chrono::seconds(20));
            if (commits)
                otx.commit();
            else
                otx.abort();
            attempt.join();
            REQUIRE(waited);
            REQUIRE(outcome == Outcome::committed);
            CHECK(f.metrics.snapshot().optimistic_claim_fallbacks == (commits ? 1u : 0u));
            CHECK(f.worker.info.claimed == (commits ? 2u : 3u));
            CHECK(f.worker.info.duplicates == (commits ? 1u : 0u));
            CHECK(f.claims_total() == 3);
            CHECK(f.effects_of(1) == (commits ? 0 : 1));
            CHECK(f.effects_total() == (commits ? 2 : 3));
        }
    }
}

TEST_CASE("claim transaction: optimistic_claims off, every claim is made with ON CONFLICT", "[claim_transaction]")
{
    Fixture f;
    f.cfg.optimistic_claims = false; // the claims' setup reads it from here
    f.worker.disconnect();
    f.worker.connect(f.cfg.postgres);
    f.claims.prepare(f.worker);
    f.records(3);
    claim_elsewhere(f, f.items[0].id);
    ClaimTransaction::Failure failure;
    Outcome outcome{};
    for (int round = 0; round < 2; ++round) {
        const auto lines = sent(*f.worker.db, [&] { outcome = f.attempt(failure); });
        REQUIRE(outcome == Outcome::committed);
        CHECK(claims_made(lines) == std::vector<std::string>{"on conflict"});
        f.records(1);
    }
    CHECK(f.metrics.snapshot().optimistic_claim_fallbacks == 0);
    CHECK(f.claims_total() == 4);
    CHECK(f.effects_total() == 3);
}

TEST_CASE("claim transaction: positions commit with the claims; a stale epoch is fenced, nothing commits",
          "[claim_transaction]")
{
    Fixture f(true);
    f.records(3);
    const auto acquire = [&] {
        pqxx::connection member(f.cfg.postgres); // a member's own connection
        pqxx::work tx(member);
        const auto stored = f.offsets->acquire(tx, f.cfg.group_id, {{"orders", 0}});
        tx.commit();
        REQUIRE(stored.size() == 1);
        return stored.front().epoch;
    };
    const auto position = [&] {
        return scalar(fmt::format("SELECT coalesce(max(next_offset), -1) FROM {} WHERE consumer_group = '{}'",
                                  f.offsets->qualified_name(), f.cfg.group_id));
    };
    f.part.stored.epoch = acquire();

    SECTION("our epoch: the position is stored with the claims")
    {
        ClaimTransaction::Failure failure;
        REQUIRE(f.attempt(failure) == Outcome::committed);
        CHECK(f.claims_total() == 3);
        CHECK(f.effects_total() == 3);
        CHECK(position() == 3);
        REQUIRE(f.worker.stored.size() == 1);
        CHECK(f.worker.stored.front() == std::make_pair(&f.part, std::int64_t{3}));
        CHECK(f.claims.take_fenced().empty());
    }
    SECTION("another member took the partition over: fenced")
    {
        acquire(); // another member's epoch, newer than ours
        ClaimTransaction::Failure failure;
        REQUIRE(f.attempt(failure) == Outcome::abandoned);
        CHECK(f.worker.fenced);
        CHECK(f.stage.calls == std::vector<std::size_t>{0, 1, 2}); // the handlers ran; their effects roll back
        CHECK(f.claims_total() == 0);
        CHECK(f.effects_total() == 0);
        CHECK(position() == -1);
        CHECK(f.metrics.snapshot().fenced_writes == 1);
        const auto fenced = f.claims.take_fenced();
        REQUIRE(fenced.size() == 1);
        CHECK(fenced.front().topic == "orders");
        CHECK(fenced.front().partition == 0);

        // run(): fenced is no forced stop; the worker's outcome says so.
        f.reset();
        f.worker.fenced = false;
        f.claims.run(f.worker, f.items, Clock::now() + std::chrono::hours(1));
        CHECK(f.worker.failed);
        CHECK(f.worker.fenced);
        CHECK_FALSE(f.worker.abandoned);
        CHECK(f.claims_total() == 0);
    }
}
