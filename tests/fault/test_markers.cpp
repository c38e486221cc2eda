// Stored positions that are no record: a transactional producer leaves a
// control record (the commit marker) after each transaction, so the position
// after a transaction's last record is the marker's offset, which a consumer
// never receives. Needs a broker that writes markers: any real broker, and
// librdkafka's mock cluster from 2.15 on (2.0.2's writes none, so the test is
// built only against 2.15 or later).

#include <librdkafka/rdkafka.h>

#if RD_KAFKA_VERSION >= 0x020f0000

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

struct ProducerDeleter {
    void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using ProducerPtr = std::unique_ptr<rd_kafka_t, ProducerDeleter>;

void require_ok(rd_kafka_error_t* e, const char* what)
{
    if (!e)
        return;
    const std::string text = rd_kafka_error_string(e);
    rd_kafka_error_destroy(e);
    FAIL(what << ": " << text);
}

ProducerPtr transactional_producer()
{
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
             {"bootstrap.servers", brokers()}, {"transactional.id", unique_name("txn")}})
        REQUIRE(rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) == RD_KAFKA_CONF_OK);
    ProducerPtr rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err));
    REQUIRE(rk);
    require_ok(rd_kafka_init_transactions(rk.get(), 30000), "init_transactions");
    return rk;
}

// Appends `n` new events to partition 0 in one committed transaction.
void produce_transaction(rd_kafka_t* rk, Fixture& f, int n)
{
    require_ok(rd_kafka_begin_transaction(rk), "begin_transaction");
    for (int i = 0; i < n; ++i) {
        TestEvent e{new_event_id(), fmt::format("entity-{}", i), i};
        const std::string value = encode(e);
        rd_kafka_vu_t vu[5];
        vu[0].vtype = RD_KAFKA_VTYPE_TOPIC;
        vu[0].u.cstr = f.topic.c_str();
        vu[1].vtype = RD_KAFKA_VTYPE_PARTITION;
        vu[1].u.i32 = 0;
        vu[2].vtype = RD_KAFKA_VTYPE_KEY;
        vu[2].u.mem = {const_cast<char*>(e.entity.data()), e.entity.size()};
        vu[3].vtype = RD_KAFKA_VTYPE_VALUE;
        vu[3].u.mem = {const_cast<char*>(value.data()), value.size()};
        vu[4].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
        vu[4].u.i = RD_KAFKA_MSG_F_COPY;
        require_ok(rd_kafka_produceva(rk, vu, 5), "produce");
        f.events.push_back(e);
    }
    require_ok(rd_kafka_commit_transaction(rk, 30000), "commit_transaction");
}

std::int64_t high_watermark(rd_kafka_t* rk, const std::string& topic)
{
    std::int64_t low = 0;
    std::int64_t high = 0;
    REQUIRE(rd_kafka_query_watermark_offsets(rk, topic.c_str(), 0, &low, &high, 10000) == RD_KAFKA_RESP_ERR_NO_ERROR);
    return high;
}

std::int64_t stored_position(const std::string& table, const std::string& group)
{
    return scalar(
        fmt::format("SELECT coalesce(max(next_offset), -1)::bigint FROM {} WHERE consumer_group = '{}'", table, group));
}

} // namespace

// Before: a rewind to the stored position dropped every record until one
// arrived at exactly that offset. A stored position on a commit marker never
// arrives, so the partition took nothing from then on, with no error.
// The rewind happens when the stored position is applied late: the partition
// was assigned while its offset row could not be read (here: locked by
// another transaction past lock_timeout), and verify_positions() later seeks
// to the stored position.
TEST_CASE("a stored position on a transaction's commit marker is resumed from, not waited for", "[fault][markers]")
{
    Fixture f(1);
    auto rk = transactional_producer();
    produce_transaction(rk.get(), f, 10);
    // 10 records at offsets 0..9 and the commit marker at 10.
    // Apache Kafka writes the commit marker after the commit returns (the mock before): awaited.
    REQUIRE(wait_until([&] { return high_watermark(rk.get(), f.topic) == 11; }, std::chrono::seconds(30)));

    auto cfg = f.config();
    cfg.offsets_in_database = true;
    cfg.offsets_table = unique_name("offsets");
    cfg.lock_timeout = 300ms;
    auto handler = [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) { f.insert(tx, e, ctx); };
    {
        Consumer first(cfg, decode, event_id_of, handler);
        run_until(first, [&] { return f.rows() == 10 && stored_position(cfg.offsets_table, f.group) == 10; });
    }
    // The stored position is the marker's offset; Kafka's committed offset is
    // put back to 0, so the database's position is the one that counts.
    reset_group_offsets(f.group, f.topic, 1, 0);
    produce_transaction(rk.get(), f, 10); // offsets 11..20, marker at 21
    REQUIRE(wait_until([&] { return high_watermark(rk.get(), f.topic) == 22; }, std::chrono::seconds(30)));

    pqxx::connection locker(pg());
    pqxx::work lock_tx(locker);
    lock_tx.exec(fmt::format("SELECT 1 FROM {} WHERE consumer_group = '{}' FOR UPDATE", cfg.offsets_table, f.group));

    std::mutex mu;
    std::size_t unreadable = 0;
    cfg.log = [&](const LogRecord& r) {
        if (r.message.find("cannot read stored positions") != std::string::npos) {
            std::lock_guard<std::mutex> lock(mu);
            ++unreadable;
        }
    };
    Consumer second(cfg, decode, event_id_of, handler);
    Runner<Consumer> run(second);
    const bool waited = wait_until(
        [&] {
            std::lock_guard<std::mutex> lock(mu);
            return unreadable > 0;
        },
        60s);
    lock_tx.commit(); // the offset row can be read again
    REQUIRE(waited);

    const bool done =
        wait_until([&] { return f.rows() == 20 && stored_position(cfg.offsets_table, f.group) == 21; }, 60s);
    run.join();
    fail_if_threw(run.error());
    CAPTURE(f.rows(), stored_position(cfg.offsets_table, f.group));
    REQUIRE(done);
    f.check_exact(20);
}

#endif
