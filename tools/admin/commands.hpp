#pragma once
// The idemkafka-admin subcommands. Each takes the arguments after its name and
// returns the exit status; bad arguments throw UsageError, failures throw.

#include <string>
#include <vector>

namespace idemkafka::detail::admin {

int run_migrate(std::vector<std::string> args);
int run_maintain(std::vector<std::string> args);
int run_status(std::vector<std::string> args);
int run_dead_letters(std::vector<std::string> args);
int run_offsets(std::vector<std::string> args);

} // namespace idemkafka::detail::admin
