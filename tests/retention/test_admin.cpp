// idemkafka-admin as a user runs it: each subcommand against a real PostgreSQL
// (and the broker for dead letters), bad arguments, a wrong connection string,
// concurrent migrations, odd names. Exit status 0 ok, 1 failure, 2 bad usage.

#include <algorithm>
#include <csignal>
#include <tuple>
#include <utility>

#include <sys/types.h>

#include <nlohmann/json.hpp>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/publisher.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "pg/exec.hpp"
#include "retention_support.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

std::vector<std::string> with_db(std::vector<std::string> args, const std::string& table)
{
    args.push_back("--postgres");
    args.push_back(pg());
    args.push_back("--table");
    args.push_back(table);
    return args;
}

/// One idemkafka-admin run in the background, its pid known, killed (SIGKILL)
/// however the test ends: a run the test stopped would outlive it.
struct BackgroundAdmin {
    pid_t pid;
    explicit BackgroundAdmin(const std::vector<std::string>& args)
    {
        const std::string pid_file = "/tmp/" + unique_name("ikadmin") + ".pid";
        const std::string cmd = "(" + admin_command_line(args) + " >/dev/null 2>&1 & echo $! >" + pid_file + ")";
        if (std::system(cmd.c_str()) != 0)
            throw std::runtime_error("could not start: " + cmd);
        pid = static_cast<pid_t>(std::stol(slurp(pid_file)));
    }
    BackgroundAdmin(const BackgroundAdmin&) = delete;
    BackgroundAdmin& operator=(const BackgroundAdmin&) = delete;
    ~BackgroundAdmin() { ::kill(pid, SIGKILL); }
};

/// The pid of a server session of this database matching `condition`, or 0.
int backend_where(pqxx::connection& conn, const std::string& condition)
{
    pqxx::nontransaction tx(conn);
    const auto r = tx.exec("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND " + condition);
    return r.empty() ? 0 : r[0][0].as<int>();
}

/// What an idemkafka-admin run stopped inside its transaction left behind.
struct FrozenRun {
    bool waited = false;  ///< its `statement` was seen waiting for the lock `held` holds
    bool idle = false;    ///< stopped, and that lock released: idle in its transaction
    bool claimed = false; ///< a claim of `id` committed past it, within its 30 s lock_timeout
    bool ended = false;   ///< its session was gone soon after
    std::string error;    ///< why the claim failed
};

/// A plain claims table (purge mode) that a reader holds in an open
/// transaction, as a report reading it would: a conversion of it waits.
struct HeldPlainTable {
    std::string table;
    DropTable drop{"public." + table};
    ProcessedEventStore store{"public", table};
    std::unique_ptr<pqxx::connection> conn = connect();
    std::unique_ptr<pqxx::connection> reader = connect();
    pqxx::work held{*reader};

    explicit HeldPlainTable(const std::string& prefix) : table(unique_name(prefix))
    {
        REQUIRE(admin(with_db({"migrate", "--mode", "purge"}, table)).rc == 0);
        held.exec("SELECT count(*) FROM " + store.qualified_name());
    }
};

/// Claims `id` on `conn`, waiting up to 30 s for a lock: whether it
/// committed, and why not.
std::pair<bool, std::string> claim_behind(pqxx::connection& conn, const ProcessedEventStore& store, const EventId& id)
{
    try {
        pqxx::work tx(conn);
        tx.exec("SET LOCAL lock_timeout = '30s'");
        const bool claimed = store.claim(tx, "g", {id}).size() == 1;
        tx.commit();
        return {claimed, ""};
    } catch (const std::exception& e) {
        return {false, e.what()};
    }
}

/// Runs idemkafka-admin with `args` until its statement beginning with
/// `statement` waits for the lock `held` holds, stops it there (SIGSTOP),
/// releases that lock (it gets it and sits idle, frozen, in its transaction),
/// then claims `id` on `conn`.
FrozenRun freeze_inside(pqxx::connection& conn, pqxx::work& held, const std::vector<std::string>& args,
                        const std::string& statement, const ProcessedEventStore& store, const EventId& id)
{
    const BackgroundAdmin run(args);
    FrozenRun f;
    int pid = 0;
    f.waited = wait_until(
        [&] {
            return (pid = backend_where(conn, "wait_event_type = 'Lock' AND query LIKE '" + statement + "%'")) != 0;
        },
        20s);
    ::kill(run.pid, SIGSTOP);
    held.commit();
    f.idle =
        f.waited &&
        wait_until(
            [&] { return backend_where(conn, fmt::format("pid = {} AND state = 'idle in transaction'", pid)) != 0; },
            10s);
    std::tie(f.claimed, f.error) = claim_behind(conn, store, id);
    f.ended = wait_until([&] { return backend_where(conn, fmt::format("pid = {}", pid)) == 0; }, 5s);
    return f;
}

} // namespace

TEST_CASE("admin: --help on every subcommand", "[retention][admin]")
{
    for (const std::string cmd : {"migrate", "maintain", "status", "dead-letters"}) {
        CAPTURE(cmd);
        for (const auto& args : {std::vector<std::string>{cmd, "--help"}, std::vector<std::string>{"help", cmd}}) {
            const auto r = admin(args);
            CAPTURE(r.out, r.err);
            CHECK(r.rc == 0);
            CHECK(has(r.out, "usage: idemkafka-admin " + cmd));
        }
    }
    {
        const auto r = admin({"--help"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "commands:"));
    }
    {
        const auto r = admin({});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 2);
        CHECK(has(r.err, "usage: idemkafka-admin"));
    }
}

TEST_CASE("admin: bad arguments give a clear message and exit status 2", "[retention][admin]")
{
    struct Case {
        std::vector<std::string> args;
        std::string message;
    };
    const std::string db = pg();
    const std::vector<Case> cases = {
        {{"frobnicate"}, "unknown command 'frobnicate'"},
        {{"maintain", "--bogus"}, "unknown option '--bogus'"},
        {{"maintain", "--postgres", db, "stray"}, "unexpected argument 'stray'"},
        {{"migrate", "--postgres", db, "--retention", "7x"}, "--retention: '7x' is not a duration"},
        {{"migrate", "--postgres", db, "--mode", "sideways"}, "'sideways' is not a retention mode"},
        {{"status", "--postgres"}, "option --postgres needs a value"},
        {{"status"}, "no database: pass --postgres CONNINFO or set IDEMKAFKA_POSTGRES"},
        {{"maintain", "--postgres", db, "--partition-width", "90s"}, "partition_width: must be a whole number"},
        {{"maintain", "--postgres", db, "--partitions-ahead", "-1"}, "'-1' is not a non-negative whole number"},
        {{"maintain", "--postgres", db, "--purge-batch", "many"}, "--purge-batch: 'many' is not"},
        {{"migrate", "--postgres", db, "--table", ""}, "table: identifier must not be empty"},
        {{"migrate", "--postgres", db, "--table", std::string(64, 't')}, "at most 63"},
        {{"maintain", "--postgres", db, "--now", "yesterday"}, "--now: 'yesterday' is not a time"},
        {{"dead-letters"}, "say `list`, `groups` or `replay`"},
        {{"dead-letters", "shred", "--brokers", "x", "--topic", "t"}, "unknown action 'shred'"},
        {{"dead-letters", "list", "--brokers", "x"}, "--topic NAME (the dead-letter topic) is required"},
        {{"dead-letters", "list", "--topic", "t"}, "no Kafka"},
        {{"dead-letters", "list", "--brokers", "x", "--topic", "t", "--reason", "nope"}, "'nope' is not a dead-letter"},
        {{"dead-letters", "list", "--brokers", "x", "--topic", "t", "--event-id", "123"}, "'123' is not a UUID"},
        {{"dead-letters", "list", "--brokers", "x", "--topic", "t", "--dry-run"}, "belong to replay"},
        {{"dead-letters", "replay", "--brokers", "x", "--topic", "t"}, "no database for the replay audit"},
        {{"dead-letters", "replay", "--brokers", "x", "--topic", "t", "--at", "3"}, "'3' is not PARTITION@OFFSET"},
        {{"dead-letters", "list", "--brokers", "x", "--topic", "t", "--kafka", "novalue"}, "KEY=VALUE"},
    };
    for (const auto& c : cases) {
        const auto r = admin(c.args);
        CAPTURE(c.args, r.out, r.err);
        CHECK(r.rc == 2);
        CHECK(has(r.err, c.message));
        CHECK(has(r.err, "--help"));
    }
}

TEST_CASE("admin: a wrong connection string fails clearly and never prints the password", "[retention][admin]")
{
    const std::string secret = "S3cretPw-xyz";
    const std::vector<std::string> conninfos = {
        "host=/nonexistent-dir port=1 dbname=x user=bob password=" + secret,
        "host=127.0.0.1 port=1 dbname=x user=bob password='" + secret + "' connect_timeout=3",
        "postgresql://bob:" + secret + "@127.0.0.1:1/x?connect_timeout=3",
        "postgresql://bob@127.0.0.1:1/x?password=" + secret + "&connect_timeout=3",
        "host=127.0.0.1 port=1 password=" + secret + " bogus_option=1",
    };
    for (const auto& conninfo : conninfos) {
        for (const std::string cmd : {"migrate", "maintain", "status"}) {
            CAPTURE(conninfo, cmd);
            const auto r = admin({cmd, "--postgres", conninfo});
            CAPTURE(r.out, r.err);
            CHECK(r.rc == 1);
            CHECK(has(r.err, "cannot connect to PostgreSQL"));
            CHECK_FALSE(has(r.all(), secret));
            // The same from the environment.
            const auto e = admin({cmd}, {{"IDEMKAFKA_POSTGRES", conninfo}});
            CAPTURE(e.out, e.err);
            CHECK(e.rc == 1);
            CHECK_FALSE(has(e.all(), secret));
        }
    }
    // A reachable server (trust authentication here) with a password in the string:
    // nothing printed carries it either.
    const auto table = unique_name("pe_adm_pw");
    DropTable drop{"public." + table};
    const std::string with_pw = pg() + " password=" + secret;
    for (const std::string cmd : {"migrate", "maintain", "status"}) {
        const auto r = admin({cmd, "--postgres", with_pw, "--table", table});
        CAPTURE(cmd, r.out, r.err);
        CHECK(r.rc == 0);
        CHECK_FALSE(has(r.all(), secret));
    }
}

TEST_CASE("admin: migrate twice and concurrently", "[retention][admin]")
{
    const auto table = unique_name("pe_adm_mig");
    DropTable drop{"public." + table};
    {
        const auto r = admin(with_db({"migrate"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "created"));
        CHECK(has(r.out, "11 partitions created"));
    }
    {
        const auto r = admin(with_db({"migrate"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "(0 partitions created)"));
    }

    const auto table2 = unique_name("pe_adm_conc");
    DropTable drop2{"public." + table2};
    const auto results = admin_parallel(std::vector<std::vector<std::string>>(4, with_db({"migrate"}, table2)));
    int created = 0;
    for (const auto& res : results) {
        CAPTURE(res.out, res.err);
        CHECK(res.rc == 0);
        created += has(res.out, "(created,") ? 1 : 0;
    }
    CHECK(created == 1);
    auto conn = connect();
    CHECK(partitions(*conn, ProcessedEventStore("public", table2)).size() == 12);

    // A plain table is converted only on request.
    const auto plain = unique_name("pe_adm_plain");
    DropTable drop3{"public." + plain};
    {
        const auto r = admin(with_db({"migrate", "--mode", "purge"}, plain));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "plain table"));
    }
    {
        const auto r = admin(with_db({"migrate"}, plain));
        CAPTURE(r.out, r.err);
        CHECK(has(r.out, "plain table"));
    }
    {
        const auto r = admin(with_db({"migrate", "--mode", "partitioned"}, plain));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "converted"));
    }
    {
        const auto r = admin(with_db({"migrate", "--mode", "purge"}, plain));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 1);
        CHECK(has(r.err, "not supported"));
    }
}

TEST_CASE("admin: status as a table and as JSON", "[retention][admin]")
{
    const auto table = unique_name("pe_adm_status");
    DropTable drop{"public." + table};
    {
        const auto r = admin(with_db({"status"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 1);
        CHECK(has(r.err, "does not exist; run `idemkafka-admin migrate` first"));
    }
    {
        const auto r = admin(with_db({"status", "--json"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 1);
        CHECK(nlohmann::json::parse(r.out)["exists"] == false);
    }

    REQUIRE(admin(with_db({"migrate"}, table)).rc == 0);
    const ProcessedEventStore store("public", table);
    auto conn = connect();
    for (int i = 0; i < 5; ++i)
        REQUIRE(claim(*conn, store, "billing", new_event_id()));
    REQUIRE(claim(*conn, store, "analytics \"quoted\"", new_event_id()));

    {
        const auto r = admin(with_db({"status"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "partitioned by event id"));
        CHECK(has(r.out, "claims        6"));
        CHECK(has(r.out, "billing"));
        CHECK(has(r.out, "dedup horizon 6d (retention 7d - margin 1d)"));
        CHECK(has(r.out, partition_name(table, now_ms() - now_ms() % day_ms)));
        CHECK(has(r.out, default_partition_name(table)));
    }

    {
        const auto r = admin(with_db({"status", "--json", "--retention", "3d", "--horizon-margin", "12h"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["exists"] == true);
        CHECK(j["mode"] == "partitioned");
        CHECK(j["rows"] == 6);
        CHECK(j["dedup_horizon_ms"] == 2 * day_ms + 12 * hour_ms);
        REQUIRE(j["groups"].size() == 2);
        CHECK(j["groups"][0]["consumer_group"] == "analytics \"quoted\"");
        CHECK(j["groups"][1]["rows"] == 5);
        CHECK(j["partitions"].size() == 12);
        CHECK(j["partitions"].back()["default"] == true);
        CHECK(j["partitions"][0]["from"].is_string());
        CHECK(j["newest_claim"].is_string());
    }
}

TEST_CASE("admin: maintain, with --dry-run, purge mode and the maintenance lock", "[retention][admin]")
{
    const auto table = unique_name("pe_adm_maint");
    DropTable drop{"public." + table};
    REQUIRE(admin(with_db({"migrate"}, table)).rc == 0);
    const ProcessedEventStore store("public", table);
    auto conn = connect();
    const auto before = partitions(*conn, store);
    const std::int64_t later = now_ms() + 20 * day_ms;
    const std::string now_arg = "@" + std::to_string(later);

    {
        const auto r = admin(with_db({"maintain", "--dry-run", "--now", now_arg}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "would drop"));
        CHECK(has(r.out, "would create"));
        CHECK(has(r.out, "dry run: 11 partitions to create, 11 to drop"));
        CHECK(partitions(*conn, store) == before);
    }

    {
        const auto r = admin(with_db({"maintain", "--now", now_arg}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "dropped partition"));
        CHECK(has(r.out, "done: 11 partitions created, 11 dropped"));
        CHECK(partitions(*conn, store) != before);
    }
    const auto after = partitions(*conn, store);
    CHECK(std::find(after.begin(), after.end(), partition_name(table, later - later % day_ms - 7 * day_ms)) !=
          after.end());

    // Another session maintaining: nothing done, and said so.
    auto other = connect();
    {
        pqxx::nontransaction tx(*other);
        detail::pg::exec_params(tx, "SELECT pg_advisory_lock(hashtext('idemkafka.maintenance'), hashtext($1))",
                                store.qualified_name());
    }
    {
        const auto r = admin(with_db({"maintain"}, table));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "another session holds the maintenance lock"));
    }
    other.reset();

    // Purge mode, small batches, progress and totals printed.
    const auto plain = unique_name("pe_adm_purge");
    DropTable drop_plain{"public." + plain};
    REQUIRE(admin(with_db({"migrate", "--mode", "purge"}, plain)).rc == 0);
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group, processed_at) SELECT gen_random_uuid(), 'g', "
                     "now() - interval '9 days' FROM generate_series(1, 25)",
                     plain));
    exec(fmt::format("INSERT INTO {} (event_id, consumer_group) SELECT gen_random_uuid(), 'g' FROM "
                     "generate_series(1, 4)",
                     plain));
    {
        const auto r = admin(with_db({"maintain", "--purge-batch", "10", "--purge-pause", "1ms"}, plain));
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "purged 25 rows"));
        CHECK(has(r.out, "in 3 batches"));
        CHECK(scalar("SELECT count(*) FROM " + plain) == 4);
    }
}

// A maintenance frozen (SIGSTOP, a paused VM) inside one of its transactions,
// after a statement that locked the default partition, holds that lock for as
// long as it stays frozen: every claim routed to the default partition waits
// on it. The server ends such a transaction by itself once it has sat idle for
// the maintenance's bound, and the claims go on.
TEST_CASE("admin: a maintenance frozen inside its transaction does not keep its locks", "[retention][admin]")
{
    const auto table = unique_name("pe_adm_frozen");
    DropTable drop{"public." + table};
    REQUIRE(admin(with_db({"migrate"}, table)).rc == 0);
    const ProcessedEventStore store("public", table);
    auto conn = connect();
    const auto default_partition = [&] {
        pqxx::nontransaction tx(*conn);
        return detail::pg::exec_params(
                   tx, "SELECT partdefid::regclass::text FROM pg_partitioned_table WHERE partrelid = to_regclass($1)",
                   store.qualified_name())[0][0]
            .as<std::string>();
    }();
    // Held here, the default partition makes the maintenance's first partition
    // (20 days ahead, so that there is one to create) wait inside its transaction.
    auto locker = connect();
    pqxx::work held(*locker);
    held.exec("SELECT count(*) FROM " + default_partition);

    // The claim past it: an id only the default partition takes (older than every partition).
    const std::int64_t later = now_ms() + 20 * day_ms;
    const auto f = freeze_inside(*conn, held, with_db({"maintain", "--now", "@" + std::to_string(later)}, table),
                                 "LOCK TABLE", store, v7_at(now_ms() - 400 * day_ms));
    CAPTURE(f.error);
    CHECK(f.waited);
    CHECK(f.idle);
    CHECK(f.claimed);
    CHECK(f.ended);
}

// The same for a migration: converting a plain claims table locks the whole
// table, and a migrate frozen inside its transaction would stop every claim
// of every group on it. The server ends it once it has sat idle for the
// retention's lock_timeout; the conversion rolls back and the claims go on.
TEST_CASE("admin: a migration frozen inside its transaction does not keep its locks", "[retention][admin]")
{
    HeldPlainTable t("pe_adm_frozen_mig"); // makes the conversion wait inside its transaction

    const auto f = freeze_inside(*t.conn, t.held, with_db({"migrate", "--mode", "partitioned"}, t.table), "ALTER TABLE",
                                 t.store, new_event_id());
    CAPTURE(f.error);
    CHECK(f.waited);
    CHECK(f.idle);
    CHECK(f.claimed);
    CHECK(f.ended);
    CHECK(partitions(*t.conn, t.store).empty()); // the conversion rolled back
}

// A conversion locks the whole claims table. Queued behind a long
// transaction on it (a report reading the table), its lock request would
// hold up every claim that comes after it, for as long as that transaction
// runs. Each attempt waits at most lock_timeout and rolls back; the claims go
// on until the next one, which converts the table once it is free.
TEST_CASE("admin: a migration waiting for a lock does not hold up the claims behind it", "[retention][admin]")
{
    HeldPlainTable t("pe_adm_queued_mig");

    const BackgroundAdmin run(with_db({"migrate", "--mode", "partitioned", "--lock-timeout", "1s"}, t.table));
    REQUIRE(wait_until(
        [&] { return backend_where(*t.conn, "wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%'") != 0; }, 20s));
    const auto start = std::chrono::steady_clock::now();
    const auto [claimed, error] = claim_behind(*t.conn, t.store, new_event_id());
    const auto waited = std::chrono::steady_clock::now() - start;
    CAPTURE(error);
    CHECK(claimed);
    CHECK(waited < 10s); // the conversion's lock_timeout, not the claim's

    t.held.commit();
    CHECK(wait_until([&] { return !partitions(*t.conn, t.store).empty(); }, 60s)); // a later attempt converted it
}

TEST_CASE("admin: odd names and injection attempts are quoted, never executed", "[retention][admin]")
{
    const std::string canary = unique_name("canary");
    exec("CREATE TABLE " + canary + " (x int)");
    DropTable drop_canary{canary};
    const std::string table = "x\"; DROP TABLE " + canary + "; --";
    DropTable drop{quote_identifier("public") + "." + quote_identifier(table)};
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"migrate"}, {"maintain"}, {"status"}, {"status", "--json"}}) {
        const auto r = admin(with_db(args, table));
        CAPTURE(args, r.out, r.err);
        CHECK(r.rc == 0);
    }
    CHECK(scalar("SELECT count(*) FROM " + canary) == 0); // the canary is still there
    CHECK(scalar(fmt::format("SELECT count(*) FROM pg_class WHERE relname = '{}'",
                             std::string("x\"; DROP TABLE ") + canary + "; --")) == 1);
    const auto r = admin(with_db({"status", "--json"}, table));
    CHECK(nlohmann::json::parse(r.out)["name"] == table);

    // A schema name is quoted the same way.
    const std::string schema = "s'; DROP TABLE " + canary + "; --";
    const auto rs = admin({"migrate", "--postgres", pg(), "--schema", schema, "--table", "t", "--mode", "purge"});
    CHECK(rs.rc == 0);
    CHECK(scalar("SELECT count(*) FROM " + canary) == 0);
    exec("DROP SCHEMA " + quote_identifier(schema) + " CASCADE");
}

TEST_CASE("admin: dead-letters list and replay", "[retention][admin]")
{
    const auto dlq = unique_name("adm_dlq");
    const auto source = unique_name("adm_src");
    const auto other_source = unique_name("adm_src2");
    create_topic(dlq, 2);
    create_topic(source, 2);
    create_topic(other_source, 1);

    struct Letter {
        std::string reason, topic, key, value, event_id;
    };
    const std::vector<Letter> letters = {
        {"decode_error", source, "k1", "not json", ""},
        {"decode_error", source, "k2", "{broken", ""},
        {"handler_failed", source, "k3", "payload-3", new_event_id().to_string()},
        {"beyond_dedup_horizon", other_source, "k4", "payload-4", new_event_id().to_string()},
        {"decode_error", "", "k5", "orphan", ""},
    };
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        int offset = 100;
        for (const auto& l : letters) {
            std::vector<Header> h = {{"trace-id", "t-" + l.key}, {"empty", std::nullopt}};
            if (!l.topic.empty())
                h.push_back({dead_letter_header::original_topic, l.topic});
            h.push_back({dead_letter_header::reason, l.reason});
            h.push_back({dead_letter_header::error, "it broke: " + l.reason});
            h.push_back({dead_letter_header::original_partition, "1"});
            h.push_back({dead_letter_header::original_offset, std::to_string(offset++)});
            h.push_back({dead_letter_header::original_timestamp, "1700000000000"});
            if (!l.event_id.empty())
                h.push_back({dead_letter_header::event_id, l.event_id});
            h.push_back({dead_letter_header::attempts, "1"});
            h.push_back({dead_letter_header::consumer_group, "billing"});
            pub.publish(dlq, l.key, l.value, h);
        }
    }
    const auto audit = unique_name("adm_audit");
    DropTable drop_audit{"public." + audit};
    const auto claims = unique_name("pe_adm_dl");
    DropTable drop_claims{"public." + claims};
    {
        const auto r = admin(with_db({"migrate", "--replay-audit-table", audit}, claims));
        CAPTURE(r.out, r.err);
        REQUIRE(r.rc == 0);
        CHECK(has(r.out, "\"public\".\"" + audit + "\" created"));
    }
    const std::vector<std::string> kafka = {"--brokers", brokers(), "--topic", dlq, "--timeout", "30s"};
    const std::vector<std::string> audit_db = {"--postgres",     pg(),    "--replay-audit-table", audit,
                                               "--requested-by", "tester"};
    auto cmd = [&](std::vector<std::string> args) {
        args.insert(args.end(), kafka.begin(), kafka.end());
        return admin(args);
    };

    {
        const auto r = cmd({"dead-letters", "list"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "5 dead-letter record(s) read from " + dlq + ", 5 matching"));
        CHECK(has(r.out, "reason=handler_failed"));
        CHECK(has(r.out, "from=" + source + "/1@102"));
        CHECK(has(r.out, "event=" + letters[2].event_id));
    }

    {
        const auto r = cmd({"dead-letters", "list", "--reason", "decode_error", "--json"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["read"] == 5);
        CHECK(j["matched"] == 3);
        REQUIRE(j["records"].size() == 3);
        for (const auto& rec : j["records"]) {
            CHECK(rec["reason"] == "decode_error");
            CHECK(rec["consumer_group"] == "billing");
        }
    }

    {
        const auto r = cmd({"dead-letters", "list", "--reason", "handler_failed", "--reason", "beyond_dedup_horizon",
                            "--event-id", letters[3].event_id});
        CAPTURE(r.out, r.err);
        CHECK_FALSE(has(r.out, "5 matching"));
        CHECK(has(r.out, ", 1 matching"));
    }
    {
        const auto r = cmd({"dead-letters", "list", "--original-topic", other_source, "--limit", "1"});
        CAPTURE(r.out, r.err);
        CHECK(has(r.out, "reason=beyond_dedup_horizon"));
    }

    // Dry run: says what it would do, publishes nothing.
    {
        auto args = std::vector<std::string>{"dead-letters", "replay", "--reason", "decode_error", "--dry-run"};
        args.insert(args.end(), audit_db.begin(), audit_db.end());
        const auto r = cmd(args);
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "would replay " + dlq));
        CHECK(has(r.out, "-> " + source));
        CHECK(has(r.out, "2 would be replayed, 1 skipped"));
        CHECK(has(r.err, "no idemkafka.original.topic header"));
        CHECK(read_topic(source, 1, 3s).empty());
    }

    // Replay: the original key, value and headers (without idemkafka.*) to the source.
    {
        auto args = std::vector<std::string>{"dead-letters", "replay",   "--reason",
                                             "decode_error", "--reason", "handler_failed"};
        args.insert(args.end(), audit_db.begin(), audit_db.end());
        const auto r = cmd(args);
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        CHECK(has(r.out, "3 replayed, 1 skipped, 0 failed"));
        CHECK(scalar("SELECT published FROM public." + audit + " WHERE requested_by = 'tester'") == 3);
        // Asked again: replayed before, so skipped.
        const auto again = cmd(args);
        CAPTURE(again.out, again.err);
        CHECK(again.rc == 0);
        CHECK(has(again.out, "0 replayed, 4 skipped, 0 failed"));
        CHECK(has(again.err, "replayed before"));
    }
    {
        const auto r = cmd({"dead-letters", "groups", "--json"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["matched"] == 5);
        REQUIRE(j["groups"].size() ==
                3); // decode_error x3 (one cause, whatever the source), handler_failed, beyond_dedup_horizon
        CHECK(j["groups"][0]["count"] == 3);
        CHECK(j["groups"][0]["reason"] == "decode_error");
        CHECK(j["groups"][0]["error_pattern"] == "it broke: decode_error");
    }
    auto replayed = read_topic(source, 3, 30s);
    REQUIRE(replayed.size() == 3);
    std::sort(replayed.begin(), replayed.end(), [](const ReadRecord& a, const ReadRecord& b) { return a.key < b.key; });
    for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        CHECK(replayed[i].key == letters[i].key);
        CHECK(replayed[i].value == letters[i].value);
        CHECK(replayed[i].header("trace-id") == "t-" + letters[i].key);
        REQUIRE(replayed[i].headers.size() == 2);
        CHECK(replayed[i].headers[1].name == "empty");
        CHECK_FALSE(replayed[i].headers[1].value.has_value());
        for (const auto& h : replayed[i].headers)
            CHECK(h.name.rfind("idemkafka.", 0) != 0);
    }
    CHECK(read_topic(other_source, 1, 2s).empty());

    // Failures: a topic that does not exist, a broker that cannot be reached (and a
    // secret setting that must not show up in the error).
    {
        const auto r = admin({"dead-letters", "list", "--brokers", brokers(), "--topic", unique_name("no_such_topic"),
                              "--timeout", "10s"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 1);
        CHECK(has(r.err, "does not exist"));
    }
    {
        const auto r = admin({"dead-letters", "list", "--brokers", "127.0.0.1:1", "--topic", dlq, "--timeout", "3s",
                              "--kafka", "sasl.password=TopSecret-77"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 1);
        CHECK(has(r.err, "idemkafka-admin: error:"));
        CHECK_FALSE(has(r.all(), "TopSecret-77"));
    }
    {
        const auto r =
            admin({"dead-letters", "list", "--brokers", brokers(), "--topic", dlq, "--kafka", "no.such.property=1"});
        CAPTURE(r.out, r.err);
        CHECK(r.rc == 2);
        CHECK(has(r.err, "no.such.property"));
    }
}
