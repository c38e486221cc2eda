// idemkafka-admin: schema migration, retention maintenance, status and dead-letter
// replay for idemkafka's claims table, from the command line.
//
// Exit status: 0 success, 1 failure (database or Kafka unreachable, an operation
// failed), 2 bad command line.

#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <pqxx/version>

#include <idemkafka/error.hpp>
#include <idemkafka/schema.hpp>

#include "cli.hpp"
#include "commands.hpp"

namespace {

using namespace idemkafka::detail::admin;

constexpr const char* usage_text = R"(usage: idemkafka-admin <command> [options]

Administration of idemkafka's dedup claims table (processed_event) and dead-letter topics.

commands:
  migrate        create or upgrade every table idemkafka uses (--offsets, --outbox); --print-sql
  maintain       create partitions ahead, drop expired ones or purge expired claims [--dry-run]
  status         claims per consumer group, partitions and their time ranges, the dedup horizon [--json]
  dead-letters   list or replay dead-letter records (list | replay)
  offsets        stored consumer positions next to Kafka's and the lag (list | set) [--dry-run]
  serve          the operations console: a web page and a JSON API (--listen ADDR, --allow-replay)
  help [COMMAND] this text, or a command's options
  --version      idemkafka's version and the libpqxx and librdkafka it was built with

Run `idemkafka-admin <command> --help` for a command's options. The database comes from --postgres
or IDEMKAFKA_POSTGRES, Kafka from --brokers or IDEMKAFKA_BROKERS.
)";

int dispatch(const std::string& command, std::vector<std::string> rest)
{
    if (command == "migrate")
        return run_migrate(std::move(rest));
    if (command == "maintain")
        return run_maintain(std::move(rest));
    if (command == "status")
        return run_status(std::move(rest));
    if (command == "dead-letters")
        return run_dead_letters(std::move(rest));
    if (command == "offsets")
        return run_offsets(std::move(rest));
    if (command == "serve")
        return run_serve(std::move(rest));
    throw UsageError(fmt::format("unknown command '{}'", command));
}

} // namespace

int main(int argc, char** argv)
{
    std::vector<std::string> args(argv + 1, argv + argc);
    std::string command;
    try {
        if (args.empty()) {
            err(usage_text);
            return exit_usage;
        }
        command = args.front();
        args.erase(args.begin());
        if (command == "--help" || command == "-h") {
            out(usage_text);
            return exit_ok;
        }
        if (command == "--version") {
            out(fmt::format("idemkafka-admin {} (schema version {})\nlibpqxx {}, librdkafka {}", IDEMKAFKA_VERSION_TEXT,
                            idemkafka::schema_version, PQXX_VERSION, rd_kafka_version_str()));
            return exit_ok;
        }
        if (command == "help") {
            if (args.empty()) {
                out(usage_text);
                return exit_ok;
            }
            return dispatch(args.front(), {"--help"});
        }
        return dispatch(command, std::move(args));
    } catch (const UsageError& e) {
        err(fmt::format("idemkafka-admin: {}", e.what()));
        err(command.empty() || command.rfind('-', 0) == 0
                ? "Run `idemkafka-admin --help` for the commands."
                : fmt::format("Run `idemkafka-admin {} --help` for its options.", command));
        return exit_usage;
    } catch (const std::exception& e) {
        err(fmt::format("idemkafka-admin: error: {}", e.what()));
        return exit_failure;
    } catch (...) {
        err("idemkafka-admin: error: unknown failure");
        return exit_failure;
    }
}
