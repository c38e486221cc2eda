#pragma once
// The last log lines of a test case, kept in memory at every level and
// printed when the test case fails: a failing run in CI shows what the
// library did before the failed assertion (its info lines too), while a
// passing run prints only its warnings.

#include <string>

namespace idemkafka::test {

/// Keeps one line (the oldest go past 400 lines). Thread-safe.
void remember_log_line(std::string line);
/// Forgets every kept line (at the start of each test case).
void forget_log_lines();
/// Writes the kept lines to stderr under a heading, oldest first.
void print_log_lines(const std::string& heading);

} // namespace idemkafka::test
