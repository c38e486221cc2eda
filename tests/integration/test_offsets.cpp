// offsets_in_database: positions committed with the effects, read on
// assignment, fenced against members that lost their partitions.

#include <atomic>
#include <cstdio>

#include <random>
#include <sys/wait.h>
#include <thread>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>
#include <idemkafka/offset_store.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

using Consumer = IdempotentConsumer<TestEvent>;

struct OffsetsSetup {
    std::string topic = unique_name("offsets");
    std::string group = unique_name("g");
    std::string effects = unique_name("effect");
    std::vector<TestEvent> events;
    int partitions;

    explicit OffsetsSetup(int parts) : partitions(parts)
    {
        create_topic(topic, partitions);
        exec(fmt::format("CREATE TABLE {} (seq bigserial PRIMARY KEY, event_id uuid NOT NULL, who text NOT NULL)",
                         effects));
    }

    void publish(int n)
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < n; ++i) {
            TestEvent e{new_event_id(), fmt::format("e-{}", i % 40), i};
            events.push_back(e);
            pub.publish_async(topic, e.entity, encode(e));
        }
        pub.flush();
    }

    /// A stored row for every partition, taken at `epoch`, at `next_offset`
    /// (SQL: a number, or NULL for a row without a position).
    void store_positions(int epoch, const char* next_offset = "0") const
    {
        {
            pqxx::connection db(pg());
            pqxx::work tx(db);
            OffsetStore("public", "consumer_offset").ensure_schema(tx);
            tx.commit();
        }
        for (int p = 0; p < partitions; ++p)
            exec(fmt::format("INSERT INTO consumer_offset (consumer_group, topic, partition, next_offset, epoch) "
                             "VALUES ('{}', '{}', {}, {}, {})",
                             group, topic, p, next_offset, epoch));
    }

    ConsumerConfig config() const
    {
        auto cfg = consumer_config(group, topic);
        cfg.offsets_in_database = true;
        cfg.max_batch = 50;
        return cfg;
    }

    Consumer::Handler handler(std::atomic<int>& calls, const std::string& who = "a") const
    {
        return [this, &calls, who](pqxx::work& tx, const TestEvent& e, const Context&) {
            detail::pg::exec_params(tx, fmt::format("INSERT INTO {} (event_id, who) VALUES ($1::uuid, $2)", effects),
                                    e.id.to_string(), who);
            ++calls;
        };
    }

    std::int64_t rows() const { return scalar("SELECT count(*) FROM " + effects); }
    std::int64_t stored_total() const
    {
        return scalar(fmt::format(
            "SELECT coalesce(sum(next_offset), 0) FROM consumer_offset WHERE consumer_group = '{}'", group));
    }
};

void drain(Consumer& c, const std::function<bool()>& done)
{
    Runner<Consumer> run(c);
    const bool ok = wait_until(done, 90s);
    run.join();
    REQUIRE_FALSE(run.error());
    REQUIRE(ok);
}

} // namespace

TEST_CASE("offset commits failing for every batch: a restart resumes from the database position", "[offsets][mock]")
{
    OffsetsSetup s(2);
    s.publish(400);
    std::string errors = "push-errors OffsetCommit";
    for (int i = 0; i < 300; ++i)
        errors += " REQUEST_TIMED_OUT";
    mock_control(errors);
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] { return s.rows() == 400; });
        CHECK(c.metrics().snapshot().offset_commits == 0);
        CHECK(c.metrics().snapshot().offset_commit_failures >= 1);
    }
    mock_control("clear-errors OffsetCommit");
    CHECK(committed_offset(s.group, s.topic, 0) < 0); // Kafka has nothing
    CHECK(s.stored_total() == 400);                   // the database has everything

    std::atomic<int> again{0};
    Consumer c(s.config(), decode, event_id_of, s.handler(again));
    drain(c, [&] { return c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(again == 0);        // no redelivered handler call
    CHECK(m.duplicates == 0); // no duplicate claim even attempted
    CHECK(m.consumed == 0);
    CHECK(calls == 400);
    CHECK(s.rows() == 400);
}

TEST_CASE("group offsets reset to earliest after retention purged old claims: old events do not run again", "[offsets]")
{
    OffsetsSetup s(2);
    s.publish(300);
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] { return s.rows() == 300 && c.metrics().snapshot().lag == 0; });
    }
    // Retention removed the claims of the first half; an operator resets the group.
    std::string first_half;
    for (int i = 0; i < 150; ++i)
        first_half += (i ? ",'" : "'") + s.events[static_cast<std::size_t>(i)].id.to_string() + "'";
    exec(fmt::format("DELETE FROM processed_event WHERE consumer_group = '{}' AND event_id IN ({})", s.group,
                     first_half));
    reset_group_offsets(s.group, s.topic, s.partitions, 0);
    CHECK(committed_offset(s.group, s.topic, 0) == 0);

    s.publish(20); // new events after the reset still flow
    std::atomic<int> after{0};
    Consumer c(s.config(), decode, event_id_of, s.handler(after, "b"));
    drain(c, [&] { return c.metrics().snapshot().lag == 0 && after >= 20; });
    CHECK(after == 20);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE who = 'b'", s.effects)) == 20);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} e WHERE e.event_id IN ({})", s.effects, first_half)) == 150);
}

TEST_CASE("commits PostgreSQL lost (a restored backup, a failover without them): the stored position decides, "
          "every lost record is processed once again",
          "[offsets]")
{
    OffsetsSetup s(1);
    s.publish(200);
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] { return s.rows() == 200 && c.metrics().snapshot().lag == 0; });
    }
    REQUIRE(committed_offset(s.group, s.topic, 0) == 200);
    // The database as a backup taken before the last 60 transactions' worth
    // of records left it: their claims, their effects and the position are
    // gone, while Kafka's committed offset is still 200.
    constexpr int lost = 60;
    std::string lost_ids;
    for (int i = 200 - lost; i < 200; ++i)
        lost_ids += (lost_ids.empty() ? "'" : ",'") + s.events[static_cast<std::size_t>(i)].id.to_string() + "'";
    exec(
        fmt::format("DELETE FROM processed_event WHERE consumer_group = '{}' AND event_id IN ({})", s.group, lost_ids));
    exec(fmt::format("DELETE FROM {} WHERE event_id IN ({})", s.effects, lost_ids));
    exec(fmt::format("UPDATE consumer_offset SET next_offset = {} WHERE consumer_group = '{}'", 200 - lost, s.group));
    REQUIRE(s.rows() == 200 - lost);

    std::atomic<int> again{0};
    Consumer c(s.config(), decode, event_id_of, s.handler(again, "b"));
    drain(c, [&] { return s.rows() == 200 && c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(again == lost);
    CHECK(m.claimed == static_cast<std::uint64_t>(lost));
    CHECK(m.duplicates == 0);
    CHECK(m.positions_behind_kafka == 1);
    CHECK(m.records_behind_kafka == static_cast<std::uint64_t>(lost));
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 200);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE who = 'b' AND event_id IN ({})", s.effects, lost_ids)) ==
          lost);
    CHECK(s.stored_total() == 200);
}

TEST_CASE("commits lost under a running member: after its reconnect the stored position decides, also level "
          "with Kafka's committed offset (the lost offsets had not reached Kafka), every lost record runs again",
          "[offsets]")
{
    OffsetsSetup s(1);
    s.publish(50);
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] { return s.rows() == 50 && committed_offset(s.group, s.topic, 0) == 50; });
    }
    s.publish(50);
    auto cfg = s.config();
    cfg.max_batch = 10;
    cfg.commit_interval = std::chrono::hours(1); // Kafka hears of the first batch at most
    Consumer c(cfg, decode, event_id_of, s.handler(calls));
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return s.rows() == 100 && c.metrics().snapshot().lag == 0; }, 60s));
    const auto kafka = committed_offset(s.group, s.topic, 0);
    REQUIRE(kafka >= 50);
    REQUIRE(kafka < 100);
    // The database as a failover to a standby that lacks the commits Kafka has
    // not heard of leaves it: claims, effects and position level with Kafka's
    // committed offset, behind the member's position; the member's sessions end.
    std::string lost_ids;
    for (auto i = kafka; i < 100; ++i)
        lost_ids += (lost_ids.empty() ? "'" : ",'") + s.events[static_cast<std::size_t>(i)].id.to_string() + "'";
    exec(
        fmt::format("DELETE FROM processed_event WHERE consumer_group = '{}' AND event_id IN ({})", s.group, lost_ids));
    exec(fmt::format("DELETE FROM {} WHERE event_id IN ({})", s.effects, lost_ids));
    exec(fmt::format("UPDATE consumer_offset SET next_offset = {} WHERE consumer_group = '{}'", kafka, s.group));
    exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
         "pg_backend_pid()");
    REQUIRE(s.rows() == kafka);
    // The next batch finds its connection gone; the reconnect reads the stored position.
    s.publish(10);
    REQUIRE(wait_until([&] { return s.rows() == 110 && c.metrics().snapshot().lag == 0; }, 60s));
    run.join();
    REQUIRE_FALSE(run.error());
    const auto m = c.metrics().snapshot();
    CHECK(m.db_reconnects >= 1);
    CHECK(calls == 100 + (100 - kafka) + 10);
    CHECK(m.positions_behind_kafka == 0); // level with Kafka's, not behind
    CHECK(m.duplicates == 0);
    CHECK(scalar(fmt::format("SELECT count(DISTINCT event_id) FROM {}", s.effects)) == 110);
    CHECK(scalar(fmt::format("SELECT count(*) FROM processed_event WHERE consumer_group = '{}'", s.group)) == 110);
    CHECK(s.stored_total() == 110);
}

TEST_CASE("records settled before the handlers (dead letters at the end of a partition) move the stored position "
          "too: a restart finds it level with Kafka's and dead-letters nothing again",
          "[offsets]")
{
    OffsetsSetup s(1);
    s.publish(50);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 5; ++i)
            pub.publish(s.topic, std::string("e-poison"), "not an event"); // the decoder refuses it
    }
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] {
            const auto m = c.metrics().snapshot();
            return s.rows() == 50 && m.decode_errors == 5 && m.lag == 0 && committed_offset(s.group, s.topic, 0) == 55;
        });
    }
    CHECK(s.stored_total() == 55);
    Consumer c(s.config(), decode, event_id_of, s.handler(calls));
    drain(c, [&] { return c.metrics().snapshot().assigned_partitions == 1 && c.metrics().snapshot().lag == 0; });
    const auto m = c.metrics().snapshot();
    CHECK(m.positions_behind_kafka == 0);
    CHECK(m.consumed == 0);
    CHECK(m.decode_errors == 0);
    CHECK(read_topic(s.group + ".dlq", 5, 30s).size() == 5); // and none more: the restart dead-lettered nothing
}

TEST_CASE("a fenced zombie cannot move the stored position back, and effects stay exact", "[offsets][rebalance]")
{
    OffsetsSetup s(1);
    s.publish(200);
    auto cfg = s.config();
    cfg.max_batch = 100;
    cfg.pipeline = true;
    cfg.kafka["max.poll.interval.ms"] = "7000"; // the frozen member is dropped after 7 s
    std::atomic<int> calls{0};
    std::atomic<bool> frozen{false};
    std::atomic<bool> handler_frozen{false};
    std::atomic<bool> release{false};
    // A zombie is a member whose whole process stood still (a GC pause, a
    // stopped VM): a handler call that runs long alone does not get a member
    // dropped, its poll thread keeps the membership. So the handler freezes
    // with its transaction open, and then the poll thread freezes too, in the
    // decoder of the next batch (pipeline), so nothing polls.
    Consumer zombie(
        cfg,
        [&](std::string_view payload) {
            auto e = decode(payload);
            // The second batch (amounts 100 on; the first holds 0..99) is
            // decoded while the first one runs.
            if (e.amount >= 100 && !frozen.exchange(true)) {
                wait_until([&] { return handler_frozen.load(); }, 30s);
                while (!release)
                    std::this_thread::sleep_for(10ms);
            }
            return e;
        },
        event_id_of,
        [&](pqxx::work& tx, const TestEvent& e, const Context&) {
            detail::pg::exec_params(
                tx, fmt::format("INSERT INTO {} (event_id, who) VALUES ($1::uuid, 'zombie')", s.effects),
                e.id.to_string());
            ++calls;
            if (!handler_frozen.exchange(true))
                while (!release)
                    std::this_thread::sleep_for(10ms);
        });
    Runner<Consumer> zr(zombie);
    // A failed REQUIRE below must not leave zr's join waiting on the frozen handler.
    struct ReleaseOnExit {
        std::atomic<bool>& flag;
        ~ReleaseOnExit() { flag = true; }
    };
    ReleaseOnExit release_on_exit{release};
    REQUIRE(wait_until([&] { return frozen.load(); }, 60s));

    std::atomic<int> taken_over{0};
    Consumer successor(s.config(), decode, event_id_of, s.handler(taken_over, "successor"));
    Runner<Consumer> sr(successor);
    // Destroyed before sr: a failed REQUIRE releases the zombie first, whose
    // open transaction holds claims the successor's batch waits for.
    ReleaseOnExit release_before_joins{release};
    // The successor gets the partition, but the zombie's open transaction holds
    // the claims of its batch; release the zombie once the successor owns the
    // partition (its epoch is newer).
    REQUIRE(wait_until([&] { return successor.metrics().snapshot().assigned_partitions == 1; }, 60s));
    release = true;
    // Its stale position write is refused; then it stops, before it could
    // join the group again and take the one partition back (a member that
    // owns it again, with a new epoch, may process records: no zombie then).
    REQUIRE(wait_until([&] { return zombie.metrics().snapshot().fenced_writes >= 1; }, 60s));
    zr.join();
    REQUIRE(wait_until([&] { return s.rows() == 200 && successor.metrics().snapshot().lag == 0; }, 90s));
    sr.join();
    REQUIRE_FALSE(zr.error());
    REQUIRE_FALSE(sr.error());

    CHECK(zombie.metrics().snapshot().fenced_writes >= 1);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE who = 'zombie'", s.effects)) == 0);
    CHECK(s.rows() == 200);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + s.effects) == 200);
    CHECK(s.stored_total() == 200); // not moved back
}

TEST_CASE("a stored position never moves backwards under concurrent writers", "[offsets]")
{
    OffsetStore store("public", "consumer_offset");
    const auto group = unique_name("g");
    {
        pqxx::connection c(pg());
        pqxx::work tx(c);
        store.ensure_schema(tx);
        tx.commit();
    }
    std::int64_t epoch = 0;
    {
        pqxx::connection c(pg());
        pqxx::work tx(c);
        const auto got = store.acquire(tx, group, {{"t", 0}, {"t", 1}});
        REQUIRE(got.size() == 2);
        epoch = got[0].epoch;
        tx.commit();
    }
    std::atomic<std::int64_t> highest{0};
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w)
        writers.emplace_back([&, w] {
            pqxx::connection c(pg());
            std::mt19937 rng(static_cast<unsigned>(w));
            for (int i = 0; i < 200; ++i) {
                const std::int64_t n = rng() % 100000;
                for (;;) {
                    try {
                        pqxx::work tx(c);
                        const auto refused = store.write(tx, group, {{"t", 0, n, epoch}, {"t", 1, n / 2, epoch}});
                        tx.commit();
                        if (refused.empty()) {
                            auto h = highest.load();
                            while (n > h && !highest.compare_exchange_weak(h, n)) {
                            }
                        }
                        break;
                    } catch (const pqxx::transaction_rollback&) {
                        // deadlock between the two rows: run it again
                    }
                }
            }
        });
    for (auto& t : writers)
        t.join();
    CHECK(scalar(fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 0",
                             group)) == highest.load());
    CHECK(scalar(fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 1",
                             group)) == highest.load() / 2);
    // A stale epoch is refused and changes nothing.
    pqxx::connection c(pg());
    pqxx::work tx(c);
    store.acquire(tx, group, {{"t", 0}});
    const auto refused = store.write(tx, group, {{"t", 0, 999999999, epoch}});
    CHECK(refused.size() == 1);
    CHECK(scalar(fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 0",
                             group)) == highest.load());
}

namespace {

struct Run {
    int rc = -1;
    std::string output;
};

Run admin(const std::string& args)
{
    Run r;
    const std::string cmd = std::string(IDEMKAFKA_ADMIN_BIN) + " " + args + " 2>&1";
    std::FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p))
        r.output += buf;
    const int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

std::string q(const std::string& s)
{
    return "'" + s + "'";
}

} // namespace

TEST_CASE("idemkafka-admin offsets lists stored positions with Kafka's and sets one to replay", "[offsets]")
{
    OffsetsSetup s(2);
    s.publish(100);
    std::atomic<int> calls{0};
    {
        Consumer c(s.config(), decode, event_id_of, s.handler(calls));
        drain(c, [&] { return s.rows() == 100 && c.metrics().snapshot().lag == 0; });
    }
    const std::int64_t p0 = scalar(
        fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 0", s.group));
    const auto common = fmt::format("--postgres {} --brokers {} --group {}", q(pg()), q(brokers()), q(s.group));

    auto list = admin("offsets " + common + " --json");
    INFO(list.output);
    REQUIRE(list.rc == 0);
    CHECK(list.output.find(fmt::format("\"partition\":0,\"stored\":{}", p0)) != std::string::npos);
    CHECK(list.output.find("\"lag\":0") != std::string::npos);
    CHECK(list.output.find("\"log_end\":" + std::to_string(p0)) != std::string::npos);

    auto status = admin(fmt::format("status --postgres {} --brokers {}", q(pg()), q(brokers())));
    CHECK(status.rc == 0);
    CHECK(status.output.find("stored positions") != std::string::npos);
    CHECK(status.output.find(s.topic) != std::string::npos);

    auto dry = admin("offsets set " + common + " --topic " + s.topic + " --partition 0 --offset 0 --dry-run");
    CHECK(dry.rc == 0);
    CHECK(dry.output.find("dry run") != std::string::npos);
    CHECK(scalar(fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 0",
                             s.group)) == p0);

    auto set = admin("offsets set " + common + " --topic " + s.topic + " --partition 0 --offset 0");
    CHECK(set.rc == 0);
    CHECK(scalar(fmt::format("SELECT next_offset FROM consumer_offset WHERE consumer_group = '{}' AND partition = 0",
                             s.group)) == 0);
    // Kafka still says p0 for partition 0: the stored position decides alone.
    std::atomic<int> again{0};
    Consumer c(s.config(), decode, event_id_of, s.handler(again));
    drain(c, [&] {
        return c.metrics().snapshot().lag == 0 && c.metrics().snapshot().consumed >= static_cast<std::uint64_t>(p0);
    });
    CHECK(again == 0); // partition 0 replayed, every event deduplicated; partition 1 stayed at its position
    CHECK(c.metrics().snapshot().consumed == static_cast<std::uint64_t>(p0));
    CHECK(c.metrics().snapshot().duplicates == static_cast<std::uint64_t>(p0));
    CHECK(c.metrics().snapshot().positions_behind_kafka == 1);
    CHECK(c.metrics().snapshot().records_behind_kafka == static_cast<std::uint64_t>(p0));
    CHECK(s.rows() == 100);

    auto bad = admin("offsets set " + common);
    CHECK(bad.rc == 2);
    auto unreachable = admin("offsets --postgres 'host=/nonexistent port=1 user=u password=hunter2'");
    CHECK(unreachable.rc == 1);
    CHECK(unreachable.output.find("hunter2") == std::string::npos);
}

// A member killed between its takeover and its first stored position leaves
// rows with an epoch and no position. Its successor starts those partitions
// where Kafka's committed offset (or auto.offset.reset) says, on an offset of
// its own: left to librdkafka's own offset fetch at assignment, a refused
// fetch (a stale group coordinator) leaves a partition assigned and never
// fetched, without a word.
TEST_CASE("stored rows without a position, Kafka's offset fetch refused at assignment: every partition is "
          "consumed from where Kafka says",
          "[offsets][mock]")
{
    OffsetsSetup s(2);
    s.publish(200);
    s.store_positions(9, "NULL");
    // Enough refusals for every offset fetch before the assignment and the one at it.
    mock_control("push-errors OffsetFetch NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR");
    std::atomic<int> calls{0};
    Consumer c(s.config(), decode, event_id_of, s.handler(calls));
    Runner<Consumer> run(c);
    const bool all = wait_until([&] { return s.rows() == 200; }, 30s);
    run.join();
    mock_control("clear-errors OffsetFetch");
    REQUIRE_FALSE(run.error());
    CHECK(all);
    CHECK(calls == 200);
    CHECK(s.rows() == 200);
    CHECK(c.metrics().snapshot().stalled_partitions == 0);
    CHECK(scalar(fmt::format("SELECT count(*) FROM consumer_offset WHERE consumer_group = '{}' AND next_offset IS "
                             "NULL",
                             s.group)) == 0);
}

// A member frozen (SIGSTOP, a paused VM) inside a transaction that wrote
// stored positions keeps their row locks for as long as it lives. Its
// successor's takeover waits on them: the frozen session is ended once it has
// sat idle past frozen_member_timeout, as at a claim, and the takeover goes on.
TEST_CASE("a frozen member holding a stored-position row lock does not stall its successor's takeover", "[offsets]")
{
    OffsetsSetup s(2);
    s.publish(200);
    s.store_positions(3);
    // The frozen member: a session marked as one of the group's, idle in a
    // transaction that wrote a position.
    pqxx::connection frozen(pg());
    {
        const auto cfg = s.config();
        const auto m = detail::MemberMarker::of(cfg.schema, cfg.table, s.group);
        pqxx::nontransaction tx(frozen);
        detail::pg::exec_params(tx, "SELECT pg_advisory_lock_shared($1, $2), pg_advisory_lock_shared($3, $4)",
                                detail::MemberMarker::space_a, m.key_a, detail::MemberMarker::space_b, m.key_b);
    }
    pqxx::work held(frozen);
    held.exec(fmt::format("UPDATE consumer_offset SET next_offset = 0 WHERE consumer_group = '{}' AND partition = 0",
                          s.group));

    auto cfg = s.config();
    cfg.lock_timeout = 500ms;
    cfg.frozen_member_timeout = 1500ms;
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, s.handler(calls));
    Runner<Consumer> run(c);
    const bool all = wait_until([&] { return s.rows() == 200; }, 30s);
    run.join();
    REQUIRE_FALSE(run.error());
    CHECK(all);
    CHECK(calls == 200);
    CHECK(c.metrics().snapshot().frozen_members_ended == 1);
    CHECK(s.stored_total() == 200);
}

// The successor's side of the same: its own takeover runs on a connection of
// the poll thread, which must carry the member marker too. Frozen inside that
// transaction (its positions' rows locked), an unmarked session would be
// invisible to the other members' frozen-member search, and the partitions
// it took would wait for it for as long as it stays frozen.
TEST_CASE("the session that takes over stored positions is marked as a member of the group", "[offsets]")
{
    OffsetsSetup s(2);
    s.publish(40);
    s.store_positions(1);
    // The rows locked here: the takeover waits inside its transaction, where
    // it can be looked at.
    pqxx::connection locker(pg());
    pqxx::work lock(locker);
    lock.exec(fmt::format("SELECT 1 FROM consumer_offset WHERE consumer_group = '{}' FOR UPDATE", s.group));

    auto cfg = s.config();
    cfg.lock_timeout = 20s;
    const auto m = detail::MemberMarker::of(cfg.schema, cfg.table, s.group);
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, s.handler(calls));
    Runner<Consumer> run(c);
    const auto takeovers = [&](bool marked) {
        return scalar(fmt::format(
            "SELECT count(*) FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> "
            "pg_backend_pid() AND a.wait_event_type = 'Lock' AND a.query LIKE '%epoch = o.epoch + 1%'{}",
            marked ? fmt::format(" AND (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = "
                                 "'advisory' AND l.granted AND ((l.classid = {}::oid AND l.objid = {}::oid) OR "
                                 "(l.classid = {}::oid AND l.objid = {}::oid))) = 2",
                                 detail::MemberMarker::space_a, m.key_a, detail::MemberMarker::space_b, m.key_b)
                   : std::string()));
    };
    const bool waiting = wait_until([&] { return takeovers(false) == 1; }, 30s);
    const auto marked = takeovers(true);
    lock.commit();
    const bool all = wait_until([&] { return s.rows() == 40; }, 30s);
    run.join();
    REQUIRE_FALSE(run.error());
    CHECK(waiting);
    CHECK(marked == 1);
    CHECK(all);
    CHECK(calls == 40);
    CHECK(s.stored_total() == 40);
}

// The guard behind it, shown where librdkafka still fetches the committed
// offset itself (Kafka's offsets, its read refused before and at the
// assignment): a partition owned and never fetched is an error and a gauge.
TEST_CASE("a partition assigned and never fetched is reported: stalled_partitions and an error line", "[offsets][mock]")
{
    OffsetsSetup s(1);
    s.publish(20);
    mock_control("push-errors OffsetFetch NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR NOT_COORDINATOR");
    auto cfg = s.config();
    cfg.offsets_in_database = false;
    cfg.fetch_stall_after = 1s;
    std::atomic<int> calls{0};
    Consumer c(cfg, decode, event_id_of, s.handler(calls));
    Runner<Consumer> run(c);
    const bool reported = wait_until([&] { return c.metrics().snapshot().stalled_partitions == 1; }, 20s);
    run.join();
    mock_control("clear-errors OffsetFetch");
    REQUIRE_FALSE(run.error());
    CHECK(reported);
    CHECK(calls == 0);
}
