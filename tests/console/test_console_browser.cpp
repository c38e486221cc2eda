// The console in a real browser: a consumer dead-letters a known mix of records
// (40 charges the payment provider refuses, 6 records that do not decode) and
// charges 20; the console serves them; Debian's Chromium, driven headless by
// playwright-core (browser_test.cjs), checks the causes and counts on the page,
// previews and runs the replay of the provider's cause once the provider is back,
// and checks the audit row. Then the consumer has charged exactly those 40
// records, each once, the decode errors stay dead letters, and the audit holds
// the replay. The screenshot is console.png in the test's output directory.

#include <atomic>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <idemkafka/consumer.hpp>
#include <idemkafka/error.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>

#include "admin_runner.hpp"
#include "catch_compat.hpp"
#include "console_support.hpp"
#include "pg/connect.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;
using Consumer = IdempotentConsumer<TestEvent>;

namespace {

// 20 charges that go through, 40 the provider refuses while it is down, 6 that do not decode.
void publish_mix(const std::string& topic)
{
    Publisher pub(PublisherConfig{brokers(), {}, log_sink()});
    for (int i = 0; i < 20; ++i)
        pub.publish(topic, "ok" + std::to_string(i), encode({new_event_id(), "ok-" + std::to_string(i), i}));
    for (int i = 0; i < 40; ++i)
        pub.publish(topic, "down" + std::to_string(i), encode({new_event_id(), "down-" + std::to_string(i), 1000 + i}));
    for (int i = 0; i < 6; ++i)
        pub.publish(topic, "bad" + std::to_string(i), "not an event " + std::to_string(i));
}

// The browser's run: the node_modules of scripts/playwright.sh, then node.
Result run_browser(const std::string& url, const std::string& out_dir, const nlohmann::json& expected)
{
    const auto modules = run_shell("bash " + shell_quote(IDEMKAFKA_SOURCE_DIR "/scripts/playwright.sh"));
    INFO("scripts/playwright.sh: " << modules.err);
    REQUIRE(modules.rc == 0);
    const std::string dir = modules.out.substr(0, modules.out.find_last_not_of("\n") + 1);
    return run_shell("IDEMKAFKA_PLAYWRIGHT_MODULES=" + shell_quote(dir) + " timeout 120 node " +
                     shell_quote(IDEMKAFKA_SOURCE_DIR "/tests/console/browser_test.cjs") + " " + shell_quote(url) +
                     " " + shell_quote(out_dir) + " " + shell_quote(expected.dump()));
}

} // namespace

TEST_CASE("console in Chromium: causes, preview, replay of one cause, charged once, audited", "[console][browser]")
{
    const auto topic = unique_name("cb_src");
    const auto group = unique_name("cb_g");
    const auto charges = unique_name("cb_charges");
    create_topic(topic, 2);
    create_topic(group + ".dlq", 2);
    exec(fmt::format("CREATE TABLE {} (event_id uuid NOT NULL, entity text NOT NULL)", charges));
    publish_mix(topic);

    auto cfg = consumer_config(group, topic);
    std::atomic<bool> provider_up{false};
    Consumer consumer(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context&) {
        if (e.entity.rfind("down-", 0) == 0 && !provider_up)
            throw NonRetryableError(fmt::format("payment provider returned 503 for order {}", e.amount));
        tx.exec(fmt::format("INSERT INTO {} VALUES ('{}', '{}')", charges, e.id.to_string(), e.entity));
    });
    Runner<Consumer> run(consumer);
    REQUIRE(wait_until(
        [&] {
            const auto s = consumer.metrics().snapshot();
            return s.claimed >= 20 && s.dead_lettered_total() >= 46;
        },
        60s));
    CHECK(scalar("SELECT count(*) FROM " + charges) == 20);

    auto conn = detail::pg::connect(pg());
    SchemaSpec spec = SchemaSpec::of(cfg);
    spec.replay_audit_table = "dead_letter_replay";
    (void)migrate_schema(*conn, spec);
    ConsoleProcess console({"--brokers", brokers(), "--topic", group + ".dlq", "--postgres", pg(), "--table", cfg.table,
                            "--group", group, "--lag-topic", topic, "--allow-replay"});

    provider_up = true; // the provider is back: its cause can be replayed
    const std::string out_dir = IDEMKAFKA_CONSOLE_TEST_OUTPUT;
    std::filesystem::create_directories(out_dir);
    std::filesystem::remove(out_dir + "/console.png");
    const nlohmann::json expected = {
        {"causes", {{{"reason", "non_retryable"}, {"count", 40}}, {{"reason", "decode_error"}, {"count", 6}}}},
        {"replay_reason", "non_retryable"},
        {"requested_by", "browser-test"}};
    const auto browser = run_browser(console.url(), out_dir, expected);
    INFO("browser stdout: " << browser.out << "\nbrowser stderr: " << browser.err
                            << "\nconsole stderr: " << console.errors());
    REQUIRE(browser.rc == 0);
    const auto seen = nlohmann::json::parse(browser.out);
    CHECK(seen["replay"]["count"] == 40);
    CHECK(std::filesystem::file_size(out_dir + "/console.png") > 10000);

    // The consumer charges exactly the replayed 40, each once; the rest is as it was.
    REQUIRE(wait_until([&] { return scalar("SELECT count(*) FROM " + charges) >= 60; }, 60s));
    CHECK(wait_until([&] { return consumer.metrics().snapshot().claimed >= 60; }, 30s));
    CHECK(scalar("SELECT count(*) FROM " + charges) == 60);
    CHECK(scalar("SELECT count(DISTINCT event_id) FROM " + charges) == 60);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE entity LIKE 'down-%'", charges)) == 40);
    const auto m = consumer.metrics().snapshot();
    CHECK(m.claimed == 60);
    CHECK(m.dead_lettered_total() == 46); // nothing dead-lettered again
    CHECK(scalar("SELECT count(*) FROM public.dead_letter_replay") == 1);
    CHECK(scalar("SELECT published FROM public.dead_letter_replay WHERE requested_by = 'browser-test'") == 40);
    CHECK(scalar("SELECT count(*) FROM public.dead_letter_replay r, jsonb_array_elements(r.records) x "
                 "WHERE x->>'outcome' = 'published' AND x->>'reason' = 'non_retryable'") == 40);
    run.join();
    exec("DROP TABLE IF EXISTS " + charges + ", public.dead_letter_replay");
}
