#pragma once
// Consumers run in a child process: the Spring peer's JVM, and the library's
// consumer for the kill -9 run (idemkafka-bench --child-consumer). The bench
// reads their progress lines from the child's stdout, kills and restarts them.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "modes.hpp"

namespace idemkafka::bench {

/// A started child process.
struct Child {
    pid_t pid = -1;
    int out = -1; ///< read end of the child's stdout
};

/// Starts `args` (args[0] looked up in PATH, or a path); the child's stdout is
/// a pipe to the bench, its stderr is appended to `log`, and it is SIGKILLed
/// when the bench dies. Throws when it cannot fork.
Child spawn_child(const std::vector<std::string>& args, const std::string& log);

/// Reads a child's stdout line by line.
class LineReader {
public:
    explicit LineReader(int fd) : fd_(fd) {}
    /// The next line into `line`; false at the end of the output or after
    /// `limit` of silence (then `timed_out`).
    bool next(std::string& line, std::chrono::milliseconds limit, bool& timed_out);

private:
    int fd_;
    std::string buf_;
};

/// How a child ended: its wait status, CPU seconds and peak RSS (MB) over its
/// whole life.
struct Exit {
    int status = 0;
    double cpu_seconds = 0;
    double peak_rss_mb = 0;
};
/// Waits for the child `pid`.
Exit reap(pid_t pid);

/// The last `lines` lines of the file at `path`.
std::string tail_of(const std::string& path, std::size_t lines);

/// Starts one incarnation of a killed consumer: `idle_exit` zero, it runs
/// until killed; otherwise it stops by itself after that long without a new
/// record once it has its partitions (the last incarnation).
using StartChild = std::function<Child(std::chrono::milliseconds idle_exit)>;

/// The kill -9 run shared by the Spring peer and the library: the consumer's
/// process, started by `start`, is SIGKILLed job.kills times, each at a random
/// moment 0.1-2.5 s after its first commit (a PROGRESS line), and restarted;
/// then it runs until idle, again while its group `group` has offsets of
/// job.topic left uncommitted. `what` names the consumer in messages, `log`
/// holds the children's stderr (removed when empty). What was doubled or lost
/// is verified afterwards by run_job, as for every run.
void run_kill9(const RunEnv& env, const Job& job, RunState& st, const std::string& what, const std::string& group,
               const std::string& log, const StartChild& start);

} // namespace idemkafka::bench
