// The torture test: the billing listener runs as a child process and is killed
// with SIGKILL at random moments while order events (duplicates and poison
// among them) stream in, with broker and PostgreSQL faults along the way. After
// a last run to completion every business effect is counted in PostgreSQL and
// every poison record looked up in the dead-letter topic. After each kill the
// group's committed offsets are compared with the claims, because a record lost
// on a crash is hidden from the final counts when a re-send of its event
// arrives later.
//
// Services come from IDEMKAFKA_TEST_PG, IDEMKAFKA_TEST_BROKERS and
// IDEMKAFKA_MOCK_CONTROL (scripts/lib.sh exports them); a missing one fails the
// test. IDEMKAFKA_TEST_PG_RESTART, when set, adds a server restart.
//
// The schedule is drawn from --seed (or IDEMKAFKA_TORTURE_SEED); the timing of
// the processes is not, so a seed reproduces the plan, not the interleaving.
// Each listener's stderr and the driver's timeline are kept in the log
// directory when the test fails.
//
// With --misbehaving N the listener is the chaos listener (chaos_listener.cpp),
// whose handlers misbehave for N per thousand orders in each of three ways
// (misbehaviour.hpp): swallowing an SQL error, throwing every time, throwing
// on the first attempt. Orders of the first two kinds must end in the
// dead-letter topic (handler_failed), every record of them, with nothing
// charged and nothing written after the swallowed error; the third kind is
// charged once. With --oversize N the driver itself publishes N records larger
// than the consumer's max_payload_bytes and the dead-letter producer's limit:
// dead-lettered (payload_too_large) without their value.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <idemkafka/dead_letter.hpp>
#include <idemkafka/publisher.hpp>
#include <idemkafka/store.hpp>

#include "misbehaviour.hpp"
#include "pg/exec.hpp"
#include "test_env.hpp"

namespace {

namespace pg = idemkafka::detail::pg;
namespace test = idemkafka::test;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const usage = R"(usage: idemkafka-torture --listener PATH --producer PATH [options]

  --listener PATH     the billing-listener binary
  --producer PATH     the billing-producer binary
  --seed N            seed of the schedule (default: $IDEMKAFKA_TORTURE_SEED, else random)
  --events N          records to publish (default 20000; 10% re-sends, 1% poison)
  --kills N           SIGKILLs of the listener (default 22; more while events
                      are still being published)
  --partitions N      partitions of the order topic (default 8)
  --misbehaving N     the listener is the chaos listener, N orders per thousand
                      misbehave in each of its three ways (default 0: billing-listener)
  --oversize N        also publish N records of 1.5 MB (default 0)
  --ordering O        with --misbehaving: the chaos listener's ordering, partition or
                      key (key: 2 workers, and a failing order parks only its key)
                      (default partition)
  --transaction-per-record 1
                      with --misbehaving: the chaos listener commits a transaction per
                      record (ConsumerConfig::transaction_per_record) (default 0)
  --batches-per-unit N
                      with --misbehaving: the chaos listener runs N transactions per unit
                      of work (ConsumerConfig::batches_per_unit) (default 1)
  --log-dir DIR       keep listener logs and the timeline there (default: a temp dir,
                      removed when the test passes)
  --group-protocol P  the listeners' group protocol: classic or consumer (KIP-848; the
                      mock broker then gets a 6 s session for the group) (default:
                      $IDEMKAFKA_TEST_GROUP_PROTOCOL, else classic)

Prints one line: torture: seed=S kills=K broker_faults=B pg_kills=P ... OK|FAILED
(with --misbehaving or --oversize, after a line "torture: misbehaving ..." of their figures)
)";

// ---- small helpers ----------------------------------------------------------

const Clock::time_point started = Clock::now();

double elapsed()
{
    return std::chrono::duration<double>(Clock::now() - started).count();
}

std::string required_env(const char* name, const char* what)
{
    const char* v = std::getenv(name);
    if (!v || !*v)
        throw std::runtime_error(fmt::format("{} is not set: the torture test needs {}; run it through "
                                             "scripts/test.sh, which provides it",
                                             name, what));
    return v;
}

// The driver's own account of what it did and when, for reading a failure
// next to the listener logs (whose lines carry the same clock).
class Timeline {
public:
    void open(const std::string& path) { file_.open(path); }
    template <class... Args> void say(fmt::format_string<Args...> f, Args&&... args)
    {
        const auto line = fmt::format("[{:7.2f}] {}", elapsed(), fmt::format(f, std::forward<Args>(args)...));
        std::lock_guard<std::mutex> lock(mu_);
        std::fprintf(stderr, "%s\n", line.c_str());
        if (file_)
            file_ << line << '\n' << std::flush;
    }

private:
    std::mutex mu_;
    std::ofstream file_;
};

Timeline timeline;

milliseconds uniform_ms(std::mt19937_64& rng, long long lo, long long hi)
{
    return milliseconds(lo + static_cast<long long>(rng() % static_cast<std::uint64_t>(hi - lo + 1)));
}

// key=value fields of a summary line such as the producer's and the listener's.
std::map<std::string, long long> fields_of(const std::string& line)
{
    std::map<std::string, long long> out;
    std::size_t pos = 0;
    while (pos < line.size()) {
        const auto end = std::min(line.find(' ', pos), line.size());
        const auto word = line.substr(pos, end - pos);
        const auto eq = word.find('=');
        if (eq != std::string::npos) {
            try {
                out[word.substr(0, eq)] = std::stoll(word.substr(eq + 1));
            } catch (const std::exception&) {
            }
        }
        pos = end + 1;
    }
    return out;
}

std::string last_line_of(const std::string& path)
{
    std::ifstream in(path);
    std::string line, last;
    while (std::getline(in, line))
        if (!line.empty())
            last = line;
    return last;
}

std::string tail_of(const std::string& path, std::size_t lines)
{
    std::ifstream in(path);
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);)
        all.push_back(line);
    std::string out;
    for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
        out += "    " + all[i] + "\n";
    return out;
}

// ---- the mock broker's control FIFO -----------------------------------------

long ack_count(const std::string& ack, std::string& text)
{
    std::ifstream in(ack);
    std::getline(in, text);
    return std::strtol(text.c_str(), nullptr, 10);
}

// Sends one command and waits for the broker to apply it; throws on an error.
void mock_control(const std::string& fifo, const std::string& command)
{
    const std::string ack = fifo + ".ack";
    std::string text;
    const long before = ack_count(ack, text);
    // Non-blocking: with no broker reading the FIFO the open fails at once
    // instead of hanging the test.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        throw std::runtime_error(
            fmt::format("cannot open the mock broker control FIFO {}: {}", fifo, std::strerror(errno)));
    const std::string line = command + "\n";
    const auto written = ::write(fd, line.data(), line.size());
    ::close(fd);
    if (written != static_cast<ssize_t>(line.size()))
        throw std::runtime_error(fmt::format("cannot write to the mock broker control FIFO {}", fifo));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (ack_count(ack, text) <= before) {
        if (Clock::now() >= deadline)
            throw std::runtime_error(fmt::format("the mock broker did not answer \"{}\" within 10 s", command));
        std::this_thread::sleep_for(milliseconds(20));
    }
    if (text.find(" ok") == std::string::npos)
        throw std::runtime_error(fmt::format("the mock broker refused \"{}\": {}", command, text));
}

// ---- child processes ----------------------------------------------------------

// A child process whose stdout goes to a file and whose stderr is read line by
// line: copied to a log file with the driver's clock, and scanned for the
// listener's assignment and progress lines.
class Child {
public:
    Child(const std::vector<std::string>& argv, const std::string& out_path, const std::string& err_path)
        : err_path_(err_path)
    {
        std::vector<char*> args;
        for (const auto& a : argv)
            args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (out < 0)
            throw std::runtime_error(fmt::format("cannot create {}: {}", out_path, std::strerror(errno)));
        int pipe_fds[2];
        // Close-on-exec, so no later child inherits this one's pipe and keeps
        // it open after this child dies.
        if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
            ::close(out);
            throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
        }
        log_.open(err_path);
        pid_ = ::fork();
        if (pid_ < 0) {
            ::close(out);
            ::close(pipe_fds[0]);
            ::close(pipe_fds[1]);
            throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
        }
        if (pid_ == 0) {
            // Only async-signal-safe calls from here: the driver has threads.
#ifdef __linux__
            ::prctl(PR_SET_PDEATHSIG, SIGKILL); // no orphans when the driver is killed by a timeout
#endif
            ::dup2(out, STDOUT_FILENO);
            ::dup2(pipe_fds[1], STDERR_FILENO);
            ::execv(args[0], args.data());
            static const char msg[] = "exec failed\n";
            [[maybe_unused]] const auto n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
            ::_exit(127);
        }
        ::close(out);
        ::close(pipe_fds[1]);
        reader_ = std::thread([this, fd = pipe_fds[0]] { read_stderr(fd); });
    }

    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;

    ~Child()
    {
        if (!reaped_) {
            ::kill(pid_, SIGKILL);
            int status = 0;
            ::waitpid(pid_, &status, 0);
        }
        if (reader_.joinable())
            reader_.join();
    }

    pid_t pid() const
    {
        return pid_;
    }
    const std::string& log_path() const
    {
        return err_path_;
    }
    bool assigned() const
    {
        return assigned_;
    }
    long long consumed() const
    {
        return consumed_;
    }
    long long lag() const
    {
        return lag_;
    }
    /// Progress lines seen so far (one a second).
    long long progress_lines() const
    {
        return progress_lines_;
    }
    /// Whether a stderr line containing `text` has been seen.
    bool saw(std::string_view text) const
    {
        std::lock_guard<std::mutex> lock(mu_);
        return std::any_of(watched_.begin(), watched_.end(),
                           [&](const auto& w) { return w.first == text && w.second; });
    }
    /// Starts watching for `text` in stderr lines from now on.
    void watch(std::string text)
    {
        std::lock_guard<std::mutex> lock(mu_);
        watched_.emplace_back(std::move(text), false);
    }

    /// The exit status if the process has ended, without waiting.
    std::optional<int> poll_exit()
    {
        if (reaped_)
            return status_;
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_)
            reap(status);
        return reaped_ ? std::optional<int>(status_) : std::nullopt;
    }

    /// Waits up to `timeout` for the process to end.
    std::optional<int> wait_exit(milliseconds timeout)
    {
        const auto deadline = Clock::now() + timeout;
        while (!poll_exit()) {
            if (Clock::now() >= deadline)
                return std::nullopt;
            std::this_thread::sleep_for(milliseconds(20));
        }
        return status_;
    }

    void signal(int sig)
    {
        ::kill(pid_, sig);
    }

    void kill_now()
    {
        ::kill(pid_, SIGKILL);
        int status = 0;
        if (!reaped_ && ::waitpid(pid_, &status, 0) == pid_)
            reap(status);
    }

    /// "exit status N" or "killed by signal N".
    static std::string describe(int status)
    {
        if (WIFEXITED(status))
            return fmt::format("exit status {}", WEXITSTATUS(status));
        if (WIFSIGNALED(status))
            return fmt::format("killed by signal {}", WTERMSIG(status));
        return fmt::format("wait status {}", status);
    }

private:
    void reap(int status)
    {
        reaped_ = true;
        status_ = status;
        if (reader_.joinable())
            reader_.join(); // the pipe reaches EOF once the process is gone
    }

    void read_stderr(int fd)
    {
        std::string pending;
        char buf[4096];
        for (;;) {
            const auto n = ::read(fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            pending.append(buf, static_cast<std::size_t>(n));
            std::size_t nl;
            while ((nl = pending.find('\n')) != std::string::npos) {
                on_line(pending.substr(0, nl));
                pending.erase(0, nl + 1);
            }
        }
        if (!pending.empty())
            on_line(pending);
        ::close(fd);
    }

    void on_line(const std::string& line)
    {
        log_ << fmt::format("[{:7.2f}] ", elapsed()) << line << '\n' << std::flush;
        if (line.find("assigned ") != std::string::npos && line.find("partition(s)") != std::string::npos)
            assigned_ = true;
        long long consumed = 0, charged = 0, skipped = 0, lag = 0;
        if (std::sscanf(line.c_str(), " consumed %lld, charged %lld, duplicates skipped %lld, lag %lld", &consumed,
                        &charged, &skipped, &lag) == 4) {
            consumed_ = consumed;
            lag_ = lag;
            ++progress_lines_;
        }
        std::lock_guard<std::mutex> lock(mu_);
        for (auto& w : watched_)
            if (!w.second && line.find(w.first) != std::string::npos)
                w.second = true;
    }

    pid_t pid_ = -1;
    std::string err_path_;
    std::ofstream log_;
    std::thread reader_;
    bool reaped_ = false;
    int status_ = 0;
    std::atomic<bool> assigned_{false};
    std::atomic<long long> consumed_{0};
    std::atomic<long long> lag_{-1};
    std::atomic<long long> progress_lines_{0};
    mutable std::mutex mu_;
    std::vector<std::pair<std::string, bool>> watched_;
};

// ---- Kafka: watermarks and committed offsets ------------------------------------

// A consumer handle that never subscribes: it reads the group's committed
// offsets and the partitions' end offsets without joining the group.
class OffsetProbe {
public:
    explicit OffsetProbe(const std::string& group)
    {
        char err[512];
        rd_kafka_conf_t* conf = rd_kafka_conf_new();
        for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
                 {"bootstrap.servers", test::brokers()}, {"group.id", group}, {"enable.auto.commit", "false"}})
            if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
                rd_kafka_conf_destroy(conf);
                throw std::runtime_error(err);
            }
        // Its complaints while the broker is down on purpose are noise here.
        rd_kafka_conf_set_log_cb(conf, nullptr);
        rk_ = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
        if (!rk_) {
            rd_kafka_conf_destroy(conf);
            throw std::runtime_error(err);
        }
    }
    OffsetProbe(const OffsetProbe&) = delete;
    OffsetProbe& operator=(const OffsetProbe&) = delete;
    ~OffsetProbe() { rd_kafka_destroy(rk_); }

    /// End offset (high watermark) of each partition.
    std::vector<std::int64_t> ends(const std::string& topic, int partitions)
    {
        std::vector<std::int64_t> out;
        for (int p = 0; p < partitions; ++p) {
            std::int64_t lo = -1, hi = -1;
            if (auto e = rd_kafka_query_watermark_offsets(rk_, topic.c_str(), p, &lo, &hi, 10000))
                throw std::runtime_error(fmt::format("watermarks of {}/{}: {}", topic, p, rd_kafka_err2str(e)));
            out.push_back(hi);
        }
        return out;
    }

    /// The group's committed offset of each partition (negative: none).
    std::vector<std::int64_t> committed(const std::string& topic, int partitions)
    {
        std::unique_ptr<rd_kafka_topic_partition_list_t, void (*)(rd_kafka_topic_partition_list_t*)> list(
            rd_kafka_topic_partition_list_new(partitions), rd_kafka_topic_partition_list_destroy);
        for (int p = 0; p < partitions; ++p)
            rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p);
        if (auto e = rd_kafka_committed(rk_, list.get(), 10000))
            throw std::runtime_error(fmt::format("committed offsets of {}: {}", topic, rd_kafka_err2str(e)));
        std::vector<std::int64_t> out(static_cast<std::size_t>(partitions), -1);
        for (int i = 0; i < list->cnt; ++i)
            out[static_cast<std::size_t>(list->elems[i].partition)] = list->elems[i].offset;
        return out;
    }

private:
    rd_kafka_t* rk_ = nullptr;
};

// ---- the run --------------------------------------------------------------------

struct Options {
    std::string listener;
    std::string producer;
    std::uint64_t seed = 0;
    long long events = 20000;
    int kills = 22;
    int partitions = 8;
    int misbehaving = 0; // per mille of each kind; 0: billing-listener's handler
    int oversize = 0;
    std::string log_dir;
    std::string group_protocol;
    std::string ordering = "partition";
    bool per_record = false;          // the chaos listener's transaction_per_record
    std::size_t batches_per_unit = 1; // the chaos listener's batches_per_unit
};

Options parse_options(int argc, char** argv)
{
    Options o;
    bool have_seed = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            std::fputs(usage, stdout);
            std::exit(0);
        }
        if (i + 1 >= argc)
            throw std::invalid_argument(fmt::format("{} needs a value\n{}", a, usage));
        const std::string v = argv[++i];
        if (a == "--listener")
            o.listener = v;
        else if (a == "--producer")
            o.producer = v;
        else if (a == "--seed") {
            o.seed = std::stoull(v);
            have_seed = true;
        } else if (a == "--events")
            o.events = std::stoll(v);
        else if (a == "--kills")
            o.kills = std::stoi(v);
        else if (a == "--partitions")
            o.partitions = std::stoi(v);
        else if (a == "--misbehaving")
            o.misbehaving = std::stoi(v);
        else if (a == "--oversize")
            o.oversize = std::stoi(v);
        else if (a == "--log-dir")
            o.log_dir = v;
        else if (a == "--group-protocol")
            o.group_protocol = v;
        else if (a == "--ordering")
            o.ordering = v;
        else if (a == "--transaction-per-record")
            o.per_record = v == "1";
        else if (a == "--batches-per-unit")
            o.batches_per_unit = std::stoul(v);
        else
            throw std::invalid_argument(fmt::format("unknown argument {}\n{}", a, usage));
    }
    if (o.ordering != "partition" && o.ordering != "key")
        throw std::invalid_argument("--ordering: expected partition or key, got " + o.ordering);
    if ((o.ordering != "partition" || o.per_record || o.batches_per_unit != 1) && o.misbehaving == 0)
        throw std::invalid_argument("--ordering, --transaction-per-record and --batches-per-unit are options of the "
                                    "chaos listener: they need --misbehaving");
    if (o.group_protocol.empty())
        o.group_protocol = idemkafka::test::consumer_protocol() ? "consumer" : "classic";
    if (o.group_protocol != "classic" && o.group_protocol != "consumer")
        throw std::invalid_argument("--group-protocol: expected classic or consumer, got " + o.group_protocol);
    if (!have_seed) {
        if (const char* s = std::getenv("IDEMKAFKA_TORTURE_SEED"); s && *s)
            o.seed = std::stoull(s);
        else
            o.seed = std::random_device{}() % 1000000;
    }
    for (const auto& [path, name] : {std::pair{o.listener, "--listener"}, std::pair{o.producer, "--producer"}})
        if (path.empty() || ::access(path.c_str(), X_OK) != 0)
            throw std::invalid_argument(
                fmt::format("{} must name an executable, got \"{}\" (the billing example is built with "
                            "IDEMKAFKA_BUILD_EXAMPLES=ON)",
                            name, path));
    if (o.events < 1000 || o.kills < 1 || o.partitions < 1 || o.misbehaving < 0 || o.misbehaving > 333 ||
        o.oversize < 0)
        throw std::invalid_argument("--events must be at least 1000, --kills and --partitions positive, "
                                    "--misbehaving in [0, 333], --oversize not negative");
    return o;
}

enum class Fault { none, broker_down, commit_errors, pg_terminate, pg_restart };

const char* fault_name(Fault f)
{
    switch (f) {
    case Fault::broker_down:
        return "broker outage";
    case Fault::commit_errors:
        return "offset commit errors or a frozen broker";
    case Fault::pg_terminate:
        return "pg_terminate_backend";
    case Fault::pg_restart:
        return "PostgreSQL restart";
    default:
        return "none";
    }
}

// One poison record as published, or a record of a misbehaving order: what its
// dead letter must look like.
struct Poison {
    std::string reason;
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    std::string value;
    int dead_letters = 0;
    std::string key;            // checked when not empty
    std::string error_contains; // in the idemkafka.error header
};

// Size of the oversize poison: past max_payload_bytes (1 MiB) and the
// dead-letter producer's message.max.bytes (1,000,000), within the broker's.
constexpr std::size_t oversize_bytes = 1500 * 1000;

// Orders whose handler never succeeds: dead-lettered, never charged.
bool failing(idemkafka::torture::Misbehaviour how)
{
    return how == idemkafka::torture::Misbehaviour::swallow || how == idemkafka::torture::Misbehaviour::throw_always;
}

class Torture {
public:
    explicit Torture(Options o) : opt_(std::move(o)), rng_(opt_.seed) {}

    int run()
    {
        setup();
        start_producer();
        kill_phase();
        // Started before the producer is waited for, so whatever is still
        // being published is consumed as it arrives.
        auto last = start_listener("listener-final", 500);
        timeline.say("final run: listener started");
        finish_producer();
        final_run(*last);
        verify();
        return report();
    }

private:
    // ---- setup ----------------------------------------------------------------

    void setup()
    {
        // Checked up front so a missing service fails with its name, not later
        // with a confusing symptom.
        pg_ = test::pg();
        brokers_ = test::brokers();
        // Apache Kafka of the test's own (run_isolated.sh --own-kafka) is killed and frozen for
        // real; the mock cluster gets its faults through its control FIFO.
        if (const char* ctl = std::getenv("IDEMKAFKA_KAFKA_CTL"); ctl && *ctl)
            kafka_ctl_ = ctl;
        else
            control_ = required_env("IDEMKAFKA_MOCK_CONTROL", "the mock broker's control FIFO, to create topics and "
                                                              "inject broker faults (or IDEMKAFKA_KAFKA_CTL)");
        if (const char* r = std::getenv("IDEMKAFKA_TEST_PG_RESTART"); r && *r)
            pg_restart_cmd_ = r;

        if (opt_.log_dir.empty()) {
            const char* tmp = std::getenv("TMPDIR");
            std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/idemkafka-torture.XXXXXX";
            if (!::mkdtemp(tmpl.data()))
                throw std::runtime_error(fmt::format("mkdtemp {}: {}", tmpl, std::strerror(errno)));
            opt_.log_dir = tmpl;
            temp_log_dir_ = true;
        } else {
            ::mkdir(opt_.log_dir.c_str(), 0755);
        }
        timeline.open(opt_.log_dir + "/timeline.log");

        group_ = test::unique_name("torture");
        topic_ = group_ + ".orders";
        dlq_ = group_ + ".dlq";
        charge_table_ = group_ + "_charge";
        claims_table_ = group_ + "_claims";
        // Short: PostgreSQL truncates application_name to 63 bytes.
        app_name_ = fmt::format("idemkafka-torture-{}", ::getpid());
        const bool uri = pg_.rfind("postgresql://", 0) == 0 || pg_.rfind("postgres://", 0) == 0;
        listener_pg_ = uri ? pg_ + (pg_.find('?') == std::string::npos ? "?" : "&") + "application_name=" + app_name_
                           : pg_ + " application_name=" + app_name_;

        timeline.say("seed {} (rerun with IDEMKAFKA_TORTURE_SEED={}); group {}; logs in {}", opt_.seed, opt_.seed,
                     group_, opt_.log_dir);
        test::create_topic(topic_, opt_.partitions);
        test::create_topic(dlq_, 2);
        // A leftover error from an earlier test must not hit this one's consumers.
        // Under the consumer protocol the broker owns the session timeout (the
        // mock's default is 30 s): the same 6 s as the classic listeners ask for
        // (Apache Kafka's test brokers have it: scripts/kafka/broker.properties).
        if (kafka_ctl_.empty()) {
            mock_control(control_, "clear-errors OffsetCommit");
            if (opt_.group_protocol == "consumer")
                mock_control(control_, "group-consumer-timeouts 6000 500");
        }
        timeline.say("group protocol {}, {}", opt_.group_protocol,
                     kafka_ctl_.empty() ? "mock cluster" : "Apache Kafka of its own");

        // The fault runs: early in the kill phase, while events surely still
        // stream in, so that a stalled recovery shows as no progress.
        std::vector<Fault> faults = {Fault::broker_down, Fault::pg_terminate, Fault::commit_errors,
                                     Fault::pg_terminate};
        if (!pg_restart_cmd_.empty())
            faults.push_back(Fault::pg_restart);
        std::shuffle(faults.begin(), faults.end(), rng_);
        const int first = 2, last = std::max(first + static_cast<int>(faults.size()) + 1, opt_.kills / 2);
        std::set<int> slots;
        while (slots.size() < faults.size())
            slots.insert(first + static_cast<int>(rng_() % static_cast<std::uint64_t>(last - first)));
        auto f = faults.begin();
        for (int s : slots)
            fault_at_[s] = *f++;
    }

    void start_producer()
    {
        // A killed consumer's partitions wait out its 6 s session before the
        // restarted one gets them (the mock group sometimes takes a second 5 s
        // round), so a kill costs 6 to 13 s. Publishing over about that long
        // keeps every listener busy with fresh records, not just with the
        // backlog of the previous one; the kill phase goes on while they come.
        const double seconds = std::max(30.0, 9.0 * opt_.kills);
        publish_until_ = Clock::now() + std::chrono::seconds(static_cast<long long>(seconds));
        const auto rate = std::max<long long>(1, static_cast<long long>(static_cast<double>(opt_.events) / seconds));
        producer_ = std::make_unique<Child>(
            std::vector<std::string>{opt_.producer, "--brokers", brokers_, "--topic", topic_, "--events",
                                     std::to_string(opt_.events), "--duplicates", "0.1", "--poison", "0.01", "--rate",
                                     std::to_string(rate), "--seed", std::to_string(opt_.seed)},
            opt_.log_dir + "/producer.out", opt_.log_dir + "/producer.log");
        timeline.say("producer started: {} records at {}/s into {} ({} partitions)", opt_.events, rate, topic_,
                     opt_.partitions);
    }

    std::unique_ptr<Child> start_listener(const std::string& name, std::size_t max_batch)
    {
        std::vector<std::string> argv{opt_.listener,
                                      "--brokers",
                                      brokers_,
                                      "--postgres",
                                      listener_pg_,
                                      "--topic",
                                      topic_,
                                      "--group",
                                      group_,
                                      "--max-batch",
                                      std::to_string(max_batch),
                                      "--charge-table",
                                      charge_table_,
                                      "--claims-table",
                                      claims_table_,
                                      "--progress",
                                      "1",
                                      "--group-protocol",
                                      opt_.group_protocol};
        if (opt_.misbehaving > 0)
            argv.insert(argv.end(),
                        {"--misbehave-seed", std::to_string(opt_.seed), "--misbehave-per-mille",
                         std::to_string(opt_.misbehaving), "--ordering", opt_.ordering, "--transaction-per-record",
                         opt_.per_record ? "1" : "0", "--batches-per-unit", std::to_string(opt_.batches_per_unit)});
        return std::make_unique<Child>(argv, opt_.log_dir + "/" + name + ".out", opt_.log_dir + "/" + name + ".log");
    }

    // The oversize poison, published by the driver between listener runs,
    // spread over the first --kills runs; keyed like the producer's poison.
    void publish_oversize(int run)
    {
        const int due = opt_.oversize * std::min(run, opt_.kills) / opt_.kills;
        if (oversize_published_ >= due)
            return;
        try {
            if (!oversize_publisher_)
                oversize_publisher_ = std::make_unique<idemkafka::Publisher>(idemkafka::PublisherConfig{
                    brokers_, {{"message.max.bytes", "2000000"}}, idemkafka::test::log_sink()});
            while (oversize_published_ < due) {
                ++oversize_published_;
                std::string value(oversize_bytes, 'x');
                value.replace(0, 40, fmt::format("oversize {} of run {}", oversize_published_, run));
                oversize_publisher_->publish(
                    topic_, fmt::format("poison-oversize-{:02}:payload_too_large", oversize_published_), value);
            }
            timeline.say("run {:2}: {} oversize record(s) of {} bytes published so far", run, oversize_published_,
                         oversize_bytes);
        } catch (const std::exception& e) {
            fail(fmt::format("run {}: could not publish oversize record {}: {}", run, oversize_published_, e.what()));
        }
    }

    // ---- the kill phase -----------------------------------------------------------

    // Sleeps, but notices a listener that ended on its own meanwhile.
    bool sleep_alive(Child& l, milliseconds d)
    {
        const auto until = Clock::now() + d;
        while (Clock::now() < until) {
            if (l.poll_exit())
                return false;
            const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
            std::this_thread::sleep_for(std::min(milliseconds(20), left));
        }
        return !l.poll_exit();
    }

    // Waits until `done` holds; false when the listener ended or time ran out.
    bool wait_alive(Child& l, const std::function<bool()>& done, milliseconds timeout)
    {
        const auto deadline = Clock::now() + timeout;
        while (!done()) {
            if (l.poll_exit() || Clock::now() >= deadline)
                return false;
            std::this_thread::sleep_for(milliseconds(20));
        }
        return true;
    }

    // What a crash left behind: the group's committed offsets and, read after
    // them, the claims. The library commits an offset only after the claims
    // below it committed, so every valid record below a committed offset must
    // be claimed here. The final counts cannot show a record lost this way when
    // a re-send of its event came later; this can.
    struct Snapshot {
        int run = 0;
        std::vector<std::int64_t> committed;
        std::unordered_set<std::string> claims;
    };

    void snapshot(int run)
    {
        Snapshot snap;
        snap.run = run;
        try {
            if (!probe_)
                probe_ = std::make_unique<OffsetProbe>(group_);
            snap.committed = probe_->committed(topic_, opt_.partitions);
            pqxx::connection c(pg_);
            pqxx::nontransaction tx(c);
            if (pg::exec_params(tx, "SELECT to_regclass($1) IS NOT NULL",
                                idemkafka::quote_identifier(claims_table_))[0][0]
                    .as<bool>())
                for (const auto& row :
                     pg::exec_params(tx,
                                     "SELECT event_id::text FROM " + idemkafka::quote_identifier(claims_table_) +
                                         " WHERE consumer_group = $1",
                                     group_))
                    snap.claims.insert(row[0].as<std::string>());
        } catch (const std::exception& e) {
            fail(fmt::format("run {}: could not take the after-kill snapshot: {}", run, e.what()));
            return;
        }
        last_claims_ = static_cast<long long>(snap.claims.size());
        snapshots_.push_back(std::move(snap));
    }

    void fail(std::string what)
    {
        timeline.say("FAILURE: {}", what);
        failures_.push_back(std::move(what));
    }

    void listener_ended(Child& l, int run)
    {
        fail(fmt::format("listener run {} ended on its own ({}) instead of being killed; last lines of {}:\n{}", run,
                         Child::describe(*l.poll_exit()), l.log_path(), tail_of(l.log_path(), 15)));
    }

    void kill_phase()
    {
        static const std::size_t batch_sizes[] = {1, 20, 100, 500};
        // Beyond the required kills while events still stream in, but not much
        // past the planned publishing time, which bounds the test's duration.
        const auto phase_end = publish_until_ + std::chrono::seconds(10);
        for (int run = 1; kills_ < opt_.kills || (!producer_->poll_exit() && Clock::now() < phase_end); ++run) {
            // A listener that cannot start at all would otherwise keep this
            // loop going until the CTest timeout hides what happened.
            if (failures_.size() >= 5) {
                fail(fmt::format("kill phase abandoned after {} failures", failures_.size()));
                break;
            }
            if (opt_.oversize > 0)
                publish_oversize(run);
            const auto max_batch = batch_sizes[rng_() % 4];
            const auto fault = fault_at_.count(run) ? fault_at_[run] : Fault::none;
            // Some kills hit start-up (schema, connections, group join) rather
            // than consumption; never on a fault run, which needs a working listener.
            const bool early = fault == Fault::none && run > 1 && rng_() % 8 == 0;
            auto l = start_listener(fmt::format("listener-{:02}", run), max_batch);
            const auto t0 = Clock::now();
            if (early) {
                const auto d = uniform_ms(rng_, 0, 1500);
                if (!sleep_alive(*l, d)) {
                    listener_ended(*l, run);
                    continue;
                }
                l->kill_now();
                ++kills_;
                snapshot(run);
                timeline.say("run {:2} (max-batch {}): SIGKILL during start-up, {} ms after exec; {} claims so far",
                             run, max_batch, d.count(), last_claims_);
                continue;
            }
            if (!wait_alive(
                    *l, [&] { return l->assigned(); }, std::chrono::seconds(40))) {
                if (l->poll_exit())
                    listener_ended(*l, run);
                else
                    fail(fmt::format("listener run {} got no partition assignment within 40 s; last lines of {}:\n{}",
                                     run, l->log_path(), tail_of(l->log_path(), 15)));
                continue;
            }
            const double assigned_after = std::chrono::duration<double>(Clock::now() - t0).count();
            std::string note;
            if (fault != Fault::none) {
                if (!inject(*l, fault, run, note)) {
                    if (l->poll_exit())
                        listener_ended(*l, run);
                    continue;
                }
            }
            // Right after assignment the listener works off the backlog of the
            // downtime in large batches; later it follows the stream in small ones.
            const auto d = rng_() % 3 == 0 ? uniform_ms(rng_, 0, 400) : uniform_ms(rng_, 400, 3000);
            if (!sleep_alive(*l, d)) {
                listener_ended(*l, run);
                continue;
            }
            l->kill_now();
            ++kills_;
            snapshot(run);
            timeline.say("run {:2} (max-batch {}): assigned after {:.1f} s, {}SIGKILL {} ms later; {} claims so far",
                         run, max_batch, assigned_after, note, d.count(), last_claims_);
        }
    }

    // Injects a fault into a running, assigned listener and waits for it to
    // get over it. Returns false when the listener ended meanwhile.
    bool inject(Child& l, Fault fault, int run, std::string& note)
    {
        if (!sleep_alive(l, uniform_ms(rng_, 200, 1000)))
            return false;
        const auto progress_before = l.consumed();
        const auto recover_timeout = std::chrono::seconds(30);
        // Recovery shows only in work done, and with the producer finished
        // there may be none (only a slow machine gets there).
        const bool traffic = !producer_->poll_exit();
        switch (fault) {
        case Fault::broker_down:
            if (!kafka_ctl_.empty()) {
                // A crash: SIGKILL, then a restart on the same storage (it returns once the
                // broker serves again, typically some seconds later).
                const auto killed_at = Clock::now();
                test::kafka_control("kill 1");
                test::kafka_control("start 1");
                ++broker_faults_;
                note = fmt::format(
                    "broker killed (SIGKILL) and restarted in {} ms, ",
                    std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed_at).count());
                break;
            } else {
                const auto down = uniform_ms(rng_, 1000, 2000);
                mock_control(control_, "broker-down 1");
                std::this_thread::sleep_for(down);
                mock_control(control_, "broker-up 1");
                ++broker_faults_;
                note = fmt::format("broker 1 down for {} ms, ", down.count());
                break;
            }
        case Fault::commit_errors:
            if (!kafka_ctl_.empty()) {
                // Frozen: connections stay open and nothing answers, so requests (commits among
                // them) time out instead of failing at once.
                const auto frozen = uniform_ms(rng_, 2000, 4000);
                test::kafka_control("stop 1");
                std::this_thread::sleep_for(frozen);
                test::kafka_control("cont 1");
                ++broker_faults_;
                note = fmt::format("broker frozen (SIGSTOP) for {} ms, ", frozen.count());
                break;
            }
            // Cluster-wide: the next offset commits fail, whoever sends them;
            // the test runs serially (RUN_SERIAL) so they are this listener's.
            mock_control(control_, "push-errors OffsetCommit REBALANCE_IN_PROGRESS REQUEST_TIMED_OUT "
                                   "NOT_COORDINATOR COORDINATOR_LOAD_IN_PROGRESS");
            ++broker_faults_;
            note = "4 offset commit errors injected, ";
            break;
        case Fault::pg_terminate: {
            l.watch("reconnected to PostgreSQL");
            long long terminated = 0;
            // The listener's connection is open whenever it runs, but a
            // reconnect may be under way: try for a while.
            wait_alive(
                l,
                [&] {
                    pqxx::connection c(pg_);
                    pqxx::nontransaction tx(c);
                    // The call sits in the aggregate's FILTER so that it runs only on
                    // rows the WHERE clause kept: in a WHERE of its own the planner
                    // could evaluate it before the application_name test.
                    terminated = pg::exec_params(tx,
                                                 "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM "
                                                 "pg_stat_activity WHERE application_name = $1 AND pid <> "
                                                 "pg_backend_pid()",
                                                 app_name_)[0][0]
                                     .as<long long>();
                    return terminated > 0;
                },
                std::chrono::seconds(5));
            if (terminated == 0) {
                fail(
                    fmt::format("run {}: no PostgreSQL backend with application_name {} to terminate", run, app_name_));
                return !l.poll_exit();
            }
            ++pg_kills_;
            note = fmt::format("{} backend(s) terminated, ", terminated);
            if (traffic && !wait_alive(
                               l, [&] { return l.saw("reconnected to PostgreSQL"); }, recover_timeout)) {
                if (!l.poll_exit())
                    fail(fmt::format("run {}: the listener did not reconnect to PostgreSQL within 30 s after "
                                     "pg_terminate_backend (a hang?); last lines of {}:\n{}",
                                     run, l.log_path(), tail_of(l.log_path(), 15)));
                return !l.poll_exit();
            }
            note += traffic ? "reconnected, " : "";
            break;
        }
        case Fault::pg_restart: {
            l.watch("reconnected to PostgreSQL");
            timeline.say("run {:2}: restarting PostgreSQL", run);
            const int rc = std::system((pg_restart_cmd_ + " >/dev/null 2>&1").c_str());
            if (rc != 0) {
                fail(fmt::format("run {}: IDEMKAFKA_TEST_PG_RESTART failed ({}): {}", run, rc, pg_restart_cmd_));
                return !l.poll_exit();
            }
            ++pg_kills_;
            ++pg_restarts_;
            note = "PostgreSQL restarted, ";
            if (traffic && !wait_alive(
                               l, [&] { return l.saw("reconnected to PostgreSQL"); }, recover_timeout)) {
                if (!l.poll_exit())
                    fail(fmt::format("run {}: the listener did not reconnect to PostgreSQL within 30 s after the "
                                     "restart (a hang?); last lines of {}:\n{}",
                                     run, l.log_path(), tail_of(l.log_path(), 15)));
                return !l.poll_exit();
            }
            note += traffic ? "reconnected, " : "";
            break;
        }
        case Fault::none:
            break;
        }
        if (!traffic) {
            note += "no records left to show recovery, ";
            timeline.say("run {:2}: {}: {}", run, fault_name(fault), note.substr(0, note.size() - 2));
            return !l.poll_exit();
        }
        // Recovered means consuming again: the progress count moves (fresh
        // records arrive several times a second).
        if (!wait_alive(
                l, [&] { return l.consumed() > progress_before; }, recover_timeout)) {
            if (!l.poll_exit())
                fail(fmt::format("run {}: the listener consumed nothing for 30 s after the {} (a hang?); last lines "
                                 "of {}:\n{}",
                                 run, fault_name(fault), l.log_path(), tail_of(l.log_path(), 15)));
            return !l.poll_exit();
        }
        note += "consuming again, ";
        timeline.say("run {:2}: {}: {}", run, fault_name(fault), note.substr(0, note.size() - 2));
        return true;
    }

    void finish_producer()
    {
        const auto status = producer_->wait_exit(std::chrono::seconds(300));
        if (!status) {
            producer_->kill_now();
            throw std::runtime_error("billing-producer did not finish within 300 s after the kill phase");
        }
        const auto line = last_line_of(opt_.log_dir + "/producer.out");
        if (*status != 0)
            throw std::runtime_error(fmt::format("billing-producer failed ({}): {}\n{}", Child::describe(*status), line,
                                                 tail_of(producer_->log_path(), 10)));
        producer_summary_ = fields_of(line);
        timeline.say("producer done: {}", line);
    }

    // ---- the final run ------------------------------------------------------------

    void final_run(Child& last)
    {
        auto* l = &last;
        if (kafka_ctl_.empty())
            mock_control(control_, "clear-errors OffsetCommit");
        OffsetProbe probe(group_);
        const auto ends = probe.ends(topic_, opt_.partitions);
        timeline.say("final run: waiting for the listener's assignment and for the group's committed offsets to "
                     "reach the end of every partition");
        std::vector<std::int64_t> committed;
        // Waiting for the assignment too means the last run resumed from the
        // committed offsets and found nothing left to do, or did it.
        const bool drained = wait_alive(
            *l,
            [&] {
                std::this_thread::sleep_for(milliseconds(300));
                if (!l->assigned())
                    return false;
                committed = probe.committed(topic_, opt_.partitions);
                for (std::size_t p = 0; p < ends.size(); ++p)
                    if (committed[p] != ends[p] && !(ends[p] == 0 && committed[p] < 0))
                        return false;
                return true;
            },
            std::chrono::seconds(120));
        if (!drained) {
            std::string where;
            for (std::size_t p = 0; p < ends.size(); ++p)
                if (p >= committed.size() || committed[p] != ends[p])
                    where += fmt::format(" {}/{}: committed {} of {};", topic_, p,
                                         p < committed.size() ? committed[p] : -1, ends[p]);
            if (l->poll_exit())
                listener_ended(*l, 0);
            else
                fail(fmt::format("the final listener did not drain the topic within 120 s:{} last lines of {}:\n{}",
                                 where, l->log_path(), tail_of(l->log_path(), 15)));
        } else {
            timeline.say("final run: drained (consumed {} in this run)", l->consumed());
        }
        l->signal(SIGTERM);
        const auto status = l->wait_exit(std::chrono::seconds(45));
        if (!status) {
            l->kill_now();
            fail(fmt::format("the final listener did not exit within 45 s of SIGTERM; last lines of {}:\n{}",
                             l->log_path(), tail_of(l->log_path(), 15)));
        } else if (*status != 0) {
            fail(fmt::format("the final listener exited with {}; last lines of {}:\n{}", Child::describe(*status),
                             l->log_path(), tail_of(l->log_path(), 15)));
        } else {
            timeline.say("final run: {}", last_line_of(opt_.log_dir + "/listener-final.out"));
        }
        source_ends_ = ends;
    }

    // ---- verification ---------------------------------------------------------------

    void verify()
    {
        // Ground truth from the topic itself, not from what the listener says.
        long long end_total = 0;
        for (auto e : source_ends_)
            end_total += e;
        published_ = end_total;
        const auto produced = producer_summary_["published"] + oversize_published_;
        if (end_total != produced)
            fail(fmt::format("the topic holds {} records, the producer published {} and the driver {} oversize",
                             end_total, producer_summary_["published"], oversize_published_));

        const auto source = test::read_topic(topic_, static_cast<std::size_t>(end_total), std::chrono::seconds(120));
        if (static_cast<long long>(source.size()) != end_total)
            fail(fmt::format("read back {} of {} records of {}", source.size(), end_total, topic_));
        std::unordered_map<std::string, std::string> event_of_order; // order id -> event id
        for (const auto& r : source) {
            const std::string key = r.key.value_or("");
            if (key.rfind("poison-", 0) == 0) {
                const auto colon = key.find(':');
                auto& p = poison_[key];
                p.reason = colon == std::string::npos ? "" : key.substr(colon + 1);
                p.partition = r.partition;
                p.offset = r.offset;
                p.value = r.value.value_or("");
                continue;
            }
            const auto j = nlohmann::json::parse(r.value.value_or(""), nullptr, false);
            if (j.is_discarded() || !j.contains("event_id") || !j.contains("order_id")) {
                fail(fmt::format("record {}/{}@{} is neither poison nor a valid order", topic_, r.partition, r.offset));
                continue;
            }
            const auto ev = j["event_id"].get<std::string>();
            const auto order = j["order_id"].get<std::string>();
            const auto how = idemkafka::torture::misbehaviour_of(order, opt_.seed, opt_.misbehaving);
            if (failing(how)) {
                // Every record of such an order (re-sends too: nothing claims the
                // event) must be dead-lettered.
                auto& p = failing_[{r.partition, r.offset}];
                p.reason = "handler_failed";
                p.partition = r.partition;
                p.offset = r.offset;
                p.value = r.value.value_or("");
                p.key = r.key.value_or("");
                p.error_contains = how == idemkafka::torture::Misbehaviour::swallow
                                       ? "transaction aborted inside the handler"
                                       : std::string(idemkafka::torture::thrown_message);
                failing_orders_[order] = how;
            } else {
                valid_records_.push_back({r.partition, r.offset, ev});
                if (how != idemkafka::torture::Misbehaviour::none)
                    throw_once_orders_.insert(order);
            }
            auto [it, fresh] = event_of_order.emplace(order, ev);
            if (!fresh && it->second != ev)
                fail(fmt::format("order {} was published with two event ids", order));
        }
        unique_valid_ = static_cast<long long>(event_of_order.size());
        if (unique_valid_ != producer_summary_["unique_orders"])
            fail(fmt::format("{} unique valid orders in the topic, the producer says {}", unique_valid_,
                             producer_summary_["unique_orders"]));
        if (static_cast<long long>(poison_.size()) != producer_summary_["poison"] + oversize_published_)
            fail(fmt::format("{} poison records in the topic, the producer says {}, the driver published {} oversize",
                             poison_.size(), producer_summary_["poison"], oversize_published_));

        verify_charges(event_of_order);
        verify_dead_letters();
        verify_snapshots();
    }

    void verify_charges(const std::unordered_map<std::string, std::string>& event_of_order)
    {
        pqxx::connection c(pg_);
        pqxx::nontransaction tx(c);
        const auto charges = tx.exec("SELECT order_id, idempotency_key::text FROM " +
                                     idemkafka::quote_identifier(charge_table_) + " ORDER BY id");
        std::unordered_map<std::string, int> times;
        std::vector<std::string> doubled, unexpected, wrong_key, failed_but_charged;
        for (const auto& row : charges) {
            const auto order = row[0].as<std::string>();
            const auto key = row[1].as<std::string>();
            if (++times[order] == 2)
                doubled.push_back(order);
            auto it = event_of_order.find(order);
            if (it == event_of_order.end())
                unexpected.push_back(order);
            else if (it->second != key)
                wrong_key.push_back(order);
            if (failing_orders_.count(order))
                failed_but_charged.push_back(order);
        }
        charges_ = static_cast<long long>(charges.size());
        double_charged_ = static_cast<long long>(doubled.size());
        // Orders whose handler never succeeds are not charged: dead-lettered.
        const auto chargeable = unique_valid_ - static_cast<long long>(failing_orders_.size());
        std::vector<std::string> missing;
        for (const auto& [order, ev] : event_of_order)
            if (!times.count(order) && !failing_orders_.count(order))
                missing.push_back(order);
        missing_ = static_cast<long long>(missing.size());
        std::sort(missing.begin(), missing.end());
        const auto some = [](const std::vector<std::string>& v) {
            std::string s;
            for (std::size_t i = 0; i < v.size() && i < 10; ++i)
                s += (i ? ", " : "") + v[i];
            return s + (v.size() > 10 ? ", ..." : "");
        };
        if (charges_ != chargeable)
            fail(fmt::format("{} charges for {} unique valid orders ({} of them with a handler that always fails)",
                             charges_, unique_valid_, failing_orders_.size()));
        if (!failed_but_charged.empty())
            fail(fmt::format("{} orders charged although their handler always fails (swallowed SQL error or "
                             "throw): {}",
                             failed_but_charged.size(), some(failed_but_charged)));
        if (!doubled.empty()) {
            std::string detail;
            for (std::size_t i = 0; i < doubled.size() && i < 5; ++i) {
                const auto rows =
                    pg::exec_params(tx,
                                    "SELECT id, idempotency_key::text, payment_id, charged_at::text FROM " +
                                        idemkafka::quote_identifier(charge_table_) + " WHERE order_id = $1 ORDER BY id",
                                    doubled[i]);
                detail += fmt::format("\n    {}:", doubled[i]);
                for (const auto& r : rows)
                    detail += fmt::format(" [id {} key {} payment {} at {}]", r[0].c_str(), r[1].c_str(), r[2].c_str(),
                                          r[3].c_str());
            }
            fail(fmt::format("{} orders charged more than once: {}{}", doubled.size(), some(doubled), detail));
        }
        if (!missing.empty())
            fail(fmt::format("{} valid orders never charged: {}", missing.size(), some(missing)));
        if (!unexpected.empty())
            fail(fmt::format("{} charges for orders that were never published as valid: {}", unexpected.size(),
                             some(unexpected)));
        if (!wrong_key.empty())
            fail(fmt::format("{} charges with an idempotency key other than the order's event id: {}", wrong_key.size(),
                             some(wrong_key)));

        std::unordered_set<std::string> expected_events;
        for (const auto& [order, ev] : event_of_order)
            if (!failing_orders_.count(order))
                expected_events.insert(ev);
        const auto claims = pg::exec_params(tx,
                                            "SELECT event_id::text FROM " + idemkafka::quote_identifier(claims_table_) +
                                                " WHERE consumer_group = $1",
                                            group_);
        claims_ = static_cast<long long>(claims.size());
        long long stray = 0;
        for (const auto& row : claims)
            if (!expected_events.count(row[0].as<std::string>()))
                ++stray;
        if (claims_ != chargeable || stray != 0)
            fail(fmt::format("{} claims in {} for group {} ({} of them for no chargeable event), expected {}", claims_,
                             claims_table_, group_, stray, chargeable));

        if (opt_.misbehaving > 0) {
            // The swallowing handler's write after the error must never commit.
            const auto rows = tx.exec("SELECT order_id FROM " +
                                      idemkafka::quote_identifier(charge_table_ + "_after_error") + " ORDER BY 1");
            after_error_rows_ = static_cast<long long>(rows.size());
            std::vector<std::string> orders;
            for (const auto& row : rows)
                orders.push_back(row[0].as<std::string>());
            if (!orders.empty())
                fail(fmt::format("{} rows written after a swallowed SQL error committed: {}", orders.size(),
                                 some(orders)));
        }
    }

    void verify_dead_letters()
    {
        OffsetProbe probe(group_ + "-dlq-probe");
        long long total = 0;
        for (auto e : probe.ends(dlq_, 2))
            total += e;
        const auto records = test::read_topic(dlq_, static_cast<std::size_t>(total), std::chrono::seconds(60));
        dead_letters_ = static_cast<long long>(records.size());
        if (dead_letters_ != total)
            fail(fmt::format("read back {} of {} dead letters", records.size(), total));
        namespace h = idemkafka::dead_letter_header;
        int wrong = 0;
        for (const auto& r : records) {
            const std::string key = r.key.value_or("");
            ++dead_letters_by_reason_[r.header(h::reason)];
            Poison* expected = nullptr;
            if (auto it = poison_.find(key); it != poison_.end())
                expected = &it->second;
            else if (auto f = failing_.find(origin_of(r)); f != failing_.end())
                expected = &f->second;
            std::string problem;
            if (!expected) {
                problem = "is neither one of the poison records nor a record of an order whose handler always fails";
            } else {
                const auto& p = *expected;
                ++expected->dead_letters;
                // Too large for the dead-letter producer: sent without the value, saying its size.
                const bool without_value = p.value.size() > oversize_bytes / 2;
                if (r.header(h::reason) != p.reason)
                    problem = fmt::format("has reason \"{}\", expected \"{}\"", r.header(h::reason), p.reason);
                else if (r.header(h::original_topic) != topic_ ||
                         r.header(h::original_partition) != std::to_string(p.partition) ||
                         r.header(h::original_offset) != std::to_string(p.offset))
                    problem = fmt::format("names origin {}/{}@{}, expected {}/{}@{}", r.header(h::original_topic),
                                          r.header(h::original_partition), r.header(h::original_offset), topic_,
                                          p.partition, p.offset);
                else if (without_value &&
                         (r.value || r.header(h::original_value_bytes) != std::to_string(p.value.size())))
                    problem = fmt::format("carries a value of {} bytes and {} \"{}\", expected none and {} bytes",
                                          r.value ? r.value->size() : 0, h::original_value_bytes,
                                          r.header(h::original_value_bytes), p.value.size());
                else if (!without_value && r.value.value_or("") != p.value)
                    problem = "does not carry the original value";
                else if (r.header(h::consumer_group) != group_)
                    problem = fmt::format("names group \"{}\"", r.header(h::consumer_group));
                else if (r.header(h::error).find(p.error_contains) == std::string::npos &&
                         !(p.reason == "handler_failed" && inherited_count(r.header(h::error))))
                    problem = fmt::format("has an error without \"{}\"", p.error_contains);
                else if (p.reason == "handler_failed" &&
                         r.header(h::attempts) != std::to_string(idemkafka::torture::max_attempts))
                    problem = fmt::format("says {} attempts, expected {}", r.header(h::attempts),
                                          idemkafka::torture::max_attempts);
                else if (!p.key.empty() && key != p.key)
                    problem = fmt::format("has key \"{}\", expected \"{}\"", key, p.key);
            }
            if (!problem.empty() && ++wrong <= 10)
                fail(fmt::format("dead letter {}/{}@{} (key \"{}\", reason \"{}\", error \"{}\") {}", dlq_, r.partition,
                                 r.offset, key, r.header(h::reason), r.header(h::error), problem));
        }
        if (wrong > 10)
            fail(fmt::format("... {} wrong dead letters in all", wrong));
        // At least once each: a kill between the broker's acknowledgement of a
        // dead letter and the offset commit sends it again.
        std::vector<std::string> absent;
        for (const auto& [key, p] : poison_)
            if (p.dead_letters == 0)
                absent.push_back(fmt::format("{} ({}/{}@{})", key, topic_, p.partition, p.offset));
        poison_dead_lettered_ = static_cast<long long>(poison_.size() - absent.size());
        for (const auto& [where, p] : failing_)
            if (p.dead_letters == 0)
                absent.push_back(fmt::format("order {} ({}/{}@{})", p.key, topic_, p.partition, p.offset));
            else
                ++failing_dead_lettered_;
        std::sort(absent.begin(), absent.end());
        if (!absent.empty()) {
            std::string list;
            for (std::size_t i = 0; i < absent.size() && i < 10; ++i)
                list += (i ? ", " : "") + absent[i];
            fail(fmt::format("{} poison records or records of always-failing orders missing from the dead-letter "
                             "topic: {}",
                             absent.size(), list));
        }
    }

    // A record that failed max_attempts times under a member that died before
    // its dead letter got through is dead-lettered by the next member without
    // another call: the handler's own error is then in the dead member's log.
    static bool inherited_count(const std::string& error)
    {
        return error.find("counted before this member held the partition") != std::string::npos;
    }

    // The source coordinates a dead letter names ({-1, -1} when it names none).
    static std::pair<std::int32_t, std::int64_t> origin_of(const test::ReadRecord& r)
    {
        namespace h = idemkafka::dead_letter_header;
        try {
            return {std::stoi(r.header(h::original_partition)), std::stoll(r.header(h::original_offset))};
        } catch (const std::exception&) {
            return {-1, -1};
        }
    }

    void verify_snapshots()
    {
        std::string first;
        for (const auto& snap : snapshots_) {
            for (const auto& r : valid_records_) {
                const auto p = static_cast<std::size_t>(r.partition);
                if (p >= snap.committed.size() || r.offset >= snap.committed[p] || snap.claims.count(r.event_id))
                    continue;
                if (++committed_unprocessed_ <= 5)
                    first += fmt::format("\n    after the kill of run {}: {}/{} committed at {}, but {}@{} (event {}) "
                                         "was not claimed",
                                         snap.run, topic_, r.partition, snap.committed[p], r.partition, r.offset,
                                         r.event_id);
            }
        }
        if (committed_unprocessed_ > 0)
            fail(fmt::format("{} times a Kafka offset was committed past a record whose claim had not committed "
                             "(lost on that crash unless redelivered some other way):{}",
                             committed_unprocessed_, first));
    }

    int report()
    {
        const int required_kills = std::min(20, opt_.kills);
        if (kills_ < required_kills)
            fail(fmt::format("only {} kills (at least {} required)", kills_, required_kills));
        if (broker_faults_ < 1)
            fail("no broker fault was injected");
        if (pg_kills_ < 1)
            fail("no PostgreSQL connection was killed");
        const bool ok = failures_.empty();
        if (!ok) {
            std::fprintf(stderr, "\ntorture: %zu failure(s), seed %llu, logs kept in %s:\n", failures_.size(),
                         static_cast<unsigned long long>(opt_.seed), opt_.log_dir.c_str());
            for (const auto& f : failures_)
                std::fprintf(stderr, "  - %s\n", f.c_str());
            std::fprintf(stderr, "  tables %s and %s kept for inspection\n", charge_table_.c_str(),
                         claims_table_.c_str());
        }
        if (opt_.misbehaving > 0 || opt_.oversize > 0) {
            std::string by_reason;
            for (const auto& [reason, n] : dead_letters_by_reason_)
                by_reason += fmt::format("{}{}={}", by_reason.empty() ? "" : ",", reason, n);
            std::map<idemkafka::torture::Misbehaviour, int> kinds;
            for (const auto& [order, how] : failing_orders_)
                ++kinds[how];
            std::printf("torture: misbehaving swallow_orders=%d throw_always_orders=%d throw_once_orders=%zu "
                        "failing_records=%zu failing_dead_lettered=%lld after_error_rows=%lld oversize=%d "
                        "dead_letters_by_reason=%s\n",
                        kinds[idemkafka::torture::Misbehaviour::swallow],
                        kinds[idemkafka::torture::Misbehaviour::throw_always], throw_once_orders_.size(),
                        failing_.size(), failing_dead_lettered_, after_error_rows_, oversize_published_,
                        by_reason.c_str());
        }
        std::printf("torture: seed=%llu kills=%d broker_faults=%d pg_kills=%d pg_restarts=%d published=%lld "
                    "unique_valid=%lld charges=%lld double_charged=%lld missing=%lld poison=%zu "
                    "poison_dead_lettered=%lld dead_letters=%lld claims=%lld kill_points_checked=%zu "
                    "committed_unprocessed=%lld seconds=%.0f %s\n",
                    static_cast<unsigned long long>(opt_.seed), kills_, broker_faults_, pg_kills_, pg_restarts_,
                    published_, unique_valid_, charges_, double_charged_, missing_, poison_.size(),
                    poison_dead_lettered_, dead_letters_, claims_, snapshots_.size(), committed_unprocessed_, elapsed(),
                    ok ? "OK" : "FAILED");
        std::fflush(stdout);
        if (ok) {
            try {
                test::exec("DROP TABLE IF EXISTS " + idemkafka::quote_identifier(charge_table_) + ", " +
                           idemkafka::quote_identifier(claims_table_) + ", " +
                           idemkafka::quote_identifier(charge_table_ + "_taken") + ", " +
                           idemkafka::quote_identifier(charge_table_ + "_after_error"));
            } catch (const std::exception& e) {
                std::fprintf(stderr, "torture: could not drop the test tables: %s\n", e.what());
            }
            if (temp_log_dir_) {
                std::error_code ignored;
                std::filesystem::remove_all(opt_.log_dir, ignored);
            }
        }
        return ok ? 0 : 1;
    }

    Options opt_;
    std::mt19937_64 rng_;
    std::string pg_, brokers_, control_, kafka_ctl_, pg_restart_cmd_;
    bool temp_log_dir_ = false;
    std::string group_, topic_, dlq_, charge_table_, claims_table_, app_name_, listener_pg_;
    std::map<int, Fault> fault_at_;
    std::unique_ptr<Child> producer_;
    Clock::time_point publish_until_;
    std::map<std::string, long long> producer_summary_;
    std::vector<std::int64_t> source_ends_;
    std::map<std::string, Poison> poison_;
    // Records of orders whose handler always fails, by their coordinates.
    std::map<std::pair<std::int32_t, std::int64_t>, Poison> failing_;
    std::unordered_map<std::string, idemkafka::torture::Misbehaviour> failing_orders_;
    std::set<std::string> throw_once_orders_;
    std::unique_ptr<idemkafka::Publisher> oversize_publisher_;
    int oversize_published_ = 0;
    std::map<std::string, long long> dead_letters_by_reason_;
    struct ValidRecord {
        std::int32_t partition;
        std::int64_t offset;
        std::string event_id;
    };
    std::vector<ValidRecord> valid_records_;
    std::unique_ptr<OffsetProbe> probe_;
    std::vector<Snapshot> snapshots_;
    long long last_claims_ = -1, committed_unprocessed_ = 0;
    std::vector<std::string> failures_;
    int kills_ = 0, broker_faults_ = 0, pg_kills_ = 0, pg_restarts_ = 0;
    long long published_ = 0, unique_valid_ = 0, charges_ = 0, double_charged_ = 0, missing_ = 0, claims_ = 0,
              dead_letters_ = 0, poison_dead_lettered_ = 0, failing_dead_lettered_ = 0, after_error_rows_ = 0;
};

} // namespace

int main(int argc, char** argv)
{
    std::signal(SIGPIPE, SIG_IGN);
    try {
        return Torture(parse_options(argc, argv)).run();
    } catch (const std::exception& e) {
        std::printf("torture: FAILED: %s\n", e.what());
        return 1;
    }
}
