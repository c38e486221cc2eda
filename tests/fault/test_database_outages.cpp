// PostgreSQL as it really fails, on a server of the test's own: frozen (every
// server process SIGSTOPped: its kernel still accepts and acknowledges, so no
// keepalive notices) and vanished (its packets dropped by an nftables rule on
// loopback). The consumers' own steps are bounded by db_timeout, stop() is
// bounded while the server is frozen, and the counts are exact afterwards.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include <idemkafka/consumer.hpp>

#include "catch_compat.hpp"
#include "effects_fixture.hpp"
#include "test_env.hpp"

using namespace idemkafka;
using namespace idemkafka::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t)
{
    return std::chrono::duration<double>(Clock::now() - t).count();
}

// The test server's postmaster and its children.
std::vector<pid_t> server_pids()
{
    const auto data = [] {
        pqxx::connection c(pg());
        pqxx::nontransaction tx(c);
        return tx.exec("SELECT current_setting('data_directory')")[0][0].as<std::string>();
    }();
    std::ifstream pidfile(data + "/postmaster.pid");
    pid_t postmaster = 0;
    pidfile >> postmaster;
    REQUIRE(postmaster > 0);
    std::vector<pid_t> pids{postmaster};
    DIR* proc = ::opendir("/proc");
    REQUIRE(proc != nullptr);
    while (const dirent* e = ::readdir(proc)) {
        const pid_t pid = std::atoi(e->d_name);
        if (pid <= 0)
            continue;
        std::ifstream stat(fmt::format("/proc/{}/stat", pid));
        std::string line;
        std::getline(stat, line);
        // pid (comm) state ppid ...: comm may hold spaces, so read after the last ')'.
        const auto close = line.rfind(')');
        if (close == std::string::npos)
            continue;
        char state = 0;
        pid_t ppid = 0;
        if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == postmaster)
            pids.push_back(pid);
    }
    ::closedir(proc);
    return pids;
}

// Every process of the test server stopped until thaw() (or destruction).
class Freeze {
public:
    Freeze() : pids_(server_pids())
    {
        for (const pid_t pid : pids_) // the postmaster first: it forks no more
            ::kill(pid, SIGSTOP);
    }
    ~Freeze() { thaw(); }
    void thaw()
    {
        for (const pid_t pid : pids_)
            ::kill(pid, SIGCONT);
        pids_.clear();
    }

private:
    std::vector<pid_t> pids_;
};

int server_port()
{
    pqxx::connection c(pg());
    pqxx::nontransaction tx(c);
    return tx.exec("SELECT current_setting('port')::int")[0][0].as<int>();
}

// Every packet to or from the test server's TCP port dropped (both ways, on
// loopback), until lifted: a host gone, a network partition.
class Blackhole {
public:
    explicit Blackhole(int port) : table_(fmt::format("idemkafka_blackhole_{}", port))
    {
        const auto rules = fmt::format("nft add table inet {0} && "
                                       "nft add chain inet {0} out '{{ type filter hook output priority 0 ; }}' && "
                                       "nft add rule inet {0} out tcp dport {1} drop && "
                                       "nft add rule inet {0} out tcp sport {1} drop",
                                       table_, port);
        REQUIRE(std::system(rules.c_str()) == 0);
        active_ = true;
    }
    ~Blackhole() { lift(); }
    void lift()
    {
        if (active_)
            std::system(fmt::format("nft delete table inet {}", table_).c_str());
        active_ = false;
    }

private:
    std::string table_;
    bool active_ = false;
};

// Bounds for these tests: short, so that an outage is noticed in seconds.
ConsumerConfig outage_config(const Fixture& f, const std::string& member)
{
    auto cfg = f.config();
    // Over TCP (the blackhole drops its packets; the test's own queries keep
    // the Unix socket), each connection attempt bounded at 2 s, unacknowledged
    // data at 4 s.
    cfg.postgres = pg() + " host=127.0.0.1 connect_timeout=2 tcp_user_timeout=4000";
    cfg.db_timeout = 3s;
    cfg.lock_timeout = 2s;
    cfg.shutdown_timeout = 3s;
    cfg.max_batch = 50;
    cfg.kafka["max.poll.interval.ms"] = "10000";
    cfg.kafka["client.id"] = member;
    return cfg;
}

struct Member {
    std::atomic<int> calls{0};
    Consumer consumer;
    Member(const Fixture& f, const std::string& name)
        : consumer(outage_config(f, name), decode, event_id_of,
                   [this, &f, name](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
                       f.insert(tx, e, ctx, name);
                       ++calls;
                   })
    {
    }
};

} // namespace

TEST_CASE("a PostgreSQL frozen longer than max.poll.interval.ms: stop() bounded, exact counts after", "[fault]")
{
    Fixture f(4);
    f.publish(4000);
    Member a(f, "a"), b(f, "b"), c(f, "c");
    Runner<Consumer> run_a(a.consumer);
    Runner<Consumer> run_b(b.consumer);
    Runner<Consumer> run_c(c.consumer);
    REQUIRE(wait_until([&] { return a.calls + b.calls + c.calls >= 600; }, 60s));

    Freeze freeze;
    const auto frozen_at = Clock::now();
    f.publish(1000);                 // work for the members while the server is frozen
    std::this_thread::sleep_for(2s); // the members are waiting on PostgreSQL now
    // stop() while PostgreSQL is frozen: what is in flight rolls back or is
    // in doubt, and is redelivered; the call returns within its bound.
    const auto stop_at = Clock::now();
    std::atomic<bool> stopped{false};
    std::thread stopper([&] {
        run_c.join();
        stopped = true;
    });
    // shutdown_timeout 3 s, then the calls are cut; the group's leave.
    const bool stop_bounded = wait_until([&] { return stopped.load(); }, 15s);
    fmt::print("frozen server: stop() returned in {:.1f} s\n", seconds_since(stop_at));
    CHECK(stop_bounded);
    // Frozen past max.poll.interval.ms (10 s): the members' own calls are cut.
    while (seconds_since(frozen_at) < 14.0)
        std::this_thread::sleep_for(100ms);
    const int before = a.calls + b.calls;
    freeze.thaw();
    stopper.join();
    const auto thawed_at = Clock::now();
    REQUIRE(wait_until([&] { return a.calls + b.calls > before; }, 60s));
    fmt::print("frozen server: processing resumed {:.1f} s after the thaw\n", seconds_since(thawed_at));
    REQUIRE(wait_until(
        [&] {
            return f.rows() >= 5000 && a.consumer.metrics().snapshot().lag == 0 &&
                   b.consumer.metrics().snapshot().lag == 0;
        },
        90s));
    run_a.join();
    run_b.join();
    fail_if_threw(run_a.error(), "member a");
    fail_if_threw(run_b.error(), "member b");
    fail_if_threw(run_c.error(), "member c");
    // Calls cut: library steps past db_timeout (a worker inside a handler's
    // statement just waits: a handler call is not bounded by db_timeout).
    fmt::print("frozen server: db_timeouts {}\n", a.consumer.metrics().snapshot().db_timeouts +
                                                      b.consumer.metrics().snapshot().db_timeouts +
                                                      c.consumer.metrics().snapshot().db_timeouts);
    f.check_exact(5000);
}

TEST_CASE("a PostgreSQL whose packets vanish: noticed within db_timeout, resumed when they flow", "[fault]")
{
    Fixture f(4);
    f.publish(3000);
    Member a(f, "a");
    Runner<Consumer> run(a.consumer);
    REQUIRE(wait_until([&] { return a.calls >= 500; }, 60s));

    const auto failures_before = a.consumer.metrics().snapshot().db_failures;
    Blackhole hole(server_port());
    const auto cut_at = Clock::now();
    f.publish(1000); // work for the consumer while the server is unreachable
    // Noticed: a library step past db_timeout (3 s) has its connection cut; a
    // handler's statement ends at tcp_user_timeout (4 s here), as nothing
    // acknowledges its data.
    REQUIRE(wait_until([&] { return a.consumer.metrics().snapshot().db_failures > failures_before; }, 30s));
    const double noticed_s = seconds_since(cut_at);
    fmt::print("vanished server: noticed after {:.1f} s (db_timeout 3 s, tcp_user_timeout 4 s), db_timeouts {}\n",
               noticed_s, a.consumer.metrics().snapshot().db_timeouts);
    CHECK(noticed_s < 10.0);
    std::this_thread::sleep_for(3s); // reconnects fail meanwhile (connect_timeout)
    const int before = a.calls;
    hole.lift();
    const auto lifted_at = Clock::now();
    REQUIRE(wait_until([&] { return a.calls > before; }, 60s));
    fmt::print("vanished server: processing resumed {:.1f} s after the packets flowed again\n",
               seconds_since(lifted_at));
    REQUIRE(wait_until([&] { return f.rows() >= 4000 && a.consumer.metrics().snapshot().lag == 0; }, 90s));
    run.join();
    fail_if_threw(run.error());
    f.check_exact(4000);
}

TEST_CASE(
    "a connection lost on the client's side only: the consumer ends its own earlier session, no lock_timeout wait",
    "[fault]")
{
    // The handler's statement is dropped on the way (the blackhole): the
    // client gives the connection up at tcp_user_timeout, the server never
    // hears of it and keeps the session idle in its transaction, holding the
    // batch's claims. The consumer's new session claims the same records:
    // without ending the old session it would wait lock_timeout (60 s here).
    Fixture f(1);
    f.publish(200);
    std::atomic<int> calls{0};
    std::atomic<bool> held{false}, released{false};
    auto cfg = outage_config(f, "a");
    cfg.lock_timeout = 60s;
    Consumer c(cfg, decode, event_id_of, [&](pqxx::work& tx, const TestEvent& e, const Context& ctx) {
        if (calls.fetch_add(1) == 120) {
            held = true;
            wait_until([&] { return released.load(); }, 30s);
        }
        f.insert(tx, e, ctx, "a");
    });
    Runner<Consumer> run(c);
    REQUIRE(wait_until([&] { return held.load(); }, 60s));
    const auto failures_before = c.metrics().snapshot().db_failures;
    Blackhole hole(server_port());
    released = true; // its INSERT is dropped: the connection ends at tcp_user_timeout (4 s)
    REQUIRE(wait_until([&] { return c.metrics().snapshot().db_failures > failures_before; }, 30s));
    hole.lift();
    const auto lifted_at = Clock::now();
    // Well under lock_timeout: the old session is ended on the reconnect.
    REQUIRE(wait_until([&] { return f.rows() >= 200 && c.metrics().snapshot().lag == 0; }, 20s));
    fmt::print("lost session: every record processed {:.1f} s after the packets flowed again\n",
               seconds_since(lifted_at));
    run.join();
    fail_if_threw(run.error());
    const auto m = c.metrics().snapshot();
    CHECK(m.lost_sessions_ended >= 1);
    CHECK(m.lock_timeouts == 0);
    f.check_exact(200);
}
