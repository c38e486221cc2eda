#pragma once
// Minimal "--name value" argument parsing shared by the example programs.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>

namespace billing {

class Args {
public:
    /// `known` maps each option (without "--") to its default; "" means required
    /// unless an environment variable fallback is given through get().
    Args(int argc, char** argv, std::map<std::string, std::string> known, const char* usage) : values_(std::move(known))
    {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "--help" || a == "-h") {
                std::fputs(usage, stdout);
                std::exit(0);
            }
            if (a.rfind("--", 0) != 0 || !values_.count(a.substr(2)))
                fail("unknown argument " + a, usage);
            if (i + 1 >= argc)
                fail(a + " needs a value", usage);
            values_[a.substr(2)] = argv[++i];
        }
    }

    std::string get(const std::string& name, const char* env = nullptr) const
    {
        auto v = values_.at(name);
        if (v.empty() && env && std::getenv(env))
            v = std::getenv(env);
        return v;
    }

    long long number(const std::string& name) const
    {
        const auto v = get(name);
        try {
            std::size_t used = 0;
            const long long n = std::stoll(v, &used);
            if (used == v.size())
                return n;
        } catch (const std::exception&) {
        }
        throw std::invalid_argument("--" + name + ": not a number: \"" + v + "\"");
    }

    double real(const std::string& name) const
    {
        const auto v = get(name);
        try {
            std::size_t used = 0;
            const double d = std::stod(v, &used);
            if (used == v.size())
                return d;
        } catch (const std::exception&) {
        }
        throw std::invalid_argument("--" + name + ": not a number: \"" + v + "\"");
    }

    [[noreturn]] static void fail(const std::string& msg, const char* usage)
    {
        std::fprintf(stderr, "error: %s\n\n%s", msg.c_str(), usage);
        std::exit(2);
    }

private:
    std::map<std::string, std::string> values_;
};

} // namespace billing
