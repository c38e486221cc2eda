#pragma once
// Output of idemkafka-bench: the table on stdout, the JSON file, and the
// gnuplot data derived from that JSON.

#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "modes.hpp"

namespace idemkafka::bench {

/// Everything one bench invocation measured.
struct Report {
    nlohmann::ordered_json meta;     ///< machine, versions, configuration
    std::vector<Result> runs;        ///< drain runs: throughput
    std::vector<Result> paced;       ///< paced runs: end-to-end latency
    std::vector<std::string> errors; ///< set-up failures (not tied to one run)
};

/// The derived figures: ratios, library CPU, RSS growth.
nlohmann::ordered_json summarise(const Report& report);

nlohmann::ordered_json to_json(const Report& report);

/// Human-readable tables.
void print_tables(std::ostream& out, const Report& report, const nlohmann::ordered_json& summary);

/// Gnuplot data from a bench JSON file: one line per mode, its events/s at the
/// largest count it ran, per duplicate share. Throws on an unreadable file.
void write_plot_data(std::ostream& out, const std::string& json_path);

} // namespace idemkafka::bench
