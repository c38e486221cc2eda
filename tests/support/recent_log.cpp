#include "recent_log.hpp"

#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>

#include <fmt/format.h>

namespace idemkafka::test {
namespace {

constexpr std::size_t kept_lines = 400;

struct Kept {
    std::mutex mu;
    std::deque<std::string> lines;
    std::size_t dropped = 0;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

Kept& kept()
{
    static Kept k;
    return k;
}

} // namespace

void remember_log_line(std::string line)
{
    auto& k = kept();
    std::lock_guard<std::mutex> lock(k.mu);
    const auto at = std::chrono::duration<double>(std::chrono::steady_clock::now() - k.since).count();
    k.lines.push_back(fmt::format("{:9.3f} {}", at, line));
    if (k.lines.size() > kept_lines) {
        k.lines.pop_front();
        ++k.dropped;
    }
}

void forget_log_lines()
{
    auto& k = kept();
    std::lock_guard<std::mutex> lock(k.mu);
    k.lines.clear();
    k.dropped = 0;
    k.since = std::chrono::steady_clock::now();
}

void print_log_lines(const std::string& heading)
{
    auto& k = kept();
    std::lock_guard<std::mutex> lock(k.mu);
    if (k.lines.empty())
        return;
    std::fprintf(stderr,
                 "--- %s: the test case's last %zu log lines (%zu earlier ones not kept; seconds since it "
                 "started) ---\n",
                 heading.c_str(), k.lines.size(), k.dropped);
    for (const auto& l : k.lines)
        std::fprintf(stderr, "%s\n", l.c_str());
    std::fprintf(stderr, "--- end of the log lines ---\n");
    std::fflush(stderr);
}

} // namespace idemkafka::test
