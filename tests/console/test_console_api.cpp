// The console's JSON API (idemkafka-admin serve) against PostgreSQL and the
// broker: the bearer token, dead letters grouped by cause with exact counts,
// records with and without payloads, lag per partition in records and
// seconds, the claims table's status, read-only refusal, a replay with its
// preview and audit, errors as JSON, the page's static files.

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "console_support.hpp"
#include "pg/connect.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// 12 x "provider 503" from `source`, 4 x decode errors from it, 1 without a source.
void publish_letters(const std::string& dlq, const std::string& source)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    auto letter = [&](int n, const std::string& reason, const std::string& error, bool with_source) {
        std::vector<Header> h = {{dead_letter_header::reason, reason},
                                 {dead_letter_header::error, error},
                                 {dead_letter_header::consumer_group, "billing"},
                                 {dead_letter_header::original_partition, "0"},
                                 {dead_letter_header::original_offset, std::to_string(n)}};
        if (with_source)
            h.push_back({dead_letter_header::original_topic, source});
        pub.publish(dlq, "k" + std::to_string(n), "secret-payload-" + std::to_string(n), h);
    };
    for (int i = 0; i < 12; ++i)
        letter(i, "handler_failed", "provider returned 503 for order " + std::to_string(100 + i), true);
    for (int i = 0; i < 4; ++i)
        letter(20 + i, "decode_error", "bad byte at " + std::to_string(i), true);
    letter(30, "decode_error", "orphan", false);
}

struct Api {
    httplib::Client client;
    std::string token;
    Api(int port, std::string t) : client("127.0.0.1", port), token(std::move(t)) { client.set_read_timeout(60, 0); }
    httplib::Headers auth() const { return {{"Authorization", "Bearer " + token}}; }
    std::pair<int, json> get(const std::string& path)
    {
        auto r = client.Get(path.c_str(), auth());
        REQUIRE(r);
        return {r->status, json::parse(r->body)};
    }
    std::pair<int, json> post(const std::string& path, const json& body)
    {
        auto r = client.Post(path.c_str(), auth(), body.dump(), "application/json");
        REQUIRE(r);
        return {r->status, json::parse(r->body)};
    }
};

} // namespace

TEST_CASE("console API: groups, records, lag, status, read-only, replay and audit", "[console][api]")
{
    const auto dlq = unique_name("con_dlq");
    const auto source = unique_name("con_src");
    const auto lagging = unique_name("con_lag");
    const auto group = unique_name("con_g");
    const auto audit = unique_name("con_audit");
    const auto claims = unique_name("pe_con");
    create_topic(dlq, 2);
    create_topic(source, 1);
    create_topic(lagging, 1);
    publish_letters(dlq, source);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 10; ++i)
            pub.publish(lagging, "k", "v" + std::to_string(i));
    }
    reset_group_offsets(group, lagging, 1, 4);
    auto conn = detail::pg::connect(pg());
    SchemaSpec spec;
    spec.claims_table = claims;
    spec.replay_audit_table = audit;
    (void)migrate_schema(*conn, spec);

    const std::vector<std::string> common = {"--brokers",   brokers(),    "--topic",
                                             dlq,           "--postgres", pg(),
                                             "--table",     claims,       "--replay-audit-table",
                                             audit,         "--group",    group,
                                             "--lag-topic", lagging,      "--token",
                                             "t0ken",       "--timeout",  "30s"};
    {
        ConsoleProcess console(common);
        CHECK(console.output().find("read-only") != std::string::npos);
        Api api(console.port(), "t0ken");
        // The token: missing or wrong is 401, and nothing else is said.
        {
            auto r = api.client.Get("/api/config");
            REQUIRE(r);
            CHECK(r->status == 401);
            api.token = "wrong";
            CHECK(api.get("/api/config").first == 401);
            api.token = "t0ken";
        }
        auto [st, config] = api.get("/api/config");
        CHECK(st == 200);
        CHECK(config["allow_replay"] == false);
        CHECK(config["dead_letter_topic"] == dlq);

        auto [gs_status, gs] = api.get("/api/dead-letters/groups");
        REQUIRE(gs_status == 200);
        CHECK(gs["read"] == 17);
        REQUIRE(gs["groups"].size() == 3);
        CHECK(gs["groups"][0]["count"] == 12);
        CHECK(gs["groups"][0]["error_pattern"] == "provider returned <n> for order <n>");
        CHECK(gs["groups"][0]["sources"][0]["topic"] == source);
        CHECK(gs["groups"][1]["count"] == 4);
        CHECK(gs["groups"][2]["count"] == 1);
        const std::string cause = gs["groups"][0]["id"];

        // Drill-down: no payload unless asked for.
        auto [rs_status, rs] = api.get("/api/dead-letters/records?limit=5&cause=" + cause);
        CHECK(rs_status == 200);
        CHECK(rs["matched"] == 12);
        REQUIRE(rs["records"].size() == 5);
        CHECK_FALSE(rs["records"][0].contains("value"));
        CHECK(rs.dump().find("secret-payload") == std::string::npos);
        auto [rp_status, rp] = api.get("/api/dead-letters/records?cause=" + cause + "&payload=1");
        CHECK(rp["records"].size() == 12);
        CHECK(rp["records"][0]["value"].get<std::string>().rfind("secret-payload-", 0) == 0);
        CHECK(api.get("/api/dead-letters/records").first == 400);

        // Lag of the group: committed 4 of 10, six records and some seconds behind.
        auto [lag_status, lag] = api.get("/api/lag");
        REQUIRE(lag_status == 200);
        REQUIRE(lag["partitions"].size() == 1);
        CHECK(lag["partitions"][0]["group"] == group);
        CHECK(lag["partitions"][0]["committed"] == 4);
        CHECK(lag["partitions"][0]["log_end"] == 10);
        CHECK(lag["partitions"][0]["records_behind"] == 6);
        REQUIRE(lag["partitions"][0]["seconds_behind"].is_number());
        CHECK(lag["partitions"][0]["seconds_behind"].get<double>() >= 0);

        auto [status_code, status] = api.get("/api/status");
        CHECK(status_code == 200);
        CHECK(status["exists"] == true);
        CHECK(status["schema_ok"] == true);

        // Read-only: a preview works, a replay is refused; nothing published or recorded.
        auto [pv_status, preview] =
            api.post("/api/replay", {{"cause", cause}, {"dry_run", true}, {"requested_by", "bob"}});
        CHECK(pv_status == 200);
        CHECK(preview["matched"] == 12);
        CHECK(preview["audit_id"] == 0);
        auto [ro_status, ro] = api.post("/api/replay", {{"cause", cause}, {"dry_run", false}, {"requested_by", "bob"}});
        CHECK(ro_status == 403);
        CHECK(ro["error"].get<std::string>().find("read-only") != std::string::npos);
        CHECK(api.post("/api/replay", {{"cause", cause}, {"dry_run", true}}).first == 400);        // who asks?
        CHECK(api.post("/api/replay", {{"dry_run", true}, {"requested_by", "bob"}}).first == 400); // no filter
        CHECK(api.get("/api/replays").second["replays"].empty());

        // The page's files.
        auto page = api.client.Get("/");
        REQUIRE(page);
        CHECK(page->body.find("idemkafka console") != std::string::npos);
        auto js = api.client.Get("/console.js");
        REQUIRE(js);
        CHECK(js->status == 200);
    }
    {
        auto args = common;
        args.push_back("--allow-replay");
        ConsoleProcess console(args);
        Api api(console.port(), "t0ken");
        const std::string cause = api.get("/api/dead-letters/groups").second["groups"][0]["id"];
        auto [st, done] =
            api.post("/api/replay", {{"cause", cause}, {"dry_run", false}, {"requested_by", "bob"}, {"rate", 100}});
        REQUIRE(st == 200);
        CHECK(done["published"] == 12);
        CHECK(done["audit_id"].get<int>() > 0);
        auto [again_status, again] =
            api.post("/api/replay", {{"cause", cause}, {"dry_run", false}, {"requested_by", "bob"}});
        CHECK(again["published"] == 0);
        CHECK(again["replayed_before"] == 12);
        // A target topic the records did not come from: refused, as a client error.
        auto [tt_status, tt] = api.post(
            "/api/replay", {{"cause", cause}, {"dry_run", false}, {"requested_by", "bob"}, {"target_topic", dlq}});
        CHECK(tt_status == 400);
        CHECK(tt["error"].get<std::string>().find("replay refused") != std::string::npos);
        auto [au_status, au] = api.get("/api/replays");
        REQUIRE(au["replays"].size() == 2);
        CHECK(au["replays"][1]["published"] == 12);
        CHECK(au["replays"][1]["requested_by"] == "bob");
        CHECK(au["replays"][1]["tool"].get<std::string>().find("idemkafka-admin serve") == 0);
        CHECK(au["replays"][1]["records"].size() == 12);
        CHECK(au["replays"][0]["skipped"] == 12);
    }
    // Errors are answered, not swallowed: a dead-letter topic that does not exist.
    {
        auto args = common;
        args[3] = unique_name("no_such_dlq");
        ConsoleProcess console(args);
        Api api(console.port(), "t0ken");
        auto [st, body] = api.get("/api/dead-letters/groups");
        CHECK(st == 500);
        CHECK(body["error"].get<std::string>().find("does not exist") != std::string::npos);
        CHECK(console.errors().find("does not exist") != std::string::npos);
    }
    // The same lag in `status`: the groups with claims, records and seconds behind.
    exec(fmt::format("INSERT INTO public.{} (event_id, consumer_group, processed_at) VALUES ('{}', '{}', now())",
                     claims, new_event_id().to_string(), group));
    const auto st = admin(
        {"status", "--postgres", pg(), "--table", claims, "--brokers", brokers(), "--lag-topic", lagging, "--json"});
    CAPTURE(st.out, st.err);
    REQUIRE(st.rc == 0);
    const auto status = json::parse(st.out);
    REQUIRE(status["lag"].size() == 1);
    CHECK(status["lag"][0]["group"] == group);
    CHECK(status["lag"][0]["records_behind"] == 6);
    CHECK(status["lag"][0]["seconds_behind"].is_number());
    const auto text =
        admin({"status", "--postgres", pg(), "--table", claims, "--brokers", brokers(), "--lag-topic", lagging});
    CAPTURE(text.out, text.err);
    CHECK(text.out.find("lag per partition") != std::string::npos);
    exec("DROP TABLE IF EXISTS public." + audit + ", public." + claims + " CASCADE");
}

// Not run by CTest ([.]): how long the console takes to group a few thousand dead
// letters, through the API and (with the page) in Chromium. Run by hand:
//   run_isolated.sh ... -- idemkafka_console_api_tests "[measure]"
TEST_CASE("console: grouping 3,000 dead letters, timed", "[.][measure]")
{
    const auto dlq = unique_name("con_many");
    const auto source = unique_name("con_many_src");
    create_topic(dlq, 3);
    create_topic(source, 6);
    {
        Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
        for (int i = 0; i < 3000; ++i) {
            const bool decode = i % 300 == 7; // 10 of them
            std::vector<Header> h = {{dead_letter_header::reason, decode ? "decode_error" : "handler_failed"},
                                     {dead_letter_header::error,
                                      decode ? fmt::format("unexpected byte 0x{:02x} at offset {}", i % 256, i)
                                             : fmt::format("payment provider returned 503 for order {} (request '{}')",
                                                           100000 + i, new_event_id().to_string())},
                                     {dead_letter_header::consumer_group, "billing"},
                                     {dead_letter_header::original_topic, source},
                                     {dead_letter_header::original_partition, std::to_string(i % 6)},
                                     {dead_letter_header::original_offset, std::to_string(i / 6)},
                                     {dead_letter_header::event_id, new_event_id().to_string()}};
            pub.publish_async(dlq, "k" + std::to_string(i), std::string(400, 'x'), h);
        }
        pub.flush();
    }
    auto conn = detail::pg::connect(pg());
    SchemaSpec spec;
    spec.claims_table = unique_name("pe_many");
    spec.replay_audit_table = unique_name("many_audit");
    (void)migrate_schema(*conn, spec);
    ConsoleProcess console({"--brokers", brokers(), "--topic", dlq, "--postgres", pg(), "--table", spec.claims_table,
                            "--replay-audit-table", *spec.replay_audit_table});
    httplib::Client client("127.0.0.1", console.port());
    client.set_read_timeout(60, 0);
    for (int round = 0; round < 3; ++round) {
        const auto start = std::chrono::steady_clock::now();
        auto r = client.Get("/api/dead-letters/groups");
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        REQUIRE(r);
        const auto j = json::parse(r->body);
        CHECK(j["read"] == 3000);
        std::string groups;
        for (const auto& g : j["groups"])
            groups +=
                fmt::format("\n  {:>5} x {} / {}: {}", g["count"].get<int>(), g["consumer_group"].get<std::string>(),
                            g["reason"].get<std::string>(), g["error_pattern"].get<std::string>());
        WARN(fmt::format("round {}: GET /api/dead-letters/groups in {} ms (read {} ms, {} bytes):{}", round, ms,
                         j["read_ms"].get<int>(), r->body.size(), groups));
    }
    if (const char* modules = std::getenv("IDEMKAFKA_PLAYWRIGHT_MODULES")) {
        const std::string script =
            "const "
            "{chromium}=require(require('path').join(process.env.IDEMKAFKA_PLAYWRIGHT_MODULES,'playwright-core'));"
            "(async()=>{const fs=require('fs'),os=require('os');const d=fs.mkdtempSync(os.tmpdir()+'/ikm-');"
            "const c=await chromium.launchPersistentContext(d,{executablePath:'/usr/bin/chromium',headless:true,"
            "args:['--headless','--no-sandbox','--disable-gpu','--disable-quic','--no-first-run',"
            "'--disable-background-networking','--disable-component-update','--disable-sync']});"
            "const p=c.pages()[0]||await c.newPage();for(let i=0;i<3;i++){const t=Date.now();"
            "await p.goto(process.argv[1]);await p.waitForSelector('body[data-loaded=\"true\"]',{timeout:60000});"
            "const rows=await p.$$eval('#causes tbody tr',r=>r.map(x=>x.cells[0].textContent+' x "
            "'+x.cells[2].textContent));"
            "console.log('page load '+i+': '+(Date.now()-t)+' ms, causes: '+rows.join(', '));}"
            "await "
            "c.close();fs.rmSync(d,{recursive:true,force:true});})().catch(e=>{console.error(e);process.exit(1);});";
        const auto r = run_shell("IDEMKAFKA_PLAYWRIGHT_MODULES=" + shell_quote(modules) + " node -e " +
                                 shell_quote(script) + " " + shell_quote(console.url()));
        WARN(r.out + r.err);
        CHECK(r.rc == 0);
    }
    exec("DROP TABLE IF EXISTS public." + *spec.replay_audit_table + ", public." + spec.claims_table + " CASCADE");
}
