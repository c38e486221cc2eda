#include "bench_util.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <dirent.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include <idemkafka/error.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/schema.hpp>
#include <idemkafka/store.hpp>

namespace idemkafka::bench {

// ---- clocks ----------------------------------------------------------------

std::int64_t wall_us() noexcept
{
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::int64_t steady_us() noexcept
{
    return std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now().time_since_epoch()).count();
}

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) noexcept
{
    return std::chrono::duration<double>(b - a).count();
}

// ---- histogram -------------------------------------------------------------

std::size_t Histogram::index_of(std::uint64_t v) noexcept
{
    if (v < sub)
        return static_cast<std::size_t>(v);
    const int top = 63 - __builtin_clzll(v);
    const int shift = top - sub_bits;
    const auto mantissa = static_cast<std::size_t>(v >> shift) - sub;
    return sub + static_cast<std::size_t>(shift) * sub + mantissa;
}

std::uint64_t Histogram::value_of(std::size_t index) noexcept
{
    if (index < sub)
        return index;
    const std::size_t shift = (index - sub) / sub;
    const std::size_t mantissa = (index - sub) % sub;
    const std::uint64_t lower = static_cast<std::uint64_t>(sub + mantissa) << shift;
    return lower + ((std::uint64_t{1} << shift) >> 1);
}

void Histogram::record(std::int64_t us) noexcept
{
    if (us < 0)
        us = 0; // clock steps: count it, as zero
    ++counts_[index_of(static_cast<std::uint64_t>(us))];
    ++count_;
    max_ = std::max(max_, us);
}

void Histogram::merge(const Histogram& other) noexcept
{
    for (std::size_t i = 0; i < buckets; ++i)
        counts_[i] += other.counts_[i];
    count_ += other.count_;
    max_ = std::max(max_, other.max_);
}

double Histogram::percentile_ms(double p) const noexcept
{
    if (count_ == 0)
        return 0;
    auto rank = static_cast<std::uint64_t>(std::ceil(p / 100.0 * static_cast<double>(count_)));
    rank = std::clamp<std::uint64_t>(rank, 1, count_);
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < buckets; ++i) {
        seen += counts_[i];
        if (seen >= rank) {
            const auto v = std::min<std::uint64_t>(value_of(i), static_cast<std::uint64_t>(max_));
            return static_cast<double>(v) / 1000.0;
        }
    }
    return max_ms();
}

void LatencyRecorder::record(std::int64_t produced_us, std::int64_t taken_us, std::int64_t now_wall,
                             std::int64_t now_steady)
{
    std::lock_guard<std::mutex> lock(mu_);
    e2e_.record(now_wall - produced_us);
    if (taken_us >= 0)
        taken_.record(now_steady - taken_us);
}

Histogram LatencyRecorder::end_to_end() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return e2e_;
}

Histogram LatencyRecorder::taken_to_commit() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return taken_;
}

std::uint64_t LatencyRecorder::count() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return e2e_.count();
}

// ---- CPU and memory --------------------------------------------------------

namespace {

std::string read_file(const std::string& path)
{
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Fields of /proc/PID/stat after the command name (which may hold spaces):
// index 0 is the state (field 3 of proc(5)).
std::vector<std::string> stat_fields(int pid)
{
    const std::string s = read_file(fmt::format("/proc/{}/stat", pid));
    const auto close = s.rfind(')');
    std::vector<std::string> out;
    if (close == std::string::npos)
        return out;
    std::istringstream in(s.substr(close + 2));
    for (std::string f; in >> f;)
        out.push_back(f);
    return out;
}

double ticks_to_seconds(const std::string& ticks)
{
    static const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
    return std::strtod(ticks.c_str(), nullptr) / hz;
}

int parent_of(int pid)
{
    const auto f = stat_fields(pid);
    return f.size() > 1 ? std::atoi(f[1].c_str()) : 0;
}

std::vector<int> all_pids()
{
    std::vector<int> out;
    if (DIR* d = opendir("/proc")) {
        while (dirent* e = readdir(d)) {
            const int pid = std::atoi(e->d_name);
            if (pid > 0)
                out.push_back(pid);
        }
        closedir(d);
    }
    return out;
}

std::string trim(std::string s)
{
    while (!s.empty() && (s.back() == '\n' || s.back() == ' '))
        s.pop_back();
    return s;
}

} // namespace

Meter::Meter(int pg_backend_pid, const std::string& broker_control)
{
    if (pg_backend_pid > 0) {
        const int parent = parent_of(pg_backend_pid);
        // Only a server on this machine (same pid namespace) can be measured.
        if (parent > 0 && trim(read_file(fmt::format("/proc/{}/comm", parent))).rfind("postgres", 0) == 0)
            postmaster_ = parent;
    }
    if (!broker_control.empty()) {
        for (int pid : all_pids()) {
            const std::string cmd = read_file(fmt::format("/proc/{}/cmdline", pid));
            std::size_t start = 0;
            bool after_flag = false;
            while (start < cmd.size()) {
                const auto end = cmd.find('\0', start);
                const std::string arg = cmd.substr(start, end == std::string::npos ? std::string::npos : end - start);
                if ((after_flag && arg == broker_control) || arg == "--control=" + broker_control) {
                    broker_ = pid;
                    break;
                }
                after_flag = arg == "--control";
                if (end == std::string::npos)
                    break;
                start = end + 1;
            }
            if (broker_)
                break;
        }
    }
}

namespace {

// Nanosecond CPU time of every thread of `pid` (schedstat), in seconds: tick
// sampling (stat's utime) misattributes the short bursts of a process that
// sleeps on every round trip, which is what a backend serving one statement at
// a time does.
double threads_cpu(int pid)
{
    double total = 0;
    const std::string dir = fmt::format("/proc/{}/task", pid);
    if (DIR* d = opendir(dir.c_str())) {
        while (dirent* e = readdir(d)) {
            if (std::atoi(e->d_name) <= 0)
                continue;
            total += std::strtod(read_file(dir + "/" + e->d_name + "/schedstat").c_str(), nullptr) / 1e9;
        }
        closedir(d);
    }
    return total;
}

} // namespace

double Meter::postgres_cpu() const
{
    // Backends that exited are only in the postmaster's cutime/cstime (ticks);
    // live processes are read at nanosecond resolution.
    const auto f = stat_fields(postmaster_);
    double total = threads_cpu(postmaster_);
    if (f.size() > 14)
        total += ticks_to_seconds(f[13]) + ticks_to_seconds(f[14]);
    for (int pid : all_pids())
        if (pid != postmaster_ && parent_of(pid) == postmaster_)
            total += threads_cpu(pid);
    return total;
}

CpuSample Meter::sample() const
{
    CpuSample s;
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    s.process = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (DIR* d = opendir("/proc/self/task")) {
        while (dirent* e = readdir(d)) {
            const int tid = std::atoi(e->d_name);
            if (tid <= 0)
                continue;
            const std::string base = fmt::format("/proc/self/task/{}/", tid);
            const std::string sched = read_file(base + "schedstat");
            // schedstat: nanoseconds on CPU first; finer than the tick counts in stat.
            const double ns = std::strtod(sched.c_str(), nullptr);
            s.threads[tid] = {trim(read_file(base + "comm")), ns / 1e9};
        }
        closedir(d);
    }
    {
        // First line of /proc/stat: user nice system idle iowait irq softirq steal ...
        std::istringstream in(read_file("/proc/stat"));
        std::string cpu;
        double v[8] = {};
        in >> cpu;
        for (double& x : v)
            in >> x;
        static const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
        s.machine_busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
    }
    if (postmaster_ > 0)
        s.postgres = postgres_cpu();
    if (broker_ > 0)
        s.broker = threads_cpu(broker_);
    return s;
}

CpuSplit Meter::split(const CpuSample& a, const CpuSample& b, std::size_t events)
{
    const double n = events ? static_cast<double>(events) : 1.0;
    CpuSplit out;
    out.process = (b.process - a.process) / n * 1e6;
    double rdkafka = 0;
    for (const auto& [tid, t] : b.threads) {
        if (t.first.rfind("rdk:", 0) != 0)
            continue;
        auto before = a.threads.find(tid);
        rdkafka += t.second - (before == a.threads.end() ? 0.0 : before->second.second);
    }
    out.rdkafka = rdkafka / n * 1e6;
    out.app = std::max(0.0, out.process - out.rdkafka);
    if (a.postgres >= 0 && b.postgres >= 0)
        out.postgres = (b.postgres - a.postgres) / n * 1e6;
    if (a.broker >= 0 && b.broker >= 0)
        out.broker = (b.broker - a.broker) / n * 1e6;
    const double wall = seconds_between(a.at, b.at);
    if (wall > 0) {
        double ours = b.process - a.process;
        if (a.postgres >= 0 && b.postgres >= 0)
            ours += b.postgres - a.postgres;
        if (a.broker >= 0 && b.broker >= 0)
            ours += b.broker - a.broker;
        out.other_cores = std::max(0.0, (b.machine_busy - a.machine_busy - ours) / wall);
    }
    return out;
}

namespace {

double status_mb(const char* field)
{
    std::ifstream in("/proc/self/status");
    const std::size_t len = std::strlen(field);
    for (std::string line; std::getline(in, line);)
        if (line.compare(0, len, field) == 0)
            return std::strtod(line.c_str() + len + 1, nullptr) / 1024.0;
    return 0;
}

} // namespace

void Meter::reset_peak()
{
    malloc_trim(0);
    // "5" resets VmHWM to the current RSS (Linux 4.0+).
    if (std::FILE* f = std::fopen("/proc/self/clear_refs", "w")) {
        std::fputs("5", f);
        std::fclose(f);
    }
}

double Meter::rss_mb()
{
    return status_mb("VmRSS:");
}

double Meter::peak_rss_mb()
{
    return status_mb("VmHWM:");
}

// ---- data ------------------------------------------------------------------

namespace {

std::uint64_t mix(std::uint64_t x) noexcept
{
    // splitmix64 finaliser: cheap, stateless, good enough to spread indices.
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

} // namespace

Dataset::Dataset(int dup_percent, std::uint64_t seed)
    : dup_percent_(std::clamp(dup_percent, 0, 99)), seed_(seed),
      // Ids carry the time of the run, like freshly minted ones: an age-based
      // retention guard must not treat them as ancient.
      base_ms_(static_cast<std::uint64_t>(wall_us() / 1000))
{
}

Dataset::Rec Dataset::at(std::size_t seq) const noexcept
{
    const std::size_t dups = dups_before(seq);
    const std::size_t uniques = seq - dups;
    // Bresenham-style spacing: exactly dup_percent of every prefix are re-sends.
    if (dups_before(seq + 1) > dups && uniques > 0) {
        const auto target = static_cast<std::size_t>(mix(seed_ ^ (seq * 0xD6E8FEB86659FD93ULL)) % uniques);
        return {seq, target, true};
    }
    return {seq, uniques, false};
}

EventId Dataset::id_of(std::size_t event) const noexcept
{
    const std::uint64_t e = event;
    return EventId::from_v7_parts(base_ms_ + e / 4096, static_cast<std::uint16_t>(e % 4096),
                                  mix(seed_ + e) & ((std::uint64_t{1} << 62) - 1));
}

std::string Dataset::key_of(std::size_t event) const
{
    return fmt::format("acct-{}", event % 10007);
}

std::int64_t amount_of(const EventId& id) noexcept
{
    return (static_cast<std::int64_t>(id.bytes()[14]) << 8) | id.bytes()[15];
}

std::string encode_payload(const EventId& id, std::size_t seq, std::int64_t produced_us)
{
    // 36 + 2 separators + at most 20 digits each: always fits.
    char buf[96];
    id.format_to(buf);
    buf[36] = ',';
    char* const end = buf + sizeof buf;
    const auto a = std::to_chars(buf + 37, end - 21, seq);
    *a.ptr = ',';
    const auto b = std::to_chars(a.ptr + 1, end, produced_us);
    return std::string(buf, static_cast<std::size_t>(b.ptr - buf));
}

Decoded decode_payload(std::string_view payload)
{
    if (payload.size() < 40 || payload[36] != ',')
        throw DecodeError(fmt::format("expected \"<event id>,<seq>,<timestamp>\", got {} bytes", payload.size()));
    Decoded d;
    d.id = EventId::parse(payload.substr(0, 36));
    std::memcpy(d.id_text.data(), payload.data(), 36);
    d.id_text[36] = '\0';
    const char* p = payload.data() + 37;
    const char* end = payload.data() + payload.size();
    auto r = std::from_chars(p, end, d.seq);
    if (r.ec != std::errc() || r.ptr == end || *r.ptr != ',')
        throw DecodeError("bad sequence number");
    r = std::from_chars(r.ptr + 1, end, d.produced_us);
    if (r.ec != std::errc() || r.ptr != end)
        throw DecodeError("bad timestamp");
    return d;
}

bool SeenSet::mark(std::int64_t seq) noexcept
{
    if (seq < 0 || static_cast<std::size_t>(seq) >= n_)
        return false;
    const auto i = static_cast<std::size_t>(seq);
    const std::uint64_t bit = std::uint64_t{1} << (i % 64);
    if (bits_[i / 64] & bit)
        return false;
    bits_[i / 64] |= bit;
    ++distinct_;
    return true;
}

// ---- PostgreSQL ------------------------------------------------------------

void create_claims_table(pqxx::connection& conn, const std::string& schema, const std::string& table,
                         RetentionMode mode)
{
    SchemaSpec spec;
    spec.schema = schema;
    spec.claims_table = table;
    spec.retention.mode = mode;
    migrate_schema(conn, spec);
}

Tables table_names(const std::string& schema, const std::string& mode, const ClaimsLayout& layout)
{
    Tables t;
    t.schema = schema;
    const bool prefilled = !layout.prefilled_table.empty();
    t.claims = prefilled ? layout.prefilled_table : mode + "_claims";
    t.effect = mode + "_effect";
    const ProcessedEventStore store(schema, t.claims);
    t.claims_q = store.qualified_name();
    t.effect_q = quote_identifier(schema) + "." + quote_identifier(t.effect);
    t.insert_effect = fmt::format(
        "INSERT INTO {} (event_id, entity, amount, produced_us) VALUES ($1::uuid, $2::text, $3::bigint, $4::bigint)",
        t.effect_q);
    t.insert_effects_unnest = fmt::format("INSERT INTO {} (event_id, entity, amount, produced_us) "
                                          "SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bigint[])",
                                          t.effect_q);
    if (prefilled)
        t.claims_of_run = fmt::format("event_id >= '{}'::uuid", layout.run_ids_from.to_string());
    return t;
}

Tables prepare_tables(const std::string& conninfo, const std::string& schema, const std::string& mode,
                      const ClaimsLayout& layout)
{
    const Tables t = table_names(schema, mode, layout);
    const bool prefilled = !layout.prefilled_table.empty();
    pqxx::connection conn(conninfo);
    if (!prefilled)
        create_claims_table(conn, schema, t.claims, layout.mode);
    std::size_t deleted = 0;
    {
        pqxx::work tx(conn);
        tx.exec(fmt::format("CREATE TABLE IF NOT EXISTS {} (event_id uuid NOT NULL, entity text NOT NULL,"
                            " amount bigint NOT NULL, produced_us bigint NOT NULL)",
                            t.effect_q));
        if (prefilled) {
            tx.exec(fmt::format("TRUNCATE {}", t.effect_q));
            // Earlier runs' claims sit above the prefill: gone, so that every
            // run meets the prefill alone, as an empty-table run meets nothing.
            deleted = tx.exec(fmt::format("DELETE FROM {} WHERE {}", t.claims_q, t.claims_of_run)).affected_rows();
        } else {
            tx.exec(fmt::format("TRUNCATE {}, {}", t.claims_q, t.effect_q));
        }
        tx.commit();
    }
    pqxx::nontransaction tx(conn);
    if (deleted > 0)
        tx.exec(fmt::format("VACUUM {}", t.claims_q)); // their index entries too, as autovacuum would
    try {
        tx.exec("CHECKPOINT");
    } catch (const pqxx::sql_error&) {
        // Not a superuser on an external server: runs may then share a checkpoint.
    }
    return t;
}

DbCounts count_rows(const std::string& conninfo, const Tables& t)
{
    pqxx::connection conn(conninfo);
    pqxx::nontransaction tx(conn);
    DbCounts c;
    const auto r = tx.exec(fmt::format("SELECT count(*), count(DISTINCT event_id) FROM {}", t.effect_q));
    c.effects = r[0][0].as<std::int64_t>();
    c.distinct_effects = r[0][1].as<std::int64_t>();
    c.claims = tx.exec(fmt::format("SELECT count(*) FROM {}{}", t.claims_q,
                                   t.claims_of_run.empty() ? "" : " WHERE " + t.claims_of_run))[0][0]
                   .as<std::int64_t>();
    return c;
}

void prepare_once(pqxx::connection_base& conn, const std::string& name, const std::string& sql)
{
    static std::mutex mu;
    static std::set<std::pair<const void*, std::string>> done;
    std::lock_guard<std::mutex> lock(mu);
    if (done.emplace(&conn, name).second)
        conn.prepare(name, sql);
}

// ---- Kafka -----------------------------------------------------------------

namespace {

struct RkDeleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
};
using RkPtr = std::unique_ptr<rd_kafka_t, RkDeleter>;

RkPtr make_client(const Services& s, rd_kafka_type_t type)
{
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", s.brokers.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        throw std::runtime_error(err);
    }
    RkPtr rk(rd_kafka_new(type, conf, err, sizeof err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        throw std::runtime_error(fmt::format("cannot create Kafka client: {}", err));
    }
    return rk;
}

// Partition count of `topic`, 0 if the metadata does not list it. Lists all
// topics: naming the topic in the request could auto-create it.
int partition_count(rd_kafka_t* rk, const std::string& topic)
{
    const rd_kafka_metadata_t* md = nullptr;
    int count = 0;
    if (rd_kafka_metadata(rk, 1, nullptr, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        for (int t = 0; t < md->topic_cnt; ++t)
            if (md->topics[t].topic == topic && md->topics[t].err == RD_KAFKA_RESP_ERR_NO_ERROR)
                count = md->topics[t].partition_cnt;
    }
    if (md)
        rd_kafka_metadata_destroy(md);
    return count;
}

} // namespace

std::map<std::string, std::string> common_consumer_props()
{
    return {
        {"session.timeout.ms", "6000"},
        {"heartbeat.interval.ms", "500"},
        {"auto.offset.reset", "earliest"},
        {"isolation.level", "read_committed"},
        {"enable.partition.eof", "false"},
        // The mock broker answers an empty fetch only after the full wait (a
        // real broker answers as soon as data arrives): the 500 ms default
        // would put up to half a second of mock artefact into every latency.
        // A drain never waits on it: fetches there always find data.
        {"fetch.wait.max.ms", "5"},
    };
}

void create_topic(const Services& s, const std::string& name, int partitions)
{
    auto rk = make_client(s, RD_KAFKA_PRODUCER);
    if (!s.mock_control.empty()) {
        // The mock cluster has no CreateTopics API; its control FIFO creates topics.
        const std::string line = fmt::format("create-topic {} {}\n", name, partitions);
        std::FILE* f = std::fopen(s.mock_control.c_str(), "w");
        if (!f)
            throw std::runtime_error("cannot open mock broker control FIFO " + s.mock_control);
        const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
        std::fclose(f);
        if (!ok)
            throw std::runtime_error("cannot write to mock broker control FIFO " + s.mock_control);
    } else {
        char err[512];
        rd_kafka_NewTopic_t* nt = rd_kafka_NewTopic_new(name.c_str(), partitions, -1, err, sizeof err);
        if (!nt)
            throw std::runtime_error(fmt::format("creating topic {}: {}", name, err));
        rd_kafka_queue_t* q = rd_kafka_queue_new(rk.get());
        rd_kafka_CreateTopics(rk.get(), &nt, 1, nullptr, q);
        rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 30000);
        std::string failure = ev ? "" : "CreateTopics timed out";
        if (ev && rd_kafka_event_error(ev))
            failure = rd_kafka_event_error_string(ev);
        if (ev)
            rd_kafka_event_destroy(ev);
        rd_kafka_queue_destroy(q);
        rd_kafka_NewTopic_destroy(nt);
        if (!failure.empty())
            throw std::runtime_error(fmt::format("creating topic {}: {}", name, failure));
    }
    for (int i = 0; i < 200; ++i) {
        if (partition_count(rk.get(), name) == partitions)
            return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error(fmt::format("topic {} did not show {} partitions in time", name, partitions));
}

Watermarks watermarks(const Services& s, const std::string& topic)
{
    auto rk = make_client(s, RD_KAFKA_PRODUCER);
    Watermarks w;
    w.partitions = partition_count(rk.get(), topic);
    w.low_min = w.partitions > 0 ? INT64_MAX : 0;
    for (int p = 0; p < w.partitions; ++p) {
        std::int64_t lo = 0, hi = 0;
        const auto err = rd_kafka_query_watermark_offsets(rk.get(), topic.c_str(), p, &lo, &hi, 10000);
        if (err)
            throw std::runtime_error(fmt::format("watermarks of {}/{}: {}", topic, p, rd_kafka_err2str(err)));
        w.high_sum += hi;
        w.low_min = std::min(w.low_min, lo);
    }
    return w;
}

std::int64_t committed_sum(const Services& s, const std::string& topic, const std::string& group)
{
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", s.brokers.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "group.id", group.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err) != RD_KAFKA_CONF_OK) {
        rd_kafka_conf_destroy(conf);
        throw std::runtime_error(err);
    }
    RkPtr rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        throw std::runtime_error(fmt::format("cannot create Kafka consumer: {}", err));
    }
    const int partitions = partition_count(rk.get(), topic);
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; ++p)
        rd_kafka_topic_partition_list_add(list, topic.c_str(), p);
    const auto e = rd_kafka_committed(rk.get(), list, 10000);
    std::int64_t sum = 0;
    for (int i = 0; i < list->cnt; ++i)
        sum += std::max<std::int64_t>(0, list->elems[i].offset);
    rd_kafka_topic_partition_list_destroy(list);
    rd_kafka_consumer_close(rk.get());
    if (e)
        throw std::runtime_error(fmt::format("committed offsets of {} on {}: {}", group, topic, rd_kafka_err2str(e)));
    return sum;
}

namespace {

PublisherConfig publisher_config(const Services& s, std::map<std::string, std::string> props)
{
    PublisherConfig cfg;
    cfg.brokers = s.brokers;
    cfg.kafka = std::move(props);
    cfg.log = stderr_sink(LogLevel::warning);
    return cfg;
}

} // namespace

void produce_all(const Services& s, const std::string& topic, const Dataset& data, std::size_t count,
                 std::size_t batch_messages)
{
    // Large batches: fewer message sets per partition in the mock's log, and
    // the data is produced before any timed run starts. A consumer gets each
    // partition in runs of a record batch at least (--producer-batch).
    Publisher pub(publisher_config(s, {{"linger.ms", "20"},
                                       {"batch.num.messages", std::to_string(batch_messages)},
                                       {"queue.buffering.max.messages", "1000000"},
                                       {"queue.buffering.max.kbytes", "1048576"}}));
    for (std::size_t seq = 0; seq < count; ++seq) {
        const auto rec = data.at(seq);
        pub.publish_async(topic, data.key_of(rec.event), encode_payload(data.id_of(rec.event), seq, wall_us()));
    }
    pub.flush(std::chrono::milliseconds(300000));
}

void wait_processed(std::size_t n, const std::function<std::size_t()>& processed, const std::atomic<bool>& abort)
{
    const auto deadline = SteadyClock::now() + std::chrono::seconds(60);
    while (processed() < n && !abort.load() && SteadyClock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void produce_paced(const Services& s, const std::string& topic, const Dataset& data, std::size_t count, double rate,
                   std::size_t warmup, const std::function<std::size_t()>& processed, const std::atomic<bool>& abort)
{
    Publisher pub(publisher_config(s, {{"linger.ms", "1"}}));
    auto start = SteadyClock::now();
    std::size_t first = 0; // seq at `start`
    for (std::size_t seq = 0; seq < count && !abort.load(); ++seq) {
        if (seq == warmup && warmup > 0) {
            pub.flush(std::chrono::milliseconds(60000));
            wait_processed(warmup, processed, abort);
            start = SteadyClock::now();
            first = seq;
        }
        std::this_thread::sleep_until(start + std::chrono::microseconds(static_cast<std::int64_t>(
                                                  static_cast<double>(seq - first) * 1e6 / rate)));
        const auto rec = data.at(seq);
        pub.publish_async(topic, data.key_of(rec.event), encode_payload(data.id_of(rec.event), seq, wall_us()));
    }
    pub.flush(std::chrono::milliseconds(60000));
}

void name_thread(const char* name) noexcept
{
    pthread_setname_np(pthread_self(), name);
}

} // namespace idemkafka::bench
