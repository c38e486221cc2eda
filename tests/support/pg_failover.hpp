#pragma once
// A PostgreSQL primary and an asynchronous streaming standby of its own for a
// failover test, driven through support/pg_failover.sh: started by the
// constructor, stopped (and their directory removed) by the destructor, also
// when the test fails; a watchdog left by the script stops them if this
// process dies first. Every step is bounded by `timeout`.

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

namespace idemkafka::test {

class PgFailoverPair {
public:
    /// Starts both servers (`script` is pg_failover.sh); throws with the
    /// script's output if they do not start within `start_bound_s`.
    explicit PgFailoverPair(std::string script, int start_bound_s = 120) : script_(std::move(script))
    {
        std::string out;
        const bool ok = run(fmt::format("start --watch-pid {}", getpid()), start_bound_s, &out);
        dir_ = value_of(out, "dir");
        const auto primary = value_of(out, "primary_port");
        const auto standby = value_of(out, "standby_port");
        if (!ok || primary.empty() || standby.empty()) {
            stop();
            throw std::runtime_error("pg_failover.sh start failed (its messages are above): " + out);
        }
        primary_port_ = std::stoi(primary);
        standby_port_ = std::stoi(standby);
    }
    ~PgFailoverPair() { stop(); }
    PgFailoverPair(const PgFailoverPair&) = delete;
    PgFailoverPair& operator=(const PgFailoverPair&) = delete;

    int primary_port() const { return primary_port_; }
    int standby_port() const { return standby_port_; }

    /// Conninfo of one server (database idemkafka_test).
    std::string dsn(int port) const
    {
        return fmt::format("host=127.0.0.1 port={} dbname=idemkafka_test user=postgres connect_timeout=5", port);
    }
    /// Both servers, the one that takes writes: what a service is given.
    std::string failover_dsn() const
    {
        return fmt::format("host=127.0.0.1,127.0.0.1 port={},{} dbname=idemkafka_test user=postgres "
                           "target_session_attrs=read-write",
                           primary_port_, standby_port_);
    }

    /// Stops the standby's walreceiver (SIGSTOP): no more WAL reaches it.
    void cut() { step("cut"); }
    /// SIGKILL every process of the primary.
    void kill_primary() { step("kill-primary"); }
    /// SIGKILL the stopped walreceiver, dropping the WAL in its socket.
    void kill_walreceiver() { step("kill-walreceiver"); }
    /// Promotes the standby; returns once it takes writes.
    void promote() { step("promote", 90); }

    /// Stops both servers and removes their directory; idempotent.
    void stop() noexcept
    {
        if (dir_.empty())
            return;
        run("stop " + dir_, 60, nullptr);
        dir_.clear();
    }

private:
    void step(std::string_view command, int bound_s = 30)
    {
        std::string out;
        if (!run(fmt::format("{} {}", command, dir_), bound_s, &out))
            throw std::runtime_error(
                fmt::format("pg_failover.sh {} failed (its messages are above): {}", command, out));
    }

    // Runs the script with `args` (its stderr goes to ours), at most `bound_s`
    // seconds; true when it exited with 0. Its stdout goes to *out.
    bool run(const std::string& args, int bound_s, std::string* out) const noexcept
    {
        const std::string command = fmt::format("timeout -k 5 {} bash '{}' {}", bound_s, script_, args);
        std::FILE* p = ::popen(command.c_str(), "r");
        if (!p)
            return false;
        char buf[512];
        std::size_t n = 0;
        while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
            if (out)
                out->append(buf, n);
        const int status = ::pclose(p);
        return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }

    // The value of a "key=value" line of the script's output, "" when absent.
    static std::string value_of(const std::string& out, std::string_view key)
    {
        const std::string prefix = std::string(key) + "=";
        std::size_t at = 0;
        while (at < out.size()) {
            const auto end = out.find('\n', at);
            const auto line = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
            if (line.rfind(prefix, 0) == 0)
                return line.substr(prefix.size());
            if (end == std::string::npos)
                break;
            at = end + 1;
        }
        return "";
    }

    std::string script_;
    std::string dir_;
    int primary_port_ = 0;
    int standby_port_ = 0;
};

} // namespace idemkafka::test
