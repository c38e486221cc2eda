#pragma once
// Runs idemkafka-admin (IDEMKAFKA_ADMIN_BIN, a compile definition of the test
// targets) and other command lines through the shell as a user would, with the
// exit status, stdout and stderr captured through temporary files.

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <sys/wait.h>

#include "test_env.hpp"

namespace idemkafka::test {

/// One command's exit status (-1 when it did not exit normally) and output.
struct Result {
    int rc = -1;
    std::string out, err;
    std::string all() const { return out + err; }
};

/// `s` as one shell word: in single quotes, any single quote in it escaped.
inline std::string shell_quote(const std::string& s)
{
    std::string q = "'";
    for (char c : s) {
        if (c == '\'')
            q += "'\\''";
        else
            q.push_back(c);
    }
    return q + "'";
}

/// The contents of the file at `path` (empty when it cannot be read); the file
/// is deleted afterwards when `remove` is set.
inline std::string slurp(const std::string& path, bool remove = true)
{
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (remove)
        std::remove(path.c_str());
    return ss.str();
}

/// Runs a shell command line, with stdout and stderr captured.
inline Result run_shell(const std::string& cmd)
{
    const std::string base = "/tmp/" + unique_name("ikadmin");
    const int status = std::system((cmd + " >" + base + ".out 2>" + base + ".err").c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(base + ".out");
    r.err = slurp(base + ".err");
    return r;
}

/// The command line of one idemkafka-admin run: the environment is cleared of
/// the variables the tool reads, then `env` is set.
inline std::string admin_command_line(const std::vector<std::string>& args,
                                      const std::map<std::string, std::string>& env = {})
{
    std::string cmd = "env -u IDEMKAFKA_POSTGRES -u IDEMKAFKA_BROKERS";
    for (const auto& [k, v] : env)
        cmd += " " + shell_quote(k + "=" + v);
    cmd += " " + shell_quote(IDEMKAFKA_ADMIN_BIN);
    for (const auto& a : args)
        cmd += " " + shell_quote(a);
    return cmd;
}

/// Runs idemkafka-admin with `args` and only `env` of the variables it reads.
inline Result admin(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {})
{
    return run_shell(admin_command_line(args, env));
}

/// Starts one idemkafka-admin run per argument list at the same moment and
/// returns each one's result, in the order of `runs`. The wait status of the
/// shell that ran them is stored in `*shell_status` when it is given.
inline std::vector<Result> admin_parallel(const std::vector<std::vector<std::string>>& runs,
                                          int* shell_status = nullptr)
{
    const std::string base = "/tmp/" + unique_name("ikadminp");
    std::string script;
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const std::string p = base + "." + std::to_string(i);
        script += "(" + admin_command_line(runs[i]) + " >" + p + ".out 2>" + p + ".err; echo $? >" + p + ".rc) & ";
    }
    script += "wait";
    const int status = std::system(("bash -c " + shell_quote(script)).c_str());
    if (shell_status)
        *shell_status = status;
    std::vector<Result> out;
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const std::string p = base + "." + std::to_string(i);
        Result r;
        r.out = slurp(p + ".out");
        r.err = slurp(p + ".err");
        const std::string rc = slurp(p + ".rc");
        r.rc = rc.empty() ? -1 : std::stoi(rc);
        out.push_back(std::move(r));
    }
    return out;
}

/// Whether `part` occurs in `text`.
inline bool has(const std::string& text, const std::string& part)
{
    return text.find(part) != std::string::npos;
}

} // namespace idemkafka::test
