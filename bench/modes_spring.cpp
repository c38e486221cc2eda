// The Spring Kafka peer (bench/peers/spring): the processed_event pattern as
// Spring users write it, run as a child JVM on the run's topic and tables. The
// bench reads its progress from the child's stdout, its latency samples from a
// file, its CPU and peak RSS from the kernel, and verifies its rows as it
// verifies every mode's.

#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

#include <fmt/format.h>

#include "child.hpp"
#include "modes.hpp"

namespace idemkafka::bench {

namespace {

// How long the child may stay silent (start-up, group join, a stall) before it
// is killed and the run failed.
constexpr std::chrono::seconds child_silence_limit{120};

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
    return spawn_child(args, log);
}

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
            fmt::format("--peer.expected={}", job.kills > 0 ? 0 : job.count),
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

// The kill -9 run of the peer (run_kill9).
void run_spring_kill9(const RunEnv& env, const Job& job, RunState& st)
{
    if (env.spring.jar.empty())
        throw std::runtime_error("no Spring peer jar (--spring-jar; scripts/bench.sh builds it)");
    const std::string group = group_of(job);
    const std::string log = fmt::format("{}/{}-{}.log", env.spring.work_dir, job.mode, job.serial);
    run_kill9(env, job, st, "the peer", group, log, [&](std::chrono::milliseconds idle_exit) {
        return spawn_peer(env.spring, peer_props(env, job, st, group, "", idle_exit), log);
    });
}

} // namespace

void run_spring(const RunEnv& env, const Job& job, RunState& st)
{
    if (job.kills > 0) {
        run_spring_kill9(env, job, st);
        return;
    }
    if (env.spring.jar.empty())
        throw std::runtime_error("no Spring peer jar (--spring-jar; scripts/bench.sh builds it)");
    const std::string group = group_of(job);
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
