// idemkafka-mock-broker: librdkafka's mock cluster as a standalone process.
//
// The mock cluster speaks the real Kafka protocol on loopback (consumer groups, offset commits,
// idempotent producer), so tests can kill -9 a consumer process and restart it against the same
// cluster. A control FIFO lets tests inject faults while the cluster runs.

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <memory>
#include <optional>
#include <poll.h>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace {

constexpr const char* program_name = "idemkafka-mock-broker";
constexpr int exit_usage = 2;
constexpr int exit_failure = 1;

const char* const usage_text = R"(usage: idemkafka-mock-broker [options]

Runs librdkafka's mock Kafka cluster on loopback until SIGTERM or SIGINT.

options:
  --brokers N              number of mock brokers, ids 1..N (default 1)
  --topic NAME:PARTITIONS  create a topic before the cluster is announced; repeatable
  --bootstrap-file PATH    write the bootstrap servers there (atomically, via rename)
  --control PATH           create a FIFO at PATH and read control commands from it
  --watch-pid PID          exit when process PID no longer exists
  --debug CONTEXTS         librdkafka debug contexts for the cluster's log, e.g. mock,protocol
  --group-consumer-session-timeout-ms MS
                           session timeout of group.protocol=consumer (KIP-848) groups, as the
                           broker setting group.consumer.session.timeout.ms (mock default 30000;
                           librdkafka 2.12 or later)
  --group-consumer-heartbeat-interval-ms MS
                           heartbeat interval of such groups, as group.consumer.heartbeat.interval.ms
                           (mock default 3000; librdkafka 2.12 or later)
  --help                   show this text

Once the cluster is ready its bootstrap servers are written to --bootstrap-file (removed again
on exit) and printed on stdout as a line "bootstrap=HOST:PORT,...".

control commands, one per line (results on stderr as "control: <command>: ok" or
"control: <command>: error: <reason>"; the latest result is also written atomically to
PATH.ack as "<count> ok" or "<count> error: <reason>", count = commands handled so far):
  create-topic NAME PARTITIONS
  push-errors APIKEY ERRCODE [ERRCODE...]  fail the next requests of APIKEY, cluster-wide, in order
  clear-errors APIKEY
  broker-down ID
  broker-up ID
  rtt ID MS                                 added round-trip time for broker ID (0 = none)
  group-consumer-timeouts SESSION_MS HEARTBEAT_MS
                                            as the two --group-consumer-* options, for groups
                                            created from now on
  share-group SETTING VALUE                 a share-group (KIP-932) setting of the cluster
                                            (librdkafka 2.15 or later): lock-duration-ms MS
                                            (acquisition lock, default 30000), delivery-limit N
                                            (deliveries before the broker archives a record,
                                            default 5, 0 = none), auto-offset-reset
                                            earliest|latest (default latest), max-record-locks N
                                            (default 2000): for every share group, existing ones
                                            too; session-timeout-ms MS (default 45000),
                                            heartbeat-interval-ms MS (default 5000): for share
                                            groups created from now on
  share-assign GROUP MEMBERS TOPIC [TOPIC...]
                                            when share group GROUP has exactly MEMBERS members,
                                            assigns every partition of each TOPIC (created here:
                                            --topic or create-topic) to every one of them, so they
                                            share partitions as a real broker's share assignor
                                            does (the mock's own gives each partition to one
                                            member); else an error naming the count found, to be
                                            asked again. The assignment is then manual: members
                                            joining later get nothing (librdkafka 2.15 or later)
  ping                                      no-op, answers ok
APIKEY is a number or a name (Produce, Fetch, Metadata, OffsetCommit, OffsetFetch,
FindCoordinator, JoinGroup, Heartbeat, LeaveGroup, SyncGroup, InitProducerId,
ConsumerGroupHeartbeat, ...).
ERRCODE is a number or a librdkafka error name (REQUEST_TIMED_OUT, NOT_COORDINATOR, _TRANSPORT, ...).

notes on librdkafka 2.0's mock cluster: it has no CreateTopics API (admin clients time out
waiting for a controller), so create topics here; any topic named in a Metadata request is
auto-created with 4 partitions, whatever the client's allow.auto.create.topics; partitions
have min(3, N) replicas. A share consumer (librdkafka 2.15) resolves topics by id and never
creates one: create its topics here before it subscribes.
)";

// Thrown for bad command-line arguments: main prints it and exits with status 2.
struct UsageError {
    std::string message;
};

struct Options {
    int brokers = 1;
    std::vector<std::pair<std::string, int>> topics;
    std::string bootstrap_file;
    std::string control_path;
    pid_t watch_pid = 0;
    std::string debug;
    int group_consumer_session_timeout_ms = 0; // 0: the mock cluster's default
    int group_consumer_heartbeat_interval_ms = 0;
};

// The consumer group protocol's (KIP-848) mock settings came with its
// general availability in librdkafka 2.12.
#if defined(RD_KAFKA_VERSION) && RD_KAFKA_VERSION >= 0x020c0000
#define IDEMKAFKA_MOCK_CONSUMER_GROUPS 1
#else
#define IDEMKAFKA_MOCK_CONSUMER_GROUPS 0
#endif

// The mock cluster's share-group settings (KIP-932) came with the share consumer's preview in
// librdkafka 2.15; the build asks the library found whether it has them.
#ifndef IDEMKAFKA_MOCK_SHARE_GROUPS
#define IDEMKAFKA_MOCK_SHARE_GROUPS 0
#endif

// Empty when applied; else why not.
std::string set_group_consumer_timeouts([[maybe_unused]] rd_kafka_mock_cluster_t* mcluster,
                                        [[maybe_unused]] int session_ms, [[maybe_unused]] int heartbeat_ms)
{
#if IDEMKAFKA_MOCK_CONSUMER_GROUPS
    if (session_ms > 0) {
        rd_kafka_mock_set_group_consumer_session_timeout_ms(mcluster, session_ms);
    }
    if (heartbeat_ms > 0) {
        rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(mcluster, heartbeat_ms);
    }
    return "";
#else
    if (session_ms <= 0 && heartbeat_ms <= 0) {
        return "";
    }
    return std::string("consumer group protocol settings need librdkafka 2.12 or later; this is ") +
           rd_kafka_version_str();
#endif
}

std::optional<long long> parse_integer(const std::string& text, long long min, long long max)
{
    if (text.empty()) {
        return std::nullopt;
    }
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end == nullptr || *end != '\0' || value < min || value > max) {
        return std::nullopt;
    }
    return value;
}

Options parse_options(int argc, char** argv)
{
    Options options;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::fputs(usage_text, stdout);
            std::exit(0);
        }
        std::string value;
        bool have_value = false;
        if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
            value = arg.substr(eq + 1);
            arg.resize(eq);
            have_value = true;
        }
        const auto next_value = [&]() -> std::string {
            if (have_value) {
                return value;
            }
            if (i + 1 >= argc) {
                throw UsageError{arg + " needs a value"};
            }
            return argv[++i];
        };

        if (arg == "--brokers") {
            const std::string v = next_value();
            const auto n = parse_integer(v, 1, 64);
            if (!n) {
                throw UsageError{"--brokers: expected a number from 1 to 64, got '" + v + "'"};
            }
            options.brokers = static_cast<int>(*n);
        } else if (arg == "--topic") {
            const std::string v = next_value();
            const auto colon = v.rfind(':');
            if (colon == std::string::npos || colon == 0) {
                throw UsageError{"--topic: expected NAME:PARTITIONS, got '" + v + "'"};
            }
            const auto partitions = parse_integer(v.substr(colon + 1), 1, 100000);
            if (!partitions) {
                throw UsageError{"--topic: PARTITIONS must be a number from 1 to 100000, got '" + v + "'"};
            }
            options.topics.emplace_back(v.substr(0, colon), static_cast<int>(*partitions));
        } else if (arg == "--bootstrap-file") {
            options.bootstrap_file = next_value();
            if (options.bootstrap_file.empty()) {
                throw UsageError{"--bootstrap-file: empty path"};
            }
        } else if (arg == "--control") {
            options.control_path = next_value();
            if (options.control_path.empty()) {
                throw UsageError{"--control: empty path"};
            }
        } else if (arg == "--watch-pid") {
            const std::string v = next_value();
            const auto pid = parse_integer(v, 1, std::numeric_limits<pid_t>::max());
            if (!pid) {
                throw UsageError{"--watch-pid: expected a process id, got '" + v + "'"};
            }
            options.watch_pid = static_cast<pid_t>(*pid);
        } else if (arg == "--debug") {
            options.debug = next_value();
        } else if (arg == "--group-consumer-session-timeout-ms" || arg == "--group-consumer-heartbeat-interval-ms") {
            const std::string v = next_value();
            const auto ms = parse_integer(v, 1, 3600000);
            if (!ms) {
                throw UsageError{arg.append(": expected milliseconds from 1 to 3600000, got '").append(v) + "'"};
            }
            (arg == "--group-consumer-session-timeout-ms" ? options.group_consumer_session_timeout_ms
                                                          : options.group_consumer_heartbeat_interval_ms) =
                static_cast<int>(*ms);
        } else {
            throw UsageError{"unknown argument '" + arg + "'"};
        }
    }
    return options;
}

// ---------------------------------------------------------------------------------------------
// Signals: the handler only writes to a self-pipe; the main loop polls it.

int signal_pipe[2] = {-1, -1};

extern "C" void on_terminate_signal(int)
{
    const int saved = errno;
    const char byte = 1;
    [[maybe_unused]] const ssize_t n = write(signal_pipe[1], &byte, 1);
    errno = saved;
}

bool install_signal_handlers(std::string& error)
{
    if (pipe(signal_pipe) != 0) {
        error = std::string("pipe: ") + std::strerror(errno);
        return false;
    }
    for (const int fd : signal_pipe) {
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    struct sigaction action {};
    action.sa_handler = on_terminate_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &action, nullptr) != 0 || sigaction(SIGINT, &action, nullptr) != 0) {
        error = std::string("sigaction: ") + std::strerror(errno);
        return false;
    }
    std::signal(SIGPIPE, SIG_IGN);
    return true;
}

// ---------------------------------------------------------------------------------------------

struct RdKafkaDeleter {
    void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct RdKafkaConfDeleter {
    void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
struct MockClusterDeleter {
    void operator()(rd_kafka_mock_cluster_t* mcluster) const { rd_kafka_mock_cluster_destroy(mcluster); }
};
using RdKafkaPtr = std::unique_ptr<rd_kafka_t, RdKafkaDeleter>;
using RdKafkaConfPtr = std::unique_ptr<rd_kafka_conf_t, RdKafkaConfDeleter>;
using MockClusterPtr = std::unique_ptr<rd_kafka_mock_cluster_t, MockClusterDeleter>;

// Writes via a temporary file and rename so a reader polling for PATH never sees a partial file.
bool write_file_atomically(const std::string& path, const std::string& content, std::string& error)
{
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr) {
        error = tmp + ": " + std::strerror(errno);
        return false;
    }
    const bool written = std::fwrite(content.data(), 1, content.size(), f) == content.size();
    const bool closed = std::fclose(f) == 0;
    if (!written || !closed) {
        error = tmp + ": write failed";
        std::remove(tmp.c_str());
        return false;
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        error = path + ": " + std::strerror(errno);
        std::remove(tmp.c_str());
        return false;
    }
    return true;
}

std::optional<int16_t> parse_api_key(const std::string& text)
{
    if (const auto n = parse_integer(text, 0, std::numeric_limits<int16_t>::max())) {
        return static_cast<int16_t>(*n);
    }
    static const std::pair<const char*, int16_t> names[] = {
        {"Produce", 0},
        {"Fetch", 1},
        {"ListOffsets", 2},
        {"Metadata", 3},
        {"OffsetCommit", 8},
        {"OffsetFetch", 9},
        {"FindCoordinator", 10},
        {"JoinGroup", 11},
        {"Heartbeat", 12},
        {"LeaveGroup", 13},
        {"SyncGroup", 14},
        {"DescribeGroups", 15},
        {"ListGroups", 16},
        {"SaslHandshake", 17},
        {"ApiVersion", 18},
        {"CreateTopics", 19},
        {"DeleteTopics", 20},
        {"DeleteRecords", 21},
        {"InitProducerId", 22},
        {"OffsetForLeaderEpoch", 23},
        {"AddPartitionsToTxn", 24},
        {"AddOffsetsToTxn", 25},
        {"EndTxn", 26},
        {"TxnOffsetCommit", 28},
        {"ConsumerGroupHeartbeat", 68},
        {"ConsumerGroupDescribe", 69},
        {"ShareGroupHeartbeat", 76},
        {"ShareGroupDescribe", 77},
        {"ShareFetch", 78},
        {"ShareAcknowledge", 79},
    };
    for (const auto& [name, key] : names) {
        if (strcasecmp(name, text.c_str()) == 0) {
            return key;
        }
    }
    return std::nullopt;
}

std::optional<rd_kafka_resp_err_t> parse_error_code(const std::string& text)
{
    if (const auto n = parse_integer(text, std::numeric_limits<int>::min(), std::numeric_limits<int>::max())) {
        return static_cast<rd_kafka_resp_err_t>(*n);
    }
    std::string name = text;
    if (constexpr const char* prefix = "RD_KAFKA_RESP_ERR_"; name.rfind(prefix, 0) == 0) {
        name.erase(0, std::strlen(prefix));
    }
    const struct rd_kafka_err_desc* descs = nullptr;
    size_t count = 0;
    rd_kafka_get_err_descs(&descs, &count);
    for (size_t i = 0; i < count; ++i) {
        if (descs[i].name != nullptr && strcasecmp(descs[i].name, name.c_str()) == 0) {
            return descs[i].code;
        }
    }
    return std::nullopt;
}

class ControlChannel {
public:
    ControlChannel(rd_kafka_mock_cluster_t* mcluster, std::string path, std::vector<std::pair<std::string, int>> topics)
        : mcluster_(mcluster), path_(std::move(path)), topics_(std::move(topics))
    {
    }
    ControlChannel(const ControlChannel&) = delete;
    ControlChannel& operator=(const ControlChannel&) = delete;

    ~ControlChannel()
    {
        if (fd_ >= 0) {
            close(fd_);
            unlink(path_.c_str());
            unlink((path_ + ".ack").c_str());
        }
    }

    bool open_fifo(std::string& error)
    {
        if (mkfifo(path_.c_str(), 0600) != 0 && errno != EEXIST) {
            error = path_ + ": mkfifo: " + std::strerror(errno);
            return false;
        }
        struct stat st {};
        if (stat(path_.c_str(), &st) != 0 || !S_ISFIFO(st.st_mode)) {
            error = path_ + ": exists and is not a FIFO";
            return false;
        }
        // Read-write so the FIFO never reports end-of-file between writers.
        fd_ = open(path_.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
        if (fd_ < 0) {
            error = path_ + ": open: " + std::strerror(errno);
            return false;
        }
        return true;
    }

    int fd() const { return fd_; }

    void on_readable()
    {
        char buf[4096];
        for (;;) {
            const ssize_t n = read(fd_, buf, sizeof buf);
            if (n > 0) {
                pending_.append(buf, static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && errno == EINTR) {
                continue;
            }
            break;
        }
        std::string::size_type newline;
        while ((newline = pending_.find('\n')) != std::string::npos) {
            std::string line = pending_.substr(0, newline);
            pending_.erase(0, newline + 1);
            if (!line.empty() && line.back() == '\r') {
                line.pop_back();
            }
            handle_line(line);
        }
        if (pending_.size() > 65536) {
            pending_.clear();
            report("<overlong line>", "error: line too long, discarded");
        }
    }

private:
    void handle_line(const std::string& line)
    {
        std::istringstream in(line);
        std::vector<std::string> words;
        for (std::string w; in >> w;) {
            words.push_back(w);
        }
        if (words.empty() || words.front().front() == '#') {
            return;
        }
        std::string normalized;
        for (const auto& w : words) {
            normalized += (normalized.empty() ? "" : " ") + w;
        }
        report(normalized, execute(words));
    }

    static std::string wrong_arity(const char* synopsis) { return std::string("error: usage: ") + synopsis; }

    static std::string result(rd_kafka_resp_err_t err)
    {
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            return "ok";
        }
        return std::string("error: ") + rd_kafka_err2name(err) + ": " + rd_kafka_err2str(err);
    }

    std::string execute(const std::vector<std::string>& words)
    {
        const std::string& cmd = words.front();
        if (cmd == "ping") {
            return words.size() == 1 ? "ok" : wrong_arity("ping");
        }
        if (cmd == "create-topic") {
            return create_topic(words);
        }
        if (cmd == "push-errors" || cmd == "clear-errors") {
            return request_errors(words);
        }
        if (cmd == "group-consumer-timeouts") {
            return group_consumer_timeouts(words);
        }
        if (cmd == "share-group") {
            return share_group(words);
        }
        if (cmd == "share-assign") {
            return share_assign(words);
        }
        if (cmd == "broker-down" || cmd == "broker-up" || cmd == "rtt") {
            return broker_state(words);
        }
        return "error: unknown command '" + cmd + "'";
    }

    std::string create_topic(const std::vector<std::string>& words)
    {
        if (words.size() != 3) {
            return wrong_arity("create-topic NAME PARTITIONS");
        }
        const auto partitions = parse_integer(words[2], 1, 100000);
        if (!partitions) {
            return "error: PARTITIONS must be a number from 1 to 100000";
        }
        const rd_kafka_resp_err_t err =
            rd_kafka_mock_topic_create(mcluster_, words[1].c_str(), static_cast<int>(*partitions), 1);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
            topics_.emplace_back(words[1], static_cast<int>(*partitions));
        }
        return result(err);
    }

    std::string request_errors(const std::vector<std::string>& words)
    {
        const bool push = words.front() == "push-errors";
        const size_t argc = words.size() - 1;
        if (push ? argc < 2 : argc != 1) {
            return wrong_arity(push ? "push-errors APIKEY ERRCODE [ERRCODE...]" : "clear-errors APIKEY");
        }
        const auto api_key = parse_api_key(words[1]);
        if (!api_key) {
            return "error: unknown APIKEY '" + words[1] + "'";
        }
        if (!push) {
            rd_kafka_mock_clear_request_errors(mcluster_, *api_key);
            return "ok";
        }
        std::vector<rd_kafka_resp_err_t> errors;
        for (size_t i = 2; i < words.size(); ++i) {
            const auto err = parse_error_code(words[i]);
            if (!err) {
                return "error: unknown ERRCODE '" + words[i] + "'";
            }
            errors.push_back(*err);
        }
        rd_kafka_mock_push_request_errors_array(mcluster_, *api_key, errors.size(), errors.data());
        return "ok";
    }

    std::string group_consumer_timeouts(const std::vector<std::string>& words)
    {
        if (words.size() != 3) {
            return wrong_arity("group-consumer-timeouts SESSION_MS HEARTBEAT_MS");
        }
        const auto session_ms = parse_integer(words[1], 1, 3600000);
        const auto heartbeat_ms = parse_integer(words[2], 1, 3600000);
        if (!session_ms || !heartbeat_ms) {
            return "error: SESSION_MS and HEARTBEAT_MS must be milliseconds from 1 to 3600000";
        }
        const std::string why =
            set_group_consumer_timeouts(mcluster_, static_cast<int>(*session_ms), static_cast<int>(*heartbeat_ms));
        return why.empty() ? "ok" : "error: " + why;
    }

    std::string share_group(const std::vector<std::string>& words)
    {
        if (words.size() != 3) {
            return wrong_arity("share-group SETTING VALUE");
        }
#if IDEMKAFKA_MOCK_SHARE_GROUPS
        const std::string& setting = words[1];
        const std::string& text = words[2];
        if (setting == "auto-offset-reset") {
            if (text != "earliest" && text != "latest") {
                return "error: auto-offset-reset is earliest or latest";
            }
            rd_kafka_mock_sharegroup_set_auto_offset_reset(mcluster_, text == "earliest" ? 1 : 0);
            return "ok";
        }
        const bool may_be_zero = setting == "delivery-limit" || setting == "max-record-locks";
        const auto value = parse_integer(text, may_be_zero ? 0 : 1, std::numeric_limits<int>::max());
        if (!value) {
            return "error: " + setting + " takes a " + (may_be_zero ? "non-negative" : "positive") + " number";
        }
        const int n = static_cast<int>(*value);
        if (setting == "lock-duration-ms") {
            rd_kafka_mock_sharegroup_set_record_lock_duration(mcluster_, n);
        } else if (setting == "delivery-limit") {
            rd_kafka_mock_sharegroup_set_max_delivery_attempts(mcluster_, n);
        } else if (setting == "max-record-locks") {
            rd_kafka_mock_sharegroup_set_max_record_locks(mcluster_, n);
        } else if (setting == "session-timeout-ms") {
            rd_kafka_mock_sharegroup_set_session_timeout(mcluster_, n);
        } else if (setting == "heartbeat-interval-ms") {
            rd_kafka_mock_sharegroup_set_heartbeat_interval(mcluster_, n);
        } else {
            return "error: unknown share-group setting '" + setting + "'";
        }
        return "ok";
#else
        return no_share_groups();
#endif
    }

    // The answer of a share-group command where the mock cluster has none.
    static std::string no_share_groups()
    {
        return std::string("error: share groups need a librdkafka with the share consumer (2.15 or later); this is ") +
               rd_kafka_version_str();
    }

    // Partitions of a topic created by this process; 0 when unknown (an auto-created one).
    int partitions_of(const std::string& topic) const
    {
        int partitions = 0;
        for (const auto& [name, count] : topics_) {
            if (name == topic) {
                partitions = count; // the latest creation counts
            }
        }
        return partitions;
    }

    std::string share_assign(const std::vector<std::string>& words)
    {
        if (words.size() < 4) {
            return wrong_arity("share-assign GROUP MEMBERS TOPIC [TOPIC...]");
        }
        const auto expected = parse_integer(words[2], 1, std::numeric_limits<int>::max());
        if (!expected) {
            return "error: MEMBERS takes a positive number";
        }
        std::vector<std::pair<std::string, int>> topics;
        for (size_t i = 3; i < words.size(); ++i) {
            const int partitions = partitions_of(words[i]);
            if (partitions == 0) {
                return "error: topic '" + words[i] + "' was not created here (--topic or create-topic)";
            }
            topics.emplace_back(words[i], partitions);
        }
#if IDEMKAFKA_MOCK_SHARE_GROUPS
        char** ids = nullptr;
        size_t count = 0;
        const rd_kafka_resp_err_t err =
            rd_kafka_mock_sharegroup_get_member_ids(mcluster_, words[1].c_str(), &ids, &count);
        // The ids are librdkafka's allocations, freed by its allocator.
        std::vector<std::string> members;
        for (size_t i = 0; i < count && ids != nullptr; ++i) {
            members.emplace_back(ids[i]);
            rd_kafka_mem_free(nullptr, ids[i]);
        }
        rd_kafka_mem_free(nullptr, ids);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            return result(err);
        }
        if (members.size() != static_cast<size_t>(*expected)) {
            return "error: share group " + words[1] + " has " + std::to_string(members.size()) + " members, not " +
                   words[2];
        }
        // One list per member, each with every partition: the mock copies them.
        std::vector<const char*> member_ids;
        std::vector<std::unique_ptr<rd_kafka_topic_partition_list_t, void (*)(rd_kafka_topic_partition_list_t*)>> lists;
        std::vector<rd_kafka_topic_partition_list_t*> assignments;
        for (const auto& id : members) {
            lists.emplace_back(rd_kafka_topic_partition_list_new(0), rd_kafka_topic_partition_list_destroy);
            for (const auto& [topic, partitions] : topics) {
                for (int p = 0; p < partitions; ++p) {
                    rd_kafka_topic_partition_list_add(lists.back().get(), topic.c_str(), p);
                }
            }
            member_ids.push_back(id.c_str());
            assignments.push_back(lists.back().get());
        }
        rd_kafka_mock_sharegroup_target_assignment(mcluster_, words[1].c_str(), member_ids.data(), assignments.data(),
                                                   member_ids.size());
        return "ok";
#else
        return no_share_groups();
#endif
    }

    std::string broker_state(const std::vector<std::string>& words)
    {
        const std::string& cmd = words.front();
        const bool is_rtt = cmd == "rtt";
        if (words.size() - 1 != (is_rtt ? 2U : 1U)) {
            return wrong_arity(is_rtt ? "rtt ID MS" : (cmd == "broker-up" ? "broker-up ID" : "broker-down ID"));
        }
        const auto id = parse_integer(words[1], 0, std::numeric_limits<int32_t>::max());
        if (!id) {
            return "error: ID must be a broker id";
        }
        const auto broker_id = static_cast<int32_t>(*id);
        if (is_rtt) {
            const auto ms = parse_integer(words[2], 0, std::numeric_limits<int>::max());
            if (!ms) {
                return "error: MS must be a non-negative number of milliseconds";
            }
            return result(rd_kafka_mock_broker_set_rtt(mcluster_, broker_id, static_cast<int>(*ms)));
        }
        return result(cmd == "broker-up" ? rd_kafka_mock_broker_set_up(mcluster_, broker_id)
                                         : rd_kafka_mock_broker_set_down(mcluster_, broker_id));
    }

    void report(const std::string& command, const std::string& outcome)
    {
        ++handled_;
        std::fprintf(stderr, "%s: control: %s: %s\n", program_name, command.c_str(), outcome.c_str());
        std::fflush(stderr);
        std::string error;
        if (!write_file_atomically(path_ + ".ack", std::to_string(handled_) + " " + outcome + "\n", error)) {
            std::fprintf(stderr, "%s: cannot write ack file: %s\n", program_name, error.c_str());
        }
    }

    rd_kafka_mock_cluster_t* mcluster_;
    std::string path_;
    int fd_ = -1;
    std::string pending_;
    unsigned long long handled_ = 0;
    std::vector<std::pair<std::string, int>> topics_; // created by this process, for share-assign
};

// The mock cluster needs a client handle to host its thread and logger; this producer is
// never used to produce anything. Null (after a message) if it cannot be made.
RdKafkaPtr host_handle(const Options& options, int& status)
{
    RdKafkaConfPtr conf{rd_kafka_conf_new()};
    char errstr[512];
    if (!options.debug.empty() &&
        rd_kafka_conf_set(conf.get(), "debug", options.debug.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK) {
        std::fprintf(stderr, "%s: --debug: %s\n", program_name, errstr);
        status = exit_usage;
        return nullptr;
    }
    rd_kafka_conf_set(conf.get(), "client.id", program_name, errstr, sizeof errstr);
    if (options.debug.empty()) {
        // Keeps the host handle's notice about its own missing bootstrap.servers out of test logs.
        rd_kafka_conf_set(conf.get(), "log_level", "4", errstr, sizeof errstr);
    }
    RdKafkaPtr rk{rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr, sizeof errstr)};
    if (!rk) {
        std::fprintf(stderr, "%s: rd_kafka_new: %s\n", program_name, errstr);
        status = exit_failure;
        return nullptr;
    }
    [[maybe_unused]] rd_kafka_conf_t* owned_by_rk = conf.release(); // rd_kafka_new took it
    return rk;
}

// Serves the control channel until a signal, or until the watched process is gone.
int serve(const Options& options, ControlChannel* control)
{
    for (;;) {
        pollfd fds[2] = {{signal_pipe[0], POLLIN, 0}, {control ? control->fd() : -1, POLLIN, 0}};
        const int timeout_ms = options.watch_pid > 0 ? 1000 : -1;
        const int n = poll(fds, 2, timeout_ms);
        if (n < 0 && errno != EINTR) {
            std::fprintf(stderr, "%s: poll: %s\n", program_name, std::strerror(errno));
            return exit_failure;
        }
        if (fds[0].revents != 0) {
            return 0;
        }
        if (control && fds[1].revents != 0) {
            control->on_readable();
        }
        if (options.watch_pid > 0 && kill(options.watch_pid, 0) != 0 && errno == ESRCH) {
            std::fprintf(stderr, "%s: process %d is gone, exiting\n", program_name,
                         static_cast<int>(options.watch_pid));
            return 0;
        }
    }
}

int run(const Options& options)
{
    std::string error;
    if (!install_signal_handlers(error)) {
        std::fprintf(stderr, "%s: %s\n", program_name, error.c_str());
        return exit_failure;
    }
    int status = 0;
    RdKafkaPtr rk = host_handle(options, status);
    if (!rk) {
        return status;
    }
    MockClusterPtr mcluster{rd_kafka_mock_cluster_new(rk.get(), options.brokers)};
    if (!mcluster) {
        std::fprintf(stderr, "%s: could not create the mock cluster\n", program_name);
        return exit_failure;
    }

    if (const std::string why = set_group_consumer_timeouts(mcluster.get(), options.group_consumer_session_timeout_ms,
                                                            options.group_consumer_heartbeat_interval_ms);
        !why.empty()) {
        std::fprintf(stderr, "%s: --group-consumer-*: %s\n", program_name, why.c_str());
        return exit_usage;
    }

    for (const auto& [name, partitions] : options.topics) {
        const rd_kafka_resp_err_t err = rd_kafka_mock_topic_create(mcluster.get(), name.c_str(), partitions, 1);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            std::fprintf(stderr, "%s: create topic %s: %s\n", program_name, name.c_str(), rd_kafka_err2str(err));
            return exit_failure;
        }
    }

    std::unique_ptr<ControlChannel> control;
    if (!options.control_path.empty()) {
        control = std::make_unique<ControlChannel>(mcluster.get(), options.control_path, options.topics);
        if (!control->open_fifo(error)) {
            std::fprintf(stderr, "%s: --control: %s\n", program_name, error.c_str());
            return exit_failure;
        }
    }

    const std::string bootstraps = rd_kafka_mock_cluster_bootstraps(mcluster.get());
    // The bootstrap file is the readiness signal, so it is written last.
    if (!options.bootstrap_file.empty() && !write_file_atomically(options.bootstrap_file, bootstraps + "\n", error)) {
        std::fprintf(stderr, "%s: --bootstrap-file: %s\n", program_name, error.c_str());
        return exit_failure;
    }
    std::printf("bootstrap=%s\n", bootstraps.c_str());
    std::fflush(stdout);

    status = serve(options, control.get());
    control.reset();
    mcluster.reset();
    rk.reset();
    if (!options.bootstrap_file.empty()) {
        unlink(options.bootstrap_file.c_str());
    }
    return status;
}

} // namespace

int main(int argc, char** argv)
{
    Options options;
    try {
        options = parse_options(argc, argv);
    } catch (const UsageError& e) {
        std::fprintf(stderr, "%s: %s\n(try --help)\n", program_name, e.message.c_str());
        return exit_usage;
    }
    return run(options);
}
