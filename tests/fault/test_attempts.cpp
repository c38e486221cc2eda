// A record's attempts survive what happens to the group: counted failures
// travel with the committed offset (its metadata), so a poison record is
// dead-lettered after max_attempts deliveries even when its member crashes
// before that many failures, again and again.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;

namespace {

constexpr int max_attempts = 5;

std::string env(const char* name)
{
    const char* v = std::getenv(name);
    REQUIRE(v != nullptr);
    return v;
}

ConsumerConfig attempts_config(const std::string& group, const std::string& topic)
{
    auto cfg = consumer_config(group, topic);
    cfg.max_attempts = max_attempts;
    cfg.retry_backoff = 200ms;
    cfg.retry_backoff_max = 200ms;
    return cfg;
}

// Lines of `path` that start with `word`.
int lines(const std::string& path, const std::string& word)
{
    std::ifstream in(path);
    int n = 0;
    for (std::string line; std::getline(in, line);)
        n += line.rfind(word, 0) == 0 ? 1 : 0;
    return n;
}

} // namespace

// Run by the next test in a child process, then killed with SIGKILL: the
// poison record always fails. Each failure is marked in a file first ("fail"),
// and so is the dead letter once the library logs it ("dead").
TEST_CASE("attempts child", "[.][attempts-child]")
{
    const auto poison = env("IK_ATT_POISON");
    const auto marks = env("IK_ATT_MARKS");
    const auto effects = env("IK_ATT_EFFECTS");
    auto cfg = attempts_config(env("IK_ATT_GROUP"), env("IK_ATT_TOPIC"));
    const LogSink shown = log_sink();
    cfg.log = [&](const LogRecord& r) {
        if (r.message.rfind("dead-lettered", 0) == 0)
            std::ofstream(marks, std::ios::app) << "dead\n";
        shown(r);
    };
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        detail::pg::exec_params(tx,
                                fmt::format("INSERT INTO {} (event_id, member, kafka_partition, "
                                            "kafka_offset) VALUES ($1::uuid, 'child', $2, $3)",
                                            effects),
                                e.id.to_string(), ctx.partition(), ctx.offset());
        if (e.id.to_string() == poison) {
            std::ofstream(marks, std::ios::app) << "fail " << ctx.attempt() << '\n';
            throw std::runtime_error("poison: always fails");
        }
    });
    c.run(); // until killed
}

TEST_CASE("a crash loop faster than max_attempts: the poison record is still dead-lettered after max_attempts",
          "[fault]")
{
    Fixture f(1);
    f.publish(40);
    const auto poison = f.events[20].id;
    const std::string marks = fmt::format("/tmp/{}.marks", f.effects);
    std::remove(marks.c_str());
    const std::vector<std::string> child_env{"IK_ATT_GROUP=" + f.group, "IK_ATT_TOPIC=" + f.topic,
                                             "IK_ATT_EFFECTS=" + f.effects, "IK_ATT_MARKS=" + marks,
                                             "IK_ATT_POISON=" + poison.to_string()};
    auto failed = [&] { return lines(marks, "fail"); };
    auto dead_lettered = [&] { return lines(marks, "dead") > 0; };
    int lives = 0;
    bool done = false;
    while (!done && lives < 6) {
        ++lives;
        const int before = failed();
        const pid_t pid = spawn_self("[attempts-child]", child_env);
        // Each life fails the poison record twice (fewer than max_attempts),
        // then crashes a moment later, before it could fail it more often.
        const bool failed_twice = wait_until([&] { return failed() >= before + 2 || dead_lettered(); }, 60s);
        std::this_thread::sleep_for(300ms);
        ::kill(pid, SIGKILL);
        int status = 0;
        ::waitpid(pid, &status, 0);
        REQUIRE(WIFSIGNALED(status));
        done = dead_lettered();
        INFO("life " << lives << ": " << failed() - before << " failures");
        REQUIRE((failed_twice || done));
    }
    const int failures = failed();
    fmt::print("crash loop: dead-lettered in life {} after {} failed calls (max_attempts {})\n", lives, failures,
               max_attempts);
    REQUIRE(done); // before: every life started counting at zero, and the record was never dead-lettered
    CHECK(lives <= 4);
    CHECK(read_topic(f.group + ".dlq", 1, 30s).size() == 1);
    // Up to two counts a crash may take with it before their commit.
    CHECK(failures <= max_attempts + 2 * (lives - 1));

    // A member that lives finishes the rest: every other record exactly once.
    Consumer c(attempts_config(f.group, f.topic), decode, event_id_of,
               [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                   f.insert(tx, e, ctx, "survivor");
                   if (e.id == poison)
                       throw std::runtime_error("poison: always fails");
               });
    run_until(c, [&] { return committed_offset(f.group, f.topic, 0) == 40; });
    f.check_exact(39);
    CHECK(scalar(fmt::format("SELECT count(*) FROM {} WHERE event_id = '{}'", f.effects, poison.to_string())) == 0);
    std::remove(marks.c_str());
}

// A record counts its max_attempts-th failure, its dead letter is refused, and
// its member stops before the dead letter gets through: the offset commit
// carries the count. The next member must not call the handler a further
// time (the attempt count would pass max_attempts), only send the dead letter.
TEST_CASE("a record that failed max_attempts times before a restart is dead-lettered without another handler call",
          "[fault][mock]")
{
    Fixture f(1);
    f.publish(10);
    const auto poison = f.events[4].id;
    // The dead-letter producer's first two tries are refused.
    mock_control("push-errors Produce MSG_SIZE_TOO_LARGE MSG_SIZE_TOO_LARGE");
    std::atomic<int> calls{0};
    std::atomic<bool> refused{false};
    std::atomic<bool> inherited{false};
    const LogSink shown = log_sink();
    auto cfg = attempts_config(f.group, f.topic);
    cfg.log = [&](const LogRecord& r) {
        if (r.message.find("not acknowledged") != std::string::npos)
            refused = true;
        if (r.message.find("failed before this assignment") != std::string::npos)
            inherited = true;
        shown(r);
    };
    const auto handler = [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        f.insert(tx, e, ctx);
        if (e.id == poison) {
            ++calls;
            throw std::runtime_error("poison: always fails");
        }
    };
    {
        Consumer c(cfg, decode, event_id_of, handler);
        run_until(c, [&] { return refused.load(); });
    }
    REQUIRE(calls == max_attempts);
    REQUIRE(committed_offset(f.group, f.topic, 0) == 4); // held at the poison record

    Consumer c(cfg, decode, event_id_of, handler);
    run_until(c, [&] { return committed_offset(f.group, f.topic, 0) == 10; });
    CHECK(inherited);
    CHECK(calls == max_attempts); // before: one call more, and a dead letter saying max_attempts + 1
    const auto dlq = read_topic(f.group + ".dlq", 1, 30s);
    REQUIRE(dlq.size() == 1);
    CHECK(dlq[0].header("idemkafka.attempts") == std::to_string(max_attempts));
    CHECK(dlq[0].header("idemkafka.reason") == "handler_failed");
    CHECK(dlq[0].header("idemkafka.original.offset") == "4");
    f.check_exact(9);
}
