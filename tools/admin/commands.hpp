#pragma once
// The idemkafka-admin subcommands. Each takes the arguments after its name and
// returns the exit status; bad arguments throw UsageError, failures throw.

#include <optional>
#include <string>
#include <vector>

namespace idemkafka::detail::admin {

int run_migrate(std::vector<std::string> args);
int run_maintain(std::vector<std::string> args);
int run_status(std::vector<std::string> args);
int run_dead_letters(std::vector<std::string> args);
int run_offsets(std::vector<std::string> args);
int run_serve(std::vector<std::string> args);
/// What `status --json` prints for the claims table `schema`.`table` (and the
/// replay audit table when given). Throws as `status` does.
std::string status_json_of(const std::string& postgres, const std::string& schema, const std::string& table,
                           const std::optional<std::string>& replay_audit_table);
/// The stored positions section of `status`: nothing when no offset table exists.
void print_stored_positions(const std::string& postgres, const std::string& schema, const std::string& brokers);

} // namespace idemkafka::detail::admin
