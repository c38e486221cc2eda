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
/// The stored positions section of `status`: nothing when no offset table exists.
void print_stored_positions(const std::string& postgres, const std::string& schema, const std::string& brokers);

} // namespace idemkafka::detail::admin
