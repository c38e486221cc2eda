// Child processes (the Spring peer, the library's consumer for the kill -9
// run) and the kill -9 loop both are run under.

#include "child.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
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

namespace idemkafka::bench {

Child spawn_child(const std::vector<std::string>& args, const std::string& log)
{
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy)
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
        std::fprintf(stderr, "exec %s: %s\n", argv[0], std::strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    if (err >= 0)
        close(err);
    return {pid, fds[0]};
}

bool LineReader::next(std::string& line, std::chrono::milliseconds limit, bool& timed_out)
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

namespace {

// One incarnation of the kill -9 run: started, SIGKILLed `after` once it has
// committed something (or, when `after` is zero, run until idle). Returns the
// records it reported.
std::size_t incarnation(const StartChild& start, std::chrono::milliseconds after)
{
    const bool last = after.count() == 0;
    Child child = start(std::chrono::milliseconds(last ? 8000 : 0));
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

} // namespace

void run_kill9(const RunEnv& env, const Job& job, RunState& st, const std::string& what, const std::string& group,
               const std::string& log, const StartChild& start)
{
    std::mt19937_64 rng(job.kill_seed);
    std::uniform_int_distribution<int> delay_ms(100, 2500);
    st.first_taken_us = steady_us();
    st.ready();
    // Records each incarnation reported processed before it was killed or went
    // idle: shows whether the kills landed while records were being processed.
    // A kill once the group has committed every record would test nothing:
    // the kills stop there, and the note says how many there were.
    const auto high = watermarks(env.services, job.topic).high_sum;
    std::string seen;
    int kills = 0;
    for (; kills < job.kills && committed_sum(env.services, job.topic, group) < high; ++kills)
        seen += fmt::format("{}{}", kills ? ", " : "", incarnation(start, std::chrono::milliseconds(delay_ms(rng))));
    // Until idle with every record's offset committed: a run that went idle in
    // a rebalance goes again, so what is missing was acknowledged, not unread.
    std::int64_t unread = 0;
    for (int tries = 0; tries < 3; ++tries) {
        seen += fmt::format("{}{}", seen.empty() ? "" : ", ", incarnation(start, std::chrono::milliseconds(0)));
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
            fmt::format("{} left {} records of {} uncommitted (log {})", what, unread, job.topic, log));
    st.result.notes.push_back(fmt::format(
        "{} SIGKILLs of {}{}, then runs until idle with every offset committed "
        "(records processed per incarnation: {}){}",
        kills, what,
        kills < job.kills ? fmt::format(" ({} asked: its group had committed every record)", job.kills) : "", seen,
        quiet ? "" : "; log " + log));
}

} // namespace idemkafka::bench
