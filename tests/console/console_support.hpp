#pragma once
// The console (idemkafka-admin serve, IDEMKAFKA_ADMIN_BIN) as a child process
// of a test: started on a free loopback port, its port read from its first
// line, stopped with SIGTERM when the test is done.

#include <csignal>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_env.hpp"

namespace idemkafka::test {

class ConsoleProcess {
public:
    /// Starts `idemkafka-admin serve --listen 127.0.0.1:0 <args>` and waits
    /// (bounded) until it listens. Throws with its output when it does not.
    explicit ConsoleProcess(const std::vector<std::string>& args)
    {
        const std::string base = "/tmp/" + unique_name("ikconsole");
        out_ = base + ".out";
        err_ = base + ".err";
        pid_ = fork();
        if (pid_ == 0) {
            const int out = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            const int err = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(out, 1);
            dup2(err, 2);
            std::vector<std::string> all = {IDEMKAFKA_ADMIN_BIN, "serve", "--listen", "127.0.0.1:0"};
            all.insert(all.end(), args.begin(), args.end());
            std::vector<char*> argv;
            for (auto& a : all)
                argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)/");
        const bool up = wait_until(
            [&] {
                std::smatch m;
                const std::string text = output();
                if (std::regex_search(text, m, listening))
                    port_ = std::stoi(m[1]);
                return port_ > 0 || exited();
            },
            std::chrono::seconds(20));
        if (!up || port_ <= 0)
            throw std::runtime_error("the console did not start: " + output() + errors());
    }
    ~ConsoleProcess()
    {
        if (pid_ > 0 && !exited_) {
            kill(pid_, SIGTERM);
            int status = 0;
            waitpid(pid_, &status, 0);
        }
        std::remove(out_.c_str());
        std::remove(err_.c_str());
    }
    ConsoleProcess(const ConsoleProcess&) = delete;
    ConsoleProcess& operator=(const ConsoleProcess&) = delete;

    int port() const { return port_; }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
    std::string output() const { return read(out_); }
    /// What the console wrote to stderr (its error lines).
    std::string errors() const { return read(err_); }

private:
    static std::string read(const std::string& path)
    {
        std::ifstream f(path);
        std::stringstream ss;
        ss << f.rdbuf();
        return ss.str();
    }
    bool exited()
    {
        int status = 0;
        if (!exited_ && waitpid(pid_, &status, WNOHANG) == pid_)
            exited_ = true;
        return exited_;
    }

    pid_t pid_ = -1;
    int port_ = 0;
    bool exited_ = false;
    std::string out_, err_;
};

} // namespace idemkafka::test
