#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <idemkafka/log.hpp>
#include <idemkafka/redact.hpp>

#include "catch_compat.hpp"
#include "observe/log_context.hpp"

using namespace idemkafka;

namespace {

bool has(std::string_view text, std::string_view part)
{
    return text.find(part) != std::string_view::npos;
}

LogRecord sample()
{
    return LogRecord{LogLevel::error,
                     "handler failed on orders/3@42: boom",
                     {{log_field::component, "consumer"},
                      {log_field::group, "billing"},
                      {log_field::topic, "orders"},
                      {log_field::partition, "3"},
                      {log_field::offset, "42"},
                      {log_field::error, "card declined: \"insufficient\" funds"}}};
}

} // namespace

TEST_CASE("is_secret_setting knows libpq and librdkafka secrets", "[unit][log]")
{
    for (const char* key : {"password", "PASSWORD", "sslpassword", "sasl.password", "ssl.key.password",
                            "ssl.keystore.password", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config",
                            "sasl.jaas.config", "ssl.key.pem", "ssl.keystore.location"})
        CHECK(is_secret_setting(key));
    for (const char* key : {"host", "user", "sasl.username", "sasl.mechanisms", "security.protocol", "ssl.ca.location",
                            "session.timeout.ms", "passive"})
        CHECK_FALSE(is_secret_setting(key));
}

TEST_CASE("redact masks password-looking values and leaves other text alone", "[unit][log]")
{
    CHECK(redact("host=db port=5432 user=app password=Sup3rS3cret dbname=x") ==
          "host=db port=5432 user=app password=*** dbname=x");
    CHECK(redact("host=db password = 'a b\\'c' dbname=x") == "host=db password = *** dbname=x");
    CHECK(redact("PassWord=Sup3rS3cret") == "PassWord=***");
    CHECK(redact("postgresql://app:Sup3rS3cret@db:5432/x?sslmode=disable") ==
          "postgresql://app:***@db:5432/x?sslmode=disable");
    CHECK(redact("postgresql://app@db/x?password=Sup3rS3cret&connect_timeout=3") ==
          "postgresql://app@db/x?password=***&connect_timeout=3");
    CHECK(redact("sasl.password=TopSecret-77 sasl.username=bob") == "sasl.password=*** sasl.username=bob");
    CHECK(redact("kafka[\"ssl.key.password\"]=TopSecret-77 refused") == "kafka[\"ssl.key.password\"]=*** refused");
    CHECK(redact("sasl.oauthbearer.client.secret=abcdef") == "sasl.oauthbearer.client.secret=***");
    CHECK_FALSE(has(redact("sasl.jaas.config=org.apache.PlainLoginModule required username=\"bob\" "
                           "password=\"TopSecret-77\";"),
                    "TopSecret"));
    // Nothing to mask: the text comes back as it was.
    const std::string plain = "offset commit failed for orders/3@42: Broker: Not coordinator (password not needed)";
    CHECK(redact(plain) == plain);
    CHECK(redact("") == "");
    CHECK(redact("password=") == "password=");
}

TEST_CASE("redact_conninfo masks the password of both connection string forms", "[unit][log]")
{
    CHECK(redact_conninfo("host=/tmp dbname=x user=bob password=Sup3rS3cret") ==
          "host=/tmp dbname=x user=bob password=***");
    CHECK(redact_conninfo("host=/tmp password='Sup3r S3cret' user=bob") == "host=/tmp password=*** user=bob");
    CHECK(redact_conninfo("postgresql://bob:Sup3r%40S3cret@127.0.0.1:5432/x") ==
          "postgresql://bob:***@127.0.0.1:5432/x");
    CHECK(redact_conninfo("postgresql:///x?host=/tmp") == "postgresql:///x?host=/tmp");
    CHECK(redact_conninfo("dbname=x") == "dbname=x");
}

TEST_CASE("Redactor masks remembered secrets wherever they are quoted", "[unit][log]")
{
    Redactor r;
    r.add_conninfo("postgresql://bob:Sup3r%zzS3cret@127.0.0.1:1/x");
    r.add_conninfo("host=x password='quoted Secret' user=bob");
    r.add_setting("sasl.password", "TopSecret-77");
    r.add_setting("sasl.username", "bob-the-user");
    r.add_secret("abc"); // too short to mask everywhere

    // libpq quotes a URI password it cannot decode without its key.
    const auto libpq = r("invalid percent-encoded token: \"Sup3r%zzS3cret\"");
    CHECK(libpq == "invalid percent-encoded token: \"***\"");
    CHECK(r("SASL authentication for TopSecret-77 failed") == "SASL authentication for *** failed");
    CHECK(r("unterminated 'quoted Secret") == "unterminated '***");
    CHECK(r("user bob-the-user, abc") == "user bob-the-user, abc");
    CHECK(r.needed("TopSecret-77"));
    CHECK_FALSE(r.needed("nothing here"));
    CHECK_FALSE(r.empty());
    CHECK(Redactor().empty());
}

TEST_CASE("format_text and format_json render level, message and fields", "[unit][log]")
{
    const auto r = sample();
    CHECK(format_text(r) == "handler failed on orders/3@42: boom component=consumer group=billing topic=orders "
                            "partition=3 offset=42 error=\"card declined: \\\"insufficient\\\" funds\"");
    CHECK(format_text(LogRecord{LogLevel::info, "line\n", {{"empty", ""}, {"eq", "a=b"}}}) ==
          "line empty=\"\" eq=\"a=b\"");
    CHECK(format_json(r) == "{\"level\":\"error\",\"message\":\"handler failed on orders/3@42: boom\","
                            "\"component\":\"consumer\",\"group\":\"billing\",\"topic\":\"orders\",\"partition\":\"3\","
                            "\"offset\":\"42\",\"error\":\"card declined: \\\"insufficient\\\" funds\"}");
    CHECK(format_json(LogRecord{LogLevel::debug, "a\tb\x01\xff", {{"level", "x"}}}) ==
          "{\"level\":\"debug\",\"message\":\"a\\tb\\u0001\\u00ff\",\"field.level\":\"x\"}");
    CHECK(r.field(log_field::topic) == std::string_view("orders"));
    CHECK_FALSE(r.field("missing"));
}

TEST_CASE("a LogSink takes record callables and (level, message) callables", "[unit][log]")
{
    std::vector<LogRecord> records;
    LogSink structured = [&](const LogRecord& r) { records.push_back(r); };
    structured(sample());
    structured(LogLevel::warning, "plain line");
    REQUIRE(records.size() == 2);
    CHECK(records[0].field(log_field::group) == std::string_view("billing"));
    CHECK(records[1].level == LogLevel::warning);
    CHECK(records[1].message == "plain line");
    CHECK(records[1].fields.empty());

    // The callable form every sink had before structured fields: unchanged, it
    // gets the message.
    std::vector<std::pair<LogLevel, std::string>> lines;
    LogSink legacy = [&](LogLevel level, std::string_view message) { lines.emplace_back(level, message); };
    legacy(sample());
    legacy(LogLevel::info, "plain line");
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].first == LogLevel::error);
    CHECK(lines[0].second == "handler failed on orders/3@42: boom");
    CHECK(lines[1].second == "plain line");

    std::function<void(LogLevel, std::string_view)> fn = [&](LogLevel, std::string_view m) {
        lines.emplace_back(LogLevel::debug, m);
    };
    LogSink from_function = fn;
    from_function(LogLevel::info, "via std::function");
    CHECK(lines.back().second == "via std::function");
    // ... and a LogSink still converts back to that std::function.
    std::function<void(LogLevel, std::string_view)> back = legacy;
    back(LogLevel::info, "round trip");
    CHECK(lines.back().second == "round trip");

    CHECK_FALSE(LogSink());
    CHECK_FALSE(LogSink(nullptr));
    CHECK_FALSE(LogSink(std::function<void(LogLevel, std::string_view)>()));
    CHECK_FALSE(LogSink(static_cast<void (*)(const LogRecord&)>(nullptr)));
    LogSink empty;
    empty(LogLevel::error, "dropped"); // no-op, no throw
    CHECK(stderr_sink());
    CHECK(json_sink());
    CHECK((structured ? structured : stderr_sink()));
}

TEST_CASE("every record is redacted before it reaches the callable", "[unit][log]")
{
    std::vector<LogRecord> records;
    std::vector<std::string> lines;
    LogSink structured = [&](const LogRecord& r) { records.push_back(r); };
    LogSink legacy = [&](LogLevel, std::string_view m) { lines.emplace_back(m); };

    const LogRecord leaky{LogLevel::warning,
                          "PostgreSQL reconnect failed: host=db password=Sup3rS3cret",
                          {{log_field::error, "postgresql://bob:Sup3rS3cret@db/x"}}};
    structured(leaky);
    legacy(leaky);
    legacy(LogLevel::error, "sasl.password=Sup3rS3cret refused");
    REQUIRE(records.size() == 1);
    CHECK(records[0].message == "PostgreSQL reconnect failed: host=db password=***");
    CHECK(records[0].fields[0].value == "postgresql://bob:***@db/x");
    for (const auto& l : lines)
        CHECK_FALSE(has(l, "Sup3rS3cret"));
    CHECK(lines.size() == 2);
}

TEST_CASE("the library's context sink adds fields and masks known secrets", "[unit][log]")
{
    std::vector<LogRecord> records;
    LogSink inner = [&](const LogRecord& r) { records.push_back(r); };
    const auto sink = detail::with_context(inner, {{log_field::group, "billing"}},
                                           detail::secrets_of("postgresql://bob:Sup3r%zzS3cret@h/x"));
    detail::emit(sink, LogLevel::error, "invalid percent-encoded token: \"Sup3r%zzS3cret\"", "consumer",
                 {{log_field::error, "Sup3r%zzS3cret"}});
    detail::emit(sink, LogLevel::info, "rdkafka FAIL: down", "consumer",
                 {{log_field::component, "librdkafka"}, {log_field::group, "other"}});
    REQUIRE(records.size() == 2);
    CHECK(records[0].message == "invalid percent-encoded token: \"***\"");
    REQUIRE(records[0].fields.size() == 3);
    CHECK(records[0].fields[0].key == "component");
    CHECK(records[0].fields[0].value == "consumer");
    CHECK(records[0].fields[1].key == "group");
    CHECK(records[0].fields[2].value == "***");
    CHECK(records[1].field(log_field::component) == std::string_view("librdkafka"));
    CHECK(records[1].field(log_field::group) == std::string_view("other"));
    CHECK(records[1].fields.size() == 2);

    CHECK_FALSE(detail::with_context(LogSink(), {{log_field::group, "g"}}));
    // A throwing sink never escapes emit().
    detail::emit([](const LogRecord&) { throw std::runtime_error("sink down"); }, LogLevel::error, "x", "consumer");
}
