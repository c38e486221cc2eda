// The Spring Kafka peer (bench/peers/spring): the processed_event pattern as
// Spring users write it, run as a child JVM on the run's topic and tables. The
// bench reads its progress from the child's stdout, its latency samples from a
// file, its CPU and peak RSS from the kernel, and verifies its rows as it
// verifies every mode's.

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <fmt/format.h>

#include "modes.hpp"

namespace idemkafka::bench {

namespace {

// How long the child may stay silent (start-up, group join, a stall) before it
// is killed and the run failed.
constexpr std::chrono::seconds child_silence_limit{120};

struct Child {
    pid_t pid = -1;
    int out = -1; ///< read end of the child's stdout
};

// Starts the peer with `props` (--name=value each); its stderr goes to `log`.
Child spawn_peer(const SpringPeer& peer, const std::vector<std::string>& props, const std::string& log)
{
    std::vector<std::string> args = {"java"};
    std::istringstream opts(peer.java_opts);
    for (std::string o; opts >> o;)
        args.push_back(o);
    args.push_back("-jar");
    args.push_back(peer.jar);
    args.insert(args.end(), props.begin(), props.end());
    std::vector<char*> argv;
    for (auto& a : args)
        argv.push_back(a.data());
    argv.push_back(nullptr);

    int fds[2];
    if (pipe(fds) != 0)
        throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const pid_t pid = fork();
    if (pid < 0)
        throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
#ifdef __linux__
        prctl(PR_SET_PDEATHSIG, SIGKILL); // never outlive the bench
#endif
        dup2(fds[1], STDOUT_FILENO);
        if (err >= 0)
            dup2(err, STDERR_FILENO);
        close(fds[0]);
        execvp(argv[0], argv.data());
        std::fprintf(stderr, "exec java: %s\n", std::strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    if (err >= 0)
        close(err);
    return {pid, fds[0]};
}

// Reads the next line of the child's stdout into `line`; false at its end or
// after `limit` of silence (then `timed_out`).
class LineReader {
public:
    explicit LineReader(int fd) : fd_(fd) {}
    bool next(std::string& line, std::chrono::milliseconds limit, bool& timed_out)
    {
        timed_out = false;
        const auto deadline = SteadyClock::now() + limit;
        while (true) {
            const auto nl = buf_.find('\n');
            if (nl != std::string::npos) {
                line = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return true;
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
            if (left.count() <= 0) {
                timed_out = true;
                return false;
            }
            pollfd p{fd_, POLLIN, 0};
            const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000)));
            if (n <= 0)
                continue;
            char chunk[4096];
            const ssize_t got = ::read(fd_, chunk, sizeof chunk);
            if (got <= 0)
                return false;
            buf_.append(chunk, static_cast<std::size_t>(got));
        }
    }

private:
    int fd_;
    std::string buf_;
};

// The DONE line's key=value pairs.
std::map<std::string, std::string> parse_done(const std::string& line)
{
    std::map<std::string, std::string> kv;
    std::istringstream in(line.substr(4));
    for (std::string item; in >> item;) {
        const auto eq = item.find('=');
        if (eq != std::string::npos)
            kv[item.substr(0, eq)] = item.substr(eq + 1);
    }
    return kv;
}

std::int64_t number(const std::map<std::string, std::string>& kv, const std::string& key)
{
    auto it = kv.find(key);
    if (it == kv.end())
        throw std::runtime_error("the peer's DONE line has no " + key);
    return std::stoll(it->second);
}

double rss_mb_of(pid_t pid)
{
    std::ifstream in(fmt::format("/proc/{}/status", pid));
    for (std::string line; std::getline(in, line);)
        if (line.rfind("VmRSS:", 0) == 0)
            return std::stod(line.substr(6)) / 1024.0;
    return 0;
}

// Waits for the child; its CPU seconds and peak RSS (MB) over its whole life.
struct Exit {
    int status = 0;
    double cpu_seconds = 0;
    double peak_rss_mb = 0;
};
Exit reap(pid_t pid)
{
    int status = 0;
    rusage ru{};
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    Exit e;
    e.status = status;
    e.cpu_seconds = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                    static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    e.peak_rss_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
    return e;
}

std::string tail_of(const std::string& path, std::size_t lines)
{
    std::ifstream in(path);
    std::vector<std::string> all;
    for (std::string l; std::getline(in, l);)
        all.push_back(l);
    std::string out;
    for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
        out += all[i] + "\n";
    return out;
}

std::vector<std::string> peer_props(const RunEnv& env, const Job& job, const RunState& st, const std::string& group,
                                    const std::string& latency_out, std::chrono::milliseconds idle_exit = {})
{
    const auto& peer = env.spring;
    return {fmt::format("--peer.idle-exit-ms={}", idle_exit.count()),
            "--peer.mode=" + job.spring_mode,
            "--peer.ack-mode=" + job.spring_ack_mode,
            "--peer.topic=" + job.topic,
            "--peer.group=" + group,
            fmt::format("--peer.concurrency={}", job.spring_concurrency),
            fmt::format("--peer.expected={}", job.spring_kills > 0 ? 0 : job.count),
            fmt::format("--peer.warmup={}", job.warmup),
            fmt::format("--peer.stall-ms={}", std::chrono::milliseconds(stall_timeout).count()),
            "--peer.latency-out=" + latency_out,
            "--peer.claims-table=" + st.tables.claims_q,
            "--peer.effect-table=" + st.tables.effect_q,
            "--peer.brokers=" + env.services.brokers,
            "--spring.datasource.url=" + peer.jdbc_url};
}

// Reads the child's latency samples ("produced taken committed", wall-clock us).
void read_latency(const std::string& path, RunState& st)
{
    const std::int64_t offset = steady_us() - wall_us();
    std::ifstream in(path);
    std::int64_t produced = 0, taken = 0, committed = 0;
    while (in >> produced >> taken >> committed)
        st.latency.record(produced, taken + offset, committed, committed + offset);
}

} // namespace

// One incarnation of the kill -9 run: started, SIGKILLed `after` once it has
// committed something (or, when `after` is zero, run until idle). Returns the
// distinct records it reported.
std::size_t incarnation(const RunEnv& env, const Job& job, RunState& st, const std::string& group,
                        std::chrono::milliseconds after, const std::string& log)
{
    const bool last = after.count() == 0;
    Child child =
        spawn_peer(env.spring, peer_props(env, job, st, group, "", std::chrono::milliseconds(last ? 8000 : 0)), log);
    LineReader reader(child.out);
    const auto started = SteadyClock::now();
    std::optional<SteadyClock::time_point> kill_at;
    std::string line;
    bool timed_out = false;
    std::size_t seen = 0;
    while (reader.next(line, std::chrono::milliseconds(50), timed_out) || timed_out) {
        if (!timed_out && line.rfind("PROGRESS ", 0) == 0)
            seen = static_cast<std::size_t>(std::stoull(line.substr(9)));
        const auto now = SteadyClock::now();
        // Killed `after` its first commit, or after a minute when nothing comes.
        if (!last && !kill_at && (seen > 0 || now - started > std::chrono::seconds(60)))
            kill_at = now + after;
        if ((kill_at && now >= *kill_at) || now - started > std::chrono::seconds(300)) {
            kill(child.pid, SIGKILL);
            break;
        }
    }
    close(child.out);
    reap(child.pid);
    return seen;
}

// The kill -9 run: the peer SIGKILLed job.spring_kills times, each at a random
// moment (0.1 to 2.5 s after its first commit), and restarted; then run until
// idle. What it doubled or lost is verified afterwards like every run's.
void run_spring_kill9(const RunEnv& env, const Job& job, RunState& st)
{
    const std::string group = fmt::format("ikbench-{}-{}", job.mode, job.serial);
    const std::string log = fmt::format("{}/{}-{}.log", env.spring.work_dir, job.mode, job.serial);
    std::mt19937_64 rng(job.spring_kill_seed);
    std::uniform_int_distribution<int> delay_ms(100, 2500);
    st.first_taken_us = steady_us();
    st.ready();
    for (int k = 0; k < job.spring_kills; ++k)
        incarnation(env, job, st, group, std::chrono::milliseconds(delay_ms(rng)), log);
    // Until idle with every record's offset committed: a run that went idle in
    // a rebalance goes again, so what is missing was acknowledged, not unread.
    const auto high = watermarks(env.services, job.topic).high_sum;
    std::int64_t unread = 0;
    for (int tries = 0; tries < 3; ++tries) {
        incarnation(env, job, st, group, std::chrono::milliseconds(0), log);
        unread = high - committed_sum(env.services, job.topic, group);
        if (unread <= 0)
            break;
    }
    st.last_commit_us = steady_us();
    std::error_code ec;
    const bool quiet = std::filesystem::file_size(log, ec) == 0 && !ec;
    if (quiet)
        std::filesystem::remove(log, ec);
    if (unread > 0)
        throw std::runtime_error(
            fmt::format("the peer left {} records of {} uncommitted (log {})", unread, job.topic, log));
    st.result.notes.push_back(fmt::format("{} SIGKILLs of the peer, then runs until idle with every offset committed{}",
                                          job.spring_kills, quiet ? "" : "; log " + log));
}

void run_spring(const RunEnv& env, const Job& job, RunState& st)
{
    if (job.spring_kills > 0) {
        run_spring_kill9(env, job, st);
        return;
    }
    if (env.spring.jar.empty())
        throw std::runtime_error("no Spring peer jar (--spring-jar; scripts/bench.sh builds it)");
    const std::string group = fmt::format("ikbench-{}-{}", job.mode, job.serial);
    const std::string dir = env.spring.work_dir.empty() ? "/tmp" : env.spring.work_dir;
    const std::string latency_out = fmt::format("{}/{}-{}.latency", dir, job.mode, job.serial);
    const std::string log = fmt::format("{}/{}-{}.log", dir, job.mode, job.serial);
    Child child = spawn_peer(env.spring, peer_props(env, job, st, group, latency_out), log);
    LineReader reader(child.out);
    std::string line, done;
    bool timed_out = false;
    while (reader.next(line, child_silence_limit, timed_out)) {
        if (line.rfind("ASSIGNED", 0) == 0) {
            st.result.rss_start_mb = rss_mb_of(child.pid);
            st.ready();
        } else if (line.rfind("PROGRESS ", 0) == 0) {
            st.set_processed(static_cast<std::size_t>(std::stoull(line.substr(9))));
        } else if (line.rfind("DONE ", 0) == 0) {
            done = line;
            st.take_cpu_after(*env.meter);
        }
    }
    if (timed_out)
        kill(child.pid, SIGKILL);
    close(child.out);
    const Exit exit = reap(child.pid);
    st.child_cpu_seconds_total = exit.cpu_seconds;
    st.child_rss_peak_mb = exit.peak_rss_mb;
    if (done.empty())
        throw std::runtime_error(fmt::format("the Spring peer ended without a result (status {}{}); its log {}:\n{}",
                                             exit.status, timed_out ? ", silent too long: killed" : "", log,
                                             tail_of(log, 20)));
    const auto kv = parse_done(done);
    const std::int64_t offset = steady_us() - wall_us();
    if (number(kv, "first_taken_us") >= 0)
        st.first_taken_us = number(kv, "first_taken_us") + offset;
    if (number(kv, "last_commit_us") >= 0)
        st.last_commit_us = number(kv, "last_commit_us") + offset;
    st.effects_reported = static_cast<std::size_t>(number(kv, "effects"));
    st.result.transactions = static_cast<std::uint64_t>(number(kv, "transactions"));
    st.child_cpu_seconds_run = static_cast<double>(number(kv, "cpu_last_ns") - number(kv, "cpu_first_ns")) / 1e9;
    read_latency(latency_out, st);
    std::remove(latency_out.c_str());
    if (kv.at("outcome") != "complete")
        st.result.errors.push_back(fmt::format("lost: the peer saw {} of {} records ({})", number(kv, "distinct"),
                                               job.count, kv.at("outcome")));
    else
        std::remove(log.c_str());
    st.result.notes.push_back(fmt::format("JVM {} s CPU in all, start-up included", exit.cpu_seconds));
}

} // namespace idemkafka::bench
