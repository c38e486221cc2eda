#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <set>

#include <fmt/format.h>

namespace idemkafka::bench {

using nlohmann::ordered_json;

namespace {

double round_to(double v, int digits)
{
    const double f = std::pow(10.0, digits);
    return std::round(v * f) / f;
}

ordered_json latency_json(const Histogram& h)
{
    if (h.count() == 0)
        return nullptr;
    return {{"p50", round_to(h.percentile_ms(50), 3)},
            {"p99", round_to(h.percentile_ms(99), 3)},
            {"max", round_to(h.max_ms(), 3)},
            {"samples", h.count()}};
}

ordered_json optional_number(double v, int digits)
{
    if (v < 0)
        return nullptr;
    return round_to(v, digits);
}

ordered_json run_json(const Result& r)
{
    ordered_json j;
    j["mode"] = r.mode;
    j["round"] = r.round;
    j["dup_percent"] = r.dup_percent;
    j["events"] = r.events;
    j["unique"] = r.unique;
    if (r.slow_calls > 0) {
        j["slow_calls"] = r.slow_calls;
        j["slow_seconds"] = r.slow_seconds;
    }
    if (r.paced)
        j["rate"] = r.rate;
    j["seconds"] = round_to(r.seconds, 4);
    j["startup_seconds"] = round_to(r.startup_seconds, 3);
    j["wall_seconds"] = round_to(r.wall_seconds, 3);
    j["events_per_s"] = round_to(r.events_per_s, 1);
    j["transactions"] = r.transactions;
    j["records_per_transaction"] =
        r.transactions ? round_to(static_cast<double>(r.events) / static_cast<double>(r.transactions), 1) : 0.0;
    ordered_json lat;
    if (r.paced)
        lat["end_to_end"] = latency_json(r.end_to_end);
    lat["taken_to_commit"] = latency_json(r.taken_to_commit);
    j["latency_ms"] = lat;
    if (r.has_cpu) {
        j["cpu_us_per_event"] = {{"process", round_to(r.cpu.process, 2)},
                                 {"app_threads", round_to(r.cpu.app, 2)},
                                 {"rdkafka_threads", round_to(r.cpu.rdkafka, 2)},
                                 {"postgres", optional_number(r.cpu.postgres, 2)},
                                 {"broker", optional_number(r.cpu.broker, 2)}};
        j["other_processes_cores"] = round_to(r.cpu.other_cores, 2);
    } else {
        j["cpu_us_per_event"] = nullptr;
        j["other_processes_cores"] = nullptr;
    }
    j["rss_mb"] = {{"start", round_to(r.rss_start_mb, 1)},
                   {"peak", round_to(r.rss_peak_mb, 1)},
                   {"growth", round_to(std::max(0.0, r.rss_peak_mb - r.rss_start_mb), 1)}};
    if (r.lag_spread_samples > 0)
        j["lag_spread"] = {{"partitions", r.partitions},
                           {"max", round_to(r.lag_spread_max, 0)},
                           {"mean", round_to(r.lag_spread_mean, 0)},
                           {"samples", r.lag_spread_samples}};
    if (r.kill_doubled >= 0)
        j["kill9"] = {{"doubled", r.kill_doubled}, {"missing", r.kill_missing}};
    j["ok"] = r.ok();
    j["errors"] = r.errors;
    j["notes"] = r.notes;
    return j;
}

// The kill -9 runs side by side: charges doubled and missing per mode.
void print_kill9(std::ostream& out, const Report& report)
{
    if (std::none_of(report.runs.begin(), report.runs.end(), [](const Result& r) { return r.kill_doubled >= 0; }))
        return;
    out << "\nkill -9: the consumer's process SIGKILLed at random moments and restarted, then run until idle; "
           "charges (effect rows) against distinct events\n";
    out << fmt::format("{:<32} {:>4} {:>8} {:>8} {:>8} {:>8}  {}\n", "mode", "dup%", "events", "unique", "doubled",
                       "missing", "status");
    for (const auto& r : report.runs)
        if (r.kill_doubled >= 0)
            out << fmt::format("{:<32} {:>4} {:>8} {:>8} {:>8} {:>8}  {}\n", r.mode, r.dup_percent, r.events, r.unique,
                               r.kill_doubled, r.kill_missing, r.ok() ? "ok" : "ERROR: " + r.errors.front());
}

// The OK drain run of `mode` at `dup` and `events` (in `round`, or the
// first round it has one), if there is one.
const Result* find_run(const std::vector<Result>& runs, const std::string& mode, int dup, std::size_t events,
                       int round = 0)
{
    for (const auto& r : runs)
        if (r.mode == mode && r.dup_percent == dup && r.events == events && r.ok() && r.events_per_s > 0 &&
            (round == 0 || r.round == round))
            return &r;
    return nullptr;
}

int rounds_of(const std::vector<Result>& runs)
{
    int n = 1;
    for (const auto& r : runs)
        n = std::max(n, r.round);
    return n;
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const auto m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Largest event count at which `mode` ran OK at `dup`.
std::optional<std::size_t> largest(const std::vector<Result>& runs, const std::string& mode, int dup)
{
    std::optional<std::size_t> best;
    for (const auto& r : runs)
        if (r.mode == mode && r.dup_percent == dup && r.ok() && r.events_per_s > 0 && (!best || r.events > *best))
            best = r.events;
    return best;
}

std::vector<std::string> modes_of(const std::vector<Result>& runs)
{
    std::vector<std::string> out;
    for (const auto& r : runs)
        if (std::find(out.begin(), out.end(), r.mode) == out.end())
            out.push_back(r.mode);
    return out;
}

std::vector<int> dups_of(const std::vector<Result>& runs)
{
    std::set<int> s;
    for (const auto& r : runs)
        s.insert(r.dup_percent);
    return {s.begin(), s.end()};
}

// The fields every ratio has, `value` its value; with a target, whether it is met.
ordered_json ratio_fields(const std::string& name, int dup, std::size_t events_num, std::size_t events_den,
                          double num_rate, double den_rate, double value)
{
    ordered_json j;
    j["name"] = name;
    j["dup_percent"] = dup;
    j["events_numerator"] = events_num;
    j["events_denominator"] = events_den;
    j["numerator_events_per_s"] = round_to(num_rate, 1);
    j["denominator_events_per_s"] = round_to(den_rate, 1);
    j["value"] = round_to(value, 3);
    return j;
}

void add_target(ordered_json& j, double value, std::optional<double> target)
{
    if (!target)
        return;
    j["target"] = *target;
    j["met"] = value >= *target;
}

// One ratio over the rounds: the median of each round's ratio, when both
// modes ran at `events` in more than one round.
std::optional<ordered_json> rounds_ratio_json(const std::vector<Result>& runs, const std::string& name,
                                              const std::string& num, const std::string& den, int dup,
                                              std::size_t events, std::optional<double> target)
{
    std::vector<double> values, num_rates, den_rates;
    ordered_json each = ordered_json::array();
    const int rounds = rounds_of(runs);
    for (int round = 1; round <= rounds; ++round) {
        const Result* a = find_run(runs, num, dup, events, round);
        const Result* b = find_run(runs, den, dup, events, round);
        if (!a || !b)
            continue;
        values.push_back(a->events_per_s / b->events_per_s);
        num_rates.push_back(a->events_per_s);
        den_rates.push_back(b->events_per_s);
        each.push_back(round_to(values.back(), 3));
    }
    if (values.size() < 2)
        return std::nullopt;
    const double v = median(values);
    ordered_json j = ratio_fields(name, dup, events, events, median(num_rates), median(den_rates), v);
    j["rounds"] = values.size();
    j["min"] = round_to(*std::min_element(values.begin(), values.end()), 3);
    j["max"] = round_to(*std::max_element(values.begin(), values.end()), 3);
    j["each_round"] = each;
    add_target(j, v, target);
    if (target)
        j["met_every_round"] = j["min"].get<double>() >= *target;
    return j;
}

ordered_json ratio_json(const std::string& name, const Result& a, const Result& b, std::optional<double> target)
{
    const double v = a.events_per_s / b.events_per_s;
    ordered_json j = ratio_fields(name, a.dup_percent, a.events, b.events, a.events_per_s, b.events_per_s, v);
    add_target(j, v, target);
    return j;
}

std::string si(double v)
{
    if (v >= 1e6 && std::fmod(v, 1e6) == 0)
        return fmt::format("{}M", v / 1e6);
    if (v >= 1e3 && std::fmod(v, 1e3) == 0)
        return fmt::format("{}k", v / 1e3);
    return fmt::format("{}", v);
}

std::string cell(const ordered_json& v, int digits = 1)
{
    if (v.is_null())
        return "-";
    return fmt::format("{:.{}f}", v.get<double>(), digits);
}

// The mixed rows against their ideal, in the same run: the slow calls'
// handler time spread evenly over the workers, or the fast path's time (the
// same records with no slow call) where that is larger.
ordered_json mixed_ideal(const Report& report)
{
    ordered_json out = ordered_json::array();
    const auto& cfg = report.meta.value("config", ordered_json::object());
    const int workers = cfg.value("mixed_workers", 0);
    if (workers < 1)
        return out;
    for (const auto& r : report.runs) {
        if (r.mode != "idemkafka_mixed_partition" && r.mode != "idemkafka_mixed_key")
            continue;
        const Result* fast = find_run(report.runs, "idemkafka_mixed_fast", r.dup_percent, r.events);
        if (!fast || !r.ok() || r.events_per_s <= 0)
            continue;
        const double slow_seconds = static_cast<double>(r.slow_calls) * r.slow_seconds / workers;
        const double fast_seconds = static_cast<double>(fast->events) / fast->events_per_s;
        const double ideal = static_cast<double>(r.events) / std::max(slow_seconds, fast_seconds);
        ordered_json j;
        j["mode"] = r.mode;
        j["dup_percent"] = r.dup_percent;
        j["events"] = r.events;
        j["workers"] = workers;
        j["slow_calls"] = r.slow_calls;
        j["events_per_s"] = round_to(r.events_per_s, 1);
        j["fast_events_per_s"] = round_to(fast->events_per_s, 1);
        j["ideal_events_per_s"] = round_to(ideal, 1);
        j["value"] = round_to(r.events_per_s / ideal, 3);
        j["target"] = 0.8;
        j["met"] = r.events_per_s / ideal >= 0.8;
        out.push_back(std::move(j));
    }
    // Every call takes 5 ms: the ideal is the handler time spread over the
    // workers that can run at once (with Ordering::partition, one per
    // partition; in a share group, one per member).
    const int handler_workers = cfg.value("handler_workers", 0);
    const int share_members = cfg.value("share_members", 0);
    for (const auto& r : report.runs) {
        const bool share = r.mode == "idemkafka_share_handler5ms";
        if ((r.mode.rfind("idemkafka_handler5ms_", 0) != 0 && !share) || !r.ok() || r.events_per_s <= 0 ||
            r.slow_calls == 0 || (share ? share_members : handler_workers) < 1)
            continue;
        int parallel = share ? share_members : handler_workers;
        const auto partitions = r.partitions ? static_cast<int>(r.partitions) : cfg.value("partitions_min", 0);
        if (r.mode == "idemkafka_handler5ms_partition" && partitions > 0)
            parallel = std::min(parallel, partitions);
        const double ideal =
            static_cast<double>(r.events) / (static_cast<double>(r.slow_calls) * r.slow_seconds / parallel);
        ordered_json j;
        j["mode"] = r.mode;
        j["dup_percent"] = r.dup_percent;
        j["events"] = r.events;
        j["workers"] = share ? share_members : handler_workers;
        j["parallel"] = parallel;
        j["events_per_s"] = round_to(r.events_per_s, 1);
        j["ideal_events_per_s"] = round_to(ideal, 1);
        j["value"] = round_to(r.events_per_s / ideal, 3);
        out.push_back(std::move(j));
    }
    return out;
}

} // namespace

ordered_json summarise(const Report& report)
{
    ordered_json s;
    const auto& runs = report.runs;
    const auto modes = modes_of(runs);
    const auto dups = dups_of(runs);
    auto has_mode = [&](const std::string& m) { return std::find(modes.begin(), modes.end(), m) != modes.end(); };

    // Ratios at every count both modes ran, then the headline one at the
    // largest such count (the steadiest measurement).
    struct Pair {
        std::string num, den;
        std::optional<double> target;
    };
    std::vector<Pair> pairs = {{"idemkafka_batch", "pg_floor_batch", 0.80},
                               // The same claims in the order a consumer gets them: the
                               // library's own cost, without the claim order's.
                               {"idemkafka_batch", "pg_floor_batch_fetch_order", 0.85},
                               {"pg_floor_batch_fetch_order", "pg_floor_batch", std::nullopt},
                               // The very claims and transactions of idemkafka_batch: all
                               // that is left is the library's own cost; and what its
                               // claims' order costs PostgreSQL alone.
                               {"idemkafka_batch", "pg_floor_batch_library_order", 0.85},
                               {"pg_floor_batch_library_order", "pg_floor_batch", std::nullopt},
                               {"idemkafka_batch_rowwise", "pg_floor_batch_rowwise", std::nullopt},
                               {"idemkafka_batch", "idemkafka_batch_rowwise", std::nullopt},
                               {"idemkafka_per_event", "pg_floor_per_event", 0.90},
                               {"idemkafka_per_event_max_batch1", "pg_floor_per_event", std::nullopt},
                               {"idemkafka_per_event", "idemkafka_per_event_max_batch1", std::nullopt},
                               {"idemkafka_batch", "naive_listener", 20.0},
                               // The Spring Kafka peer (bench/peers/spring), the same
                               // pattern as its users write it.
                               {"idemkafka_batch", "spring_batch", 1.5},
                               {"idemkafka_batch", "spring_per_record", 20.0},
                               {"idemkafka_per_event", "spring_per_record", 1.0},
                               {"idemkafka_per_event", "spring_per_record_manual", std::nullopt},
                               {"spring_per_record_manual", "spring_per_record", std::nullopt},
                               {"pg_floor_batch_rowwise", "pg_floor_batch", std::nullopt},
                               {"idemkafka_batch", "kafka_raw", std::nullopt},
                               {"idemkafka_batch_fingerprint", "idemkafka_batch", std::nullopt},
                               // The cost of partitioning: partitioned (the default) / plain.
                               {"idemkafka_batch", "idemkafka_batch_plain", std::nullopt},
                               // Steady state: a prefilled claims table / an empty one.
                               {"idemkafka_batch_prefilled", "idemkafka_batch", std::nullopt},
                               {"idemkafka_per_event_prefilled", "idemkafka_per_event", std::nullopt}};
    for (const auto& m : modes) {
        if (m.rfind("idemkafka_batch_w", 0) == 0) {
            pairs.push_back({m, "pg_floor_batch", std::nullopt});
            pairs.push_back({m, "idemkafka_batch", std::nullopt});
        }
        // The same parallelism as the Spring peer's containers (--workers N
        // --spring-concurrency N, or N partitions).
        if (m.rfind("idemkafka_batch_w", 0) == 0)
            pairs.push_back({m, "spring_batch", 1.5});
        if (m.rfind("idemkafka_per_event_w", 0) == 0) {
            pairs.push_back({m, "spring_per_record", 1.0});
            pairs.push_back({m, "spring_per_record_manual", std::nullopt});
            pairs.push_back({m, "idemkafka_per_event", std::nullopt});
        }
    }

    ordered_json headline = ordered_json::array();
    ordered_json all = ordered_json::array();
    for (const auto& p : pairs) {
        if (!has_mode(p.num) || !has_mode(p.den))
            continue;
        const std::string name = p.num + " / " + p.den;
        for (int dup : dups) {
            const Result* best_a = nullptr;
            const Result* best_b = nullptr;
            for (const auto& a : runs) {
                if (a.mode != p.num || a.dup_percent != dup)
                    continue;
                if (a.round != 1)
                    continue; // the rounds of one count give one ratio
                const Result* ra = find_run(runs, p.num, dup, a.events);
                const Result* rb = find_run(runs, p.den, dup, a.events);
                if (!ra || !rb)
                    continue;
                const auto over_rounds = rounds_ratio_json(runs, name, p.num, p.den, dup, a.events, p.target);
                all.push_back(over_rounds ? *over_rounds : ratio_json(name, *ra, *rb, p.target));
                if (!best_a || ra->events > best_a->events) {
                    best_a = ra;
                    best_b = rb;
                }
            }
            if (best_a) {
                const auto over_rounds = rounds_ratio_json(runs, name, p.num, p.den, dup, best_a->events, p.target);
                headline.push_back(over_rounds ? *over_rounds : ratio_json(name, *best_a, *best_b, p.target));
            }
            // A slow mode runs on fewer records: also give the ratio of each
            // mode at its own largest count, marked by the differing counts.
            const auto la = largest(runs, p.num, dup);
            const auto lb = largest(runs, p.den, dup);
            if (la && lb && *la != *lb && (!best_a || *la != best_a->events || *lb != best_b->events))
                headline.push_back(
                    ratio_json(name, *find_run(runs, p.num, dup, *la), *find_run(runs, p.den, dup, *lb), p.target));
        }
    }
    s["ratios"] = headline;
    s["ratios_by_count"] = all;
    s["mixed_ideal"] = mixed_ideal(report);

    // Library CPU per event. app_threads is the consumer thread: the library,
    // decode, handler and the libpq/libpqxx client. The floor's client (libpqxx
    // issuing the same statements, nothing else) is the share the library
    // cannot avoid; the rest is the library's own.
    ordered_json cpu = ordered_json::array();
    for (const auto& m : modes) {
        if (m.rfind("idemkafka", 0) != 0)
            continue;
        for (int dup : dups) {
            const auto n = largest(runs, m, dup);
            if (!n)
                continue;
            const Result* r = find_run(runs, m, dup, *n);
            if (!r->has_cpu)
                continue;
            ordered_json j;
            j["mode"] = m;
            j["dup_percent"] = dup;
            j["events"] = *n;
            j["process_us_per_event"] = round_to(r->cpu.process, 2);
            j["app_threads_us_per_event"] = round_to(r->cpu.app, 2);
            j["rdkafka_threads_us_per_event"] = round_to(r->cpu.rdkafka, 2);
            const std::string floor_mode = m.rfind("idemkafka_per_event", 0) == 0 ? "pg_floor_per_event"
                                           : m == "idemkafka_batch_rowwise"       ? "pg_floor_batch_rowwise"
                                                                                  : "pg_floor_batch";
            if (const Result* f = find_run(runs, floor_mode, dup, *n); f && f->has_cpu) {
                j["floor_client_us_per_event"] = round_to(f->cpu.app, 2);
                j["floor_mode"] = floor_mode;
                j["library_us_per_event_estimate"] = round_to(std::max(0.0, r->cpu.app - f->cpu.app), 2);
            }
            j["target_us"] = 5.0;
            cpu.push_back(j);
        }
    }
    s["library_cpu"] = cpu;

    // Peak RSS at the largest count against the smallest, per mode.
    ordered_json rss = ordered_json::array();
    for (const auto& m : modes) {
        for (int dup : dups) {
            const Result* small = nullptr;
            const Result* big = nullptr;
            for (const auto& r : runs) {
                if (r.mode != m || r.dup_percent != dup || !r.ok())
                    continue;
                if (!small || r.events < small->events)
                    small = &r;
                if (!big || r.events > big->events)
                    big = &r;
            }
            if (!small || small == big)
                continue;
            ordered_json j;
            j["mode"] = m;
            j["dup_percent"] = dup;
            j["events_small"] = small->events;
            j["events_large"] = big->events;
            j["peak_small_mb"] = round_to(small->rss_peak_mb, 1);
            j["peak_large_mb"] = round_to(big->rss_peak_mb, 1);
            j["growth_small_mb"] = round_to(std::max(0.0, small->rss_peak_mb - small->rss_start_mb), 1);
            j["growth_large_mb"] = round_to(std::max(0.0, big->rss_peak_mb - big->rss_start_mb), 1);
            j["peak_ratio"] = round_to(big->rss_peak_mb / small->rss_peak_mb, 2);
            // The harness keeps every produced record for verification (and
            // earlier modes leave heap behind), so its own RSS at the start of
            // a run grows with the count. What a consumer process would weigh:
            // the small run's start RSS plus each run's growth.
            const double base = small->rss_start_mb;
            const double grown_small = std::max(0.0, small->rss_peak_mb - small->rss_start_mb);
            const double grown_large = std::max(0.0, big->rss_peak_mb - big->rss_start_mb);
            const double footprint = (base + grown_large) / (base + grown_small);
            j["footprint_ratio"] = round_to(footprint, 2);
            if (m.rfind("idemkafka", 0) == 0) {
                j["target"] = 1.5;
                j["met"] = footprint <= 1.5;
            }
            rss.push_back(j);
        }
    }
    s["rss"] = rss;
    return s;
}

ordered_json to_json(const Report& report)
{
    ordered_json j;
    j["meta"] = report.meta;
    ordered_json runs = ordered_json::array();
    for (const auto& r : report.runs)
        runs.push_back(run_json(r));
    j["runs"] = runs;
    ordered_json paced = ordered_json::array();
    for (const auto& r : report.paced)
        paced.push_back(run_json(r));
    j["latency"] = paced;
    j["summary"] = summarise(report);
    std::vector<std::string> errors = report.errors;
    for (const auto* list : {&report.runs, &report.paced})
        for (const auto& r : *list)
            for (const auto& e : r.errors)
                errors.push_back(fmt::format("{} dup={}% events={}{}: {}", r.mode, r.dup_percent, r.events,
                                             r.paced ? " (paced)" : "", e));
    j["errors"] = errors;
    j["ok"] = errors.empty();
    return j;
}

void print_tables(std::ostream& out, const Report& report, const ordered_json& summary)
{
    out << "\nthroughput: each mode drains the same backlog (seconds = first record taken -> last effect "
           "committed)\n";
    out << fmt::format("{:<30} {:>4} {:>8} {:>8} {:>8} {:>10} {:>7} {:>8} {:>8}   {:>6} {:>6} {:>6} {:>6} {:>6} "
                       "{:>5}   {:>6} {:>6}  {}\n",
                       "", "dup", "events", "unique", "seconds", "events/s", "rec/tx", "take->commit ms", "",
                       "CPU us/event", "", "", "", "", "other", "RSS MB", "", "");
    out << fmt::format("{:<30} {:>4} {:>8} {:>8} {:>8} {:>10} {:>7} {:>8} {:>8}   {:>6} {:>6} {:>6} {:>6} {:>6} "
                       "{:>5}   {:>6} {:>6}  {}\n",
                       "mode", "%", "", "", "", "", "", "p50", "p99", "proc", "app", "rdk", "pg", "broker", "cores",
                       "peak", "growth", "status");
    for (const auto& r : report.runs) {
        const auto j = run_json(r);
        const auto& cpu = j["cpu_us_per_event"];
        const auto& lat = j["latency_ms"]["taken_to_commit"];
        out << fmt::format(
            "{:<30} {:>4} {:>8} {:>8} {:>8.2f} {:>10.0f} {:>7} {:>8} {:>8}   {:>6} {:>6} {:>6} {:>6} {:>6} {:>5}   "
            "{:>6.1f} {:>6.1f}  {}\n",
            r.mode, r.dup_percent, r.events, r.unique, r.seconds, r.events_per_s,
            r.transactions ? cell(j["records_per_transaction"]) : "-", lat.is_null() ? "-" : cell(lat["p50"], 2),
            lat.is_null() ? "-" : cell(lat["p99"], 2), cpu.is_null() ? "-" : cell(cpu["process"]),
            cpu.is_null() ? "-" : cell(cpu["app_threads"]), cpu.is_null() ? "-" : cell(cpu["rdkafka_threads"]),
            cpu.is_null() ? "-" : cell(cpu["postgres"]), cpu.is_null() ? "-" : cell(cpu["broker"]),
            cpu.is_null() ? "-" : cell(j["other_processes_cores"], 2), r.rss_peak_mb,
            std::max(0.0, r.rss_peak_mb - r.rss_start_mb), r.ok() ? "ok" : "ERROR: " + r.errors.front());
    }

    bool any_spread = false;
    for (const auto& r : report.runs)
        any_spread = any_spread || r.lag_spread_samples > 0;
    if (any_spread) {
        out << "\nper-partition lag spread while draining: largest minus smallest partition lag, records "
               "(sampled every 200 ms)\n";
        out << fmt::format("{:<28} {:>4} {:>8} {:>10} {:>10} {:>10} {:>8}\n", "mode", "dup%", "events", "per part.",
                           "max", "mean", "samples");
        for (const auto& r : report.runs)
            if (r.lag_spread_samples > 0)
                out << fmt::format("{:<28} {:>4} {:>8} {:>10} {:>10.0f} {:>10.0f} {:>8}\n", r.mode, r.dup_percent,
                                   r.events, r.partitions ? r.events / r.partitions : 0, r.lag_spread_max,
                                   r.lag_spread_mean, r.lag_spread_samples);
    }

    print_kill9(out, report);

    if (!report.paced.empty()) {
        out << fmt::format("\nlatency: produce timestamp -> effect committed, records produced during the run at "
                           "{:.0f} events/s\n",
                           report.paced.front().rate);
        out << fmt::format("{:<30} {:>4} {:>8} {:>9} {:>9} {:>9}  {}\n", "mode", "dup%", "events", "p50 ms", "p99 ms",
                           "max ms", "status");
        for (const auto& r : report.paced)
            out << fmt::format("{:<30} {:>4} {:>8} {:>9.2f} {:>9.2f} {:>9.2f}  {}\n", r.mode, r.dup_percent, r.events,
                               r.end_to_end.percentile_ms(50), r.end_to_end.percentile_ms(99), r.end_to_end.max_ms(),
                               r.ok() ? "ok" : "ERROR: " + r.errors.front());
    }

    out << "\nratios of events/s (same count unless the counts differ)\n";
    for (const auto& j : summary["ratios"]) {
        std::string target;
        if (j.contains("target"))
            target =
                fmt::format("  target >= {}: {}", j["target"].get<double>(), j["met"].get<bool>() ? "met" : "MISSED");
        const auto en = j["events_numerator"].get<double>();
        const auto ed = j["events_denominator"].get<double>();
        std::string range;
        if (j.contains("rounds"))
            range = fmt::format("  (median of {} rounds, {:.3f}-{:.3f})", j["rounds"].get<int>(),
                                j["min"].get<double>(), j["max"].get<double>());
        out << fmt::format("  {:<52} dup {:>2}%  at {:>9}  {:>8.3f}{}{}\n", j["name"].get<std::string>(),
                           j["dup_percent"].get<int>(), en == ed ? si(en) : si(en) + " vs " + si(ed),
                           j["value"].get<double>(), target, range);
    }

    if (summary.contains("mixed_ideal") && !summary["mixed_ideal"].empty()) {
        out << "\nhandler-time workloads against their ideal (mixed: max of slow handler time / workers and the "
               "fast path's time; 5 ms: handler time / workers running at once)\n";
        for (const auto& j : summary["mixed_ideal"])
            out << fmt::format(
                "  {:<32} {:>3} workers  dup {:>2}%  at {:>7}  {:>9.1f} events/s  ideal {:>9.1f}  {:>6.3f}{}\n",
                j["mode"].get<std::string>(), j["workers"].get<int>(), j.value("dup_percent", 0),
                si(j["events"].get<double>()), j["events_per_s"].get<double>(), j["ideal_events_per_s"].get<double>(),
                j["value"].get<double>(),
                j.contains("met") ? (j["met"].get<bool>() ? "  target >= 0.8: met" : "  target >= 0.8: MISSED") : "");
    }

    out << "\nlibrary CPU per event (us; app = consumer thread incl. libpq client, rdk = librdkafka threads)\n";
    for (const auto& j : summary["library_cpu"]) {
        out << fmt::format("  {:<30} dup {:>2}%  at {:>5}  process {:>6.2f}  app {:>6.2f}  rdk {:>6.2f}",
                           j["mode"].get<std::string>(), j["dup_percent"].get<int>(), si(j["events"].get<double>()),
                           j["process_us_per_event"].get<double>(), j["app_threads_us_per_event"].get<double>(),
                           j["rdkafka_threads_us_per_event"].get<double>());
        if (j.contains("library_us_per_event_estimate"))
            out << fmt::format("  minus {} client {:.2f} = {:.2f}", j["floor_mode"].get<std::string>(),
                               j["floor_client_us_per_event"].get<double>(),
                               j["library_us_per_event_estimate"].get<double>());
        out << "\n";
    }

    out << "\npeak RSS, largest vs smallest count (process peak, growth during the run; footprint = the\n"
           "smaller run's start RSS + each run's growth, since the harness's own data grows with the count)\n";
    for (const auto& j : summary["rss"]) {
        out << fmt::format(
            "  {:<30} dup {:>2}%  {:>5}: {:>7.1f} MB (+{:.1f})  {:>5}: {:>7.1f} MB (+{:.1f})  peak x{:.2f}  "
            "footprint x{:.2f}{}\n",
            j["mode"].get<std::string>(), j["dup_percent"].get<int>(), si(j["events_small"].get<double>()),
            j["peak_small_mb"].get<double>(), j["growth_small_mb"].get<double>(), si(j["events_large"].get<double>()),
            j["peak_large_mb"].get<double>(), j["growth_large_mb"].get<double>(), j["peak_ratio"].get<double>(),
            j["footprint_ratio"].get<double>(),
            j.contains("met") ? (j["met"].get<bool>() ? "  (target <= 1.5: met)" : "  (target <= 1.5: MISSED)") : "");
    }
    for (const auto& e : report.errors)
        out << "ERROR: " << e << "\n";
}

void write_plot_data(std::ostream& out, const std::string& json_path)
{
    std::ifstream in(json_path);
    if (!in)
        throw std::runtime_error("cannot read " + json_path);
    const auto j = ordered_json::parse(in);
    // mode -> dup -> (events, events/s) at the largest count that ran OK.
    std::vector<std::string> modes;
    std::set<int> dups;
    std::map<std::string, std::map<int, std::pair<double, double>>> best;
    for (const auto& r : j.at("runs")) {
        if (!r.at("ok").get<bool>())
            continue;
        const auto mode = r.at("mode").get<std::string>();
        const int dup = r.at("dup_percent").get<int>();
        const double events = r.at("events").get<double>();
        if (std::find(modes.begin(), modes.end(), mode) == modes.end())
            modes.push_back(mode);
        dups.insert(dup);
        auto& slot = best[mode][dup];
        if (events >= slot.first)
            slot = {events, r.at("events_per_s").get<double>()};
    }
    // Header row (gnuplot's columnhead): the bar titles.
    // Ceiling first, then the batch modes and their floors, then the per-record ones.
    auto rank = [](const std::string& m) {
        static const std::vector<std::string> order = {"kafka_raw",
                                                       "pg_floor_batch",
                                                       "idemkafka_batch",
                                                       "idemkafka_batch_w",
                                                       "spring_batch",
                                                       "pg_floor_batch_rowwise",
                                                       "idemkafka_batch_rowwise",
                                                       "pg_floor_per_event",
                                                       "idemkafka_per_event",
                                                       "idemkafka_per_event_max_batch1",
                                                       "idemkafka_per_event_w",
                                                       "spring_per_record",
                                                       "spring_per_record_manual",
                                                       "naive_listener"};
        for (std::size_t i = 0; i < order.size(); ++i)
            if (m.rfind(order[i], 0) == 0 && (m == order[i] || order[i].back() == 'w'))
                return i;
        return order.size();
    };
    std::stable_sort(modes.begin(), modes.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    out << "\"mode\"";
    for (int d : dups)
        out << "\t\"" << d << "% re-sends\"";
    out << "\n";
    for (const auto& m : modes) {
        // The label names the count, which differs for the slow modes.
        std::set<double> counts;
        for (const auto& [dup, v] : best[m])
            counts.insert(v.first);
        std::string label = m;
        for (double c : counts)
            label += (c == *counts.begin() ? " @" : "/") + si(c);
        out << '"' << label << '"';
        for (int d : dups) {
            auto it = best[m].find(d);
            out << '\t' << (it == best[m].end() ? std::string("NaN") : fmt::format("{:.0f}", it->second.second));
        }
        out << "\n";
    }
}

} // namespace idemkafka::bench
