// Dead letters as data against PostgreSQL and the broker: a known mix of dead
// letters grouped with exact counts, a replay of one cause with a dry run, a
// refused target topic, a rate limit, the audit row and its records, no second
// replay by accident, and a deliberate one with `again`.

#include <algorithm>
#include <future>
#include <map>

#include <nlohmann/json.hpp>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/dead_letter_triage.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>

#include "catch_compat.hpp"
#include "pg/connect.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

struct Mix {
    std::string dlq = unique_name("rp_dlq");
    std::string a = unique_name("rp_src_a");
    std::string b = unique_name("rp_src_b");
    std::map<std::string, std::string> value_of_key;
};

// 30 x "provider 503" from A, 5 x decode errors from A, 3 x "provider 503"
// from B (another group), 1 without a source topic.
Mix publish_mix()
{
    Mix m;
    create_topic(m.dlq, 2);
    create_topic(m.a, 3);
    create_topic(m.b, 1);
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    int n = 0;
    auto letter = [&](const std::string& group, const std::string& reason, const std::string& error,
                      const std::string& source) {
        const std::string key = "k" + std::to_string(n);
        const std::string value = encode({new_event_id(), "e" + std::to_string(n), n});
        m.value_of_key[key] = value;
        std::vector<Header> h = {{"trace-id", "t-" + key},
                                 {dead_letter_header::reason, reason},
                                 {dead_letter_header::error, error},
                                 {dead_letter_header::consumer_group, group},
                                 {dead_letter_header::original_partition, std::to_string(n % 3)},
                                 {dead_letter_header::original_offset, std::to_string(n)}};
        if (!source.empty())
            h.push_back({dead_letter_header::original_topic, source});
        pub.publish(m.dlq, key, value, h);
        ++n;
    };
    for (int i = 0; i < 30; ++i)
        letter("billing", "handler_failed", "payment provider returned 503 for order " + std::to_string(4000 + i), m.a);
    for (int i = 0; i < 5; ++i)
        letter("billing", "decode_error", "unexpected character 'x' at offset " + std::to_string(i), m.a);
    for (int i = 0; i < 3; ++i)
        letter("ledger", "handler_failed", "payment provider returned 503 for order " + std::to_string(i), m.b);
    letter("billing", "decode_error", "orphan", "");
    return m;
}

ReplayRequest request(const Mix& m, const std::string& audit_table)
{
    ReplayRequest r;
    r.source = {brokers(), m.dlq, {}, 30s};
    r.requested_by = "alice";
    r.tool = "test_replay";
    r.audit.table = audit_table;
    r.log = log_sink();
    return r;
}

// Every record of `topic` as of now (read to the end of each partition): exact counts, no waiting.
std::vector<DeadLetterRecord> all_of(const std::string& topic)
{
    std::vector<DeadLetterRecord> out;
    (void)read_dead_letters({brokers(), topic, {}, 30s}, [&](DeadLetterRecord&& d) {
        out.push_back(std::move(d));
        return true;
    });
    return out;
}

std::string cause_of(const std::vector<DeadLetterGroup>& gs, const std::string& group, const std::string& reason)
{
    for (const auto& g : gs)
        if (g.cause.consumer_group == group && g.cause.reason == reason)
            return g.id;
    FAIL("no group " << group << "/" << reason);
    return {};
}

} // namespace

TEST_CASE("replay: grouped by cause, replayed once with an audit, again only on purpose", "[integration][replay]")
{
    const Mix m = publish_mix();
    const std::string audit = unique_name("dlr_audit");
    auto conn = detail::pg::connect(pg());

    // Without the audit table a replay is refused, naming how to create it.
    {
        auto r = request(m, audit);
        r.dry_run = true;
        try {
            (void)replay_dead_letters(*conn, r);
            FAIL("replay without an audit table");
        } catch (const DatabaseError& e) {
            CHECK(std::string(e.what()).find("idemkafka-admin migrate --replay-audit") != std::string::npos);
        }
    }
    SchemaSpec spec;
    spec.claims_table = unique_name("pe_rp");
    spec.replay_audit_table = audit;
    const auto migrated = migrate_schema(*conn, spec);
    CHECK(migrated.replay_audit_created);
    for (const auto& c : check_schema(*conn, spec))
        CHECK(c.problems.empty());

    DeadLetterGrouping grouping;
    const auto read = read_dead_letters({brokers(), m.dlq, {}, 30s}, [&](DeadLetterRecord&& d) {
        grouping.add(d);
        return true;
    });
    CHECK(read == 39);
    const auto gs = grouping.groups();
    REQUIRE(gs.size() == 4);
    CHECK(gs[0].count == 30);
    CHECK(gs[0].cause.error_pattern == "payment provider returned <n> for order <n>");
    CHECK(gs[0].sources.at(m.a) == std::set<std::int32_t>{0, 1, 2});
    CHECK(gs[1].count == 5);
    CHECK(gs[1].cause.error_pattern == "unexpected character '?' at offset <n>");
    CHECK(gs[2].count == 3);
    CHECK(gs[3].count == 1);
    const std::string provider_a = cause_of(gs, "billing", "handler_failed");

    // A dry run: the plan, nothing published, nothing recorded.
    auto r = request(m, audit);
    r.filter.causes = {provider_a};
    r.dry_run = true;
    auto plan = replay_dead_letters(*conn, r);
    CHECK(plan.matched == 30);
    CHECK(plan.audit_id == 0);
    CHECK(std::count_if(plan.records.begin(), plan.records.end(),
                        [](const ReplayedRecord& x) { return x.outcome == "would_publish"; }) == 30);
    CHECK(replay_audit(*conn, r.audit).empty());

    // The wrong target topic refuses the whole replay.
    r.dry_run = false;
    r.target_topic = m.b;
    CHECK_THROWS_AS(replay_dead_letters(*conn, r), ConfigError);
    CHECK(replay_audit(*conn, r.audit).empty());
    CHECK(all_of(m.a).empty());

    // The replay, at 50 records a second: chunks of 10 at 0, 0.2 and 0.4 s.
    r.target_topic = m.a;
    r.rate_per_second = 50;
    const auto started = std::chrono::steady_clock::now();
    const auto done = replay_dead_letters(*conn, r);
    CHECK(std::chrono::steady_clock::now() - started >= 390ms);
    CHECK(done.published == 30);
    CHECK(done.failed == 0);
    CHECK(done.audit_id > 0);
    const auto back = all_of(m.a);
    REQUIRE(back.size() == 30);
    for (const auto& rec : back) {
        CHECK(rec.value == m.value_of_key.at(*rec.key)); // the event id is in the value, unchanged
        CHECK(rec.header("trace-id") == "t-" + *rec.key);
        for (const auto& h : rec.headers)
            CHECK(h.name.rfind(dead_letter_header::prefix, 0) != 0);
    }
    auto entries = replay_audit(*conn, r.audit);
    REQUIRE(entries.size() == 1);
    CHECK(entries[0].id == done.audit_id);
    CHECK(entries[0].requested_by == "alice");
    CHECK(entries[0].tool == "test_replay");
    CHECK(entries[0].matched == 30);
    CHECK(entries[0].published == 30);
    CHECK(entries[0].outcome == "done");
    CHECK(entries[0].finished_ms.has_value());
    CHECK(entries[0].rate_per_second == 50);
    CHECK(nlohmann::json::parse(entries[0].filter_json)["causes"][0] == provider_a);
    const auto recs = nlohmann::json::parse(entries[0].records_json);
    REQUIRE(recs.size() == 30);
    for (const auto& x : recs)
        CHECK(x["outcome"] == "published");

    // The same request again: every record was replayed before, nothing is published.
    r.rate_per_second = 0;
    const auto twice = replay_dead_letters(*conn, r);
    CHECK(twice.matched == 30);
    CHECK(twice.replayed_before == 30);
    CHECK(twice.published == 0);
    CHECK(all_of(m.a).size() == 30);

    // On purpose: two explicit records with `again`.
    r.again = true;
    r.filter.coordinates = {{done.records[0].partition, done.records[0].offset},
                            {done.records[1].partition, done.records[1].offset}};
    const auto deliberate = replay_dead_letters(*conn, r);
    CHECK(deliberate.matched == 2);
    CHECK(deliberate.published == 2);
    CHECK(all_of(m.a).size() == 32);
    entries = replay_audit(*conn, r.audit, m.dlq);
    REQUIRE(entries.size() == 3);
    CHECK(entries[0].again);
    CHECK(entries[0].published == 2);
    CHECK(entries[1].skipped == 30);
    CHECK(entries[1].published == 0);

    // Records without a source are skipped, never published anywhere.
    auto orphan = request(m, audit);
    orphan.filter.reasons = {"decode_error"};
    orphan.filter.consumer_groups = {"billing"};
    const auto o = replay_dead_letters(*conn, orphan);
    CHECK(o.matched == 6);
    CHECK(o.no_source == 1);
    CHECK(o.published == 5);
    CHECK(all_of(m.a).size() == 37);
    CHECK(all_of(m.b).empty());
    exec("DROP TABLE IF EXISTS public." + audit + ", public." + spec.claims_table + " CASCADE");
}

// Replays of one dead-letter topic take turns on a lock while they record
// their plan. One stopped there (a frozen process, a paused VM) would keep
// every other out, the console's included, for as long as it stays stopped:
// another waits at most lock_timeout and fails saying why, and the stopped
// one's session is ended once it has sat that long in its transaction.
TEST_CASE("replay: a replay waits at most lock_timeout for another one's plan", "[integration][replay]")
{
    const Mix m = publish_mix();
    const std::string audit = unique_name("rp_audit_lock");
    auto conn = detail::pg::connect(pg());
    {
        SchemaSpec spec;
        spec.claims_table = unique_name("rp_claims_lock");
        spec.replay_audit_table = audit;
        migrate_schema(*conn, spec);
    }
    // Held here, as a replay stopped while recording its plan would hold it.
    auto holder = detail::pg::connect(pg());
    pqxx::work held(*holder);
    held.exec("SELECT pg_advisory_xact_lock(hashtext('idemkafka.replay:' || " + held.quote(m.dlq) + "))");

    auto r = request(m, audit);
    r.lock_timeout = 1s;
    auto run = std::async(std::launch::async, [&] {
        try {
            (void)replay_dead_letters(*conn, r);
            return std::string("replayed");
        } catch (const DatabaseError& e) {
            return std::string(e.what());
        }
    });
    const bool ended = run.wait_for(20s) == std::future_status::ready;
    held.commit(); // lets a replay that waits on go on, so that the test ends either way
    const std::string outcome = run.get();
    CHECK(ended);
    CHECK(outcome.find("another replay") != std::string::npos);
    CHECK(outcome.find(m.dlq) != std::string::npos);
    // Nothing was recorded: it can run again at once.
    CHECK(replay_audit(*conn, r.audit).empty());
    const auto done = replay_dead_letters(*conn, r);
    CHECK(done.published == 38);
}
