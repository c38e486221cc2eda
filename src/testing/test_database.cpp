// TestDatabase: a uniquely named schema on a PostgreSQL server the test names,
// or on a throwaway cluster of its own (as scripts/lib.sh ik_start_postgres
// makes one for the project's own tests).

#include "idemkafka/testing.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "idemkafka/config.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/redact.hpp"

namespace idemkafka {
namespace {

namespace fs = std::filesystem;

constexpr const char* env_conninfo = "IDEMKAFKA_TEST_PG";
// Socket paths are limited to 107 bytes; the directory name adds ~40.
constexpr std::size_t max_base_dir = 60;

std::string unique_schema_name()
{
    static std::atomic<unsigned> counter{0};
    static const unsigned salt = std::random_device{}();
    return fmt::format("idemkafka_test_{}_{}_{:06x}", static_cast<long>(getpid()), counter++, salt & 0xffffffU);
}

bool is_uri(const std::string& conninfo)
{
    return conninfo.rfind("postgresql://", 0) == 0 || conninfo.rfind("postgres://", 0) == 0;
}

// The server's conninfo with `schema` as search_path. libpq takes the last of
// a repeated keyword, so an options= already there is overridden.
std::string with_search_path(const std::string& conninfo, const std::string& schema)
{
    if (is_uri(conninfo))
        return conninfo + (conninfo.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" + schema;
    return conninfo + (conninfo.empty() ? "" : " ") + "options='-csearch_path=" + schema + "'";
}

std::string tail_of(const std::string& path, std::size_t lines)
{
    std::ifstream in(path);
    std::vector<std::string> all;
    for (std::string line; std::getline(in, line);)
        all.push_back(line);
    std::string out;
    for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
        out += all[i] + "\n";
    return out;
}

// Runs argv[0] (an absolute path) with stdout and stderr appended to `log` and
// `cwd` as working directory; returns its exit status (-1 when it did not exit).
int run_process(const std::vector<std::string>& args, const std::string& log, const std::string& cwd)
{
    std::vector<char*> argv;
    argv.reserve(args.size() + 1);
    for (const auto& a : args)
        argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const long max_fd = std::max(256L, sysconf(_SC_OPEN_MAX));
    const pid_t pid = fork();
    if (pid < 0)
        throw DatabaseError(fmt::format("TestDatabase: fork: {}", std::strerror(errno)));
    if (pid == 0) {
        // Only async-signal-safe calls: the test process has other threads.
        const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0 || chdir(cwd.c_str()) != 0)
            _exit(127);
        const int devnull = open("/dev/null", O_RDONLY);
        if (devnull < 0 || dup2(devnull, 0) < 0)
            _exit(127);
        // The server must not keep the test's sockets or pipes (a test runner
        // waits for its output pipe to close).
        for (long i = 3; i < max_fd; ++i)
            close(static_cast<int>(i));
        execv(argv[0], argv.data());
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            throw DatabaseError(fmt::format("TestDatabase: waitpid: {}", std::strerror(errno)));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool executable(const fs::path& p)
{
    return access(p.c_str(), X_OK) == 0;
}

// Directory of initdb and pg_ctl: PATH first, else the newest /usr/lib/postgresql/<version>/bin.
std::string find_pg_bin()
{
    if (const char* path = std::getenv("PATH")) {
        std::stringstream dirs(path);
        for (std::string dir; std::getline(dirs, dir, ':');) {
            if (!dir.empty() && executable(fs::path(dir) / "initdb") && executable(fs::path(dir) / "pg_ctl"))
                return dir;
        }
    }
    std::error_code ec;
    long best_version = -1;
    std::string best;
    for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
        const std::string name = entry.path().filename().string();
        char* end = nullptr;
        const long version = std::strtol(name.c_str(), &end, 10);
        const fs::path bin = entry.path() / "bin";
        if (end != name.c_str() && version > best_version && executable(bin / "initdb") && executable(bin / "pg_ctl")) {
            best_version = version;
            best = bin.string();
        }
    }
    if (best.empty())
        throw DatabaseError(fmt::format(
            "TestDatabase: no PostgreSQL server to use: {} is not set and initdb is found neither on PATH nor in "
            "/usr/lib/postgresql/*/bin (install the postgresql package, or set {} to a libpq connection string)",
            env_conninfo, env_conninfo));
    return best;
}

std::string find_runuser()
{
    for (const char* p : {"/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser"})
        if (executable(p))
            return p;
    throw DatabaseError("TestDatabase: running as root, the throwaway PostgreSQL server must run as the postgres "
                        "user, but runuser was not found");
}

} // namespace

struct TestDatabase::Impl {
    std::string server; // conninfo of the server, without the search_path
    std::string schema;
    std::string conninfo; // with the search_path
    // A cluster of its own: empty directory when none.
    std::string dir;
    std::string pg_bin;
    std::string runuser; // set when running as root

    Impl() = default;
    Impl(const Impl&) = delete;
    Impl& operator=(const Impl&) = delete;

    ~Impl()
    {
        try {
            teardown();
        } catch (const std::exception& e) {
            std::fprintf(stderr, "idemkafka::TestDatabase: cleanup failed: %s\n", e.what());
        }
    }

    std::vector<std::string> as_server_user(std::vector<std::string> args) const
    {
        if (runuser.empty())
            return args;
        args.insert(args.begin(), {runuser, "-u", "postgres", "--"});
        return args;
    }

    void start_cluster()
    {
        pg_bin = find_pg_bin();
        const bool root = geteuid() == 0;
        const struct passwd* pw = nullptr;
        if (root) {
            runuser = find_runuser();
            pw = getpwnam("postgres");
            if (!pw)
                throw DatabaseError("TestDatabase: running as root, the throwaway PostgreSQL server must run as the "
                                    "postgres OS user, and there is none");
        }
        // As root the server's user must reach the directory: /tmp does.
        std::string base = "/tmp";
        if (const char* t = std::getenv("TMPDIR"); !root && t && *t && std::strlen(t) <= max_base_dir)
            base = t;
        std::string templ = base + "/idemkafka-testdb.XXXXXX";
        if (!mkdtemp(templ.data()))
            throw DatabaseError(fmt::format("TestDatabase: mkdtemp {}: {}", templ, std::strerror(errno)));
        dir = templ;
        if (root && chown(dir.c_str(), pw->pw_uid, pw->pw_gid) != 0)
            throw DatabaseError(fmt::format("TestDatabase: chown {} to postgres: {}", dir, std::strerror(errno)));

        const std::string data = dir + "/data";
        const std::string initdb_log = dir + "/initdb.log";
        // --no-sync only skips initdb's own flushes; the server runs with fsync on.
        if (run_process(as_server_user({pg_bin + "/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                                        "--locale=C", "--no-sync"}),
                        initdb_log, dir) != 0)
            throw DatabaseError(fmt::format("TestDatabase: initdb ({}/initdb) failed in {}:\n{}", pg_bin, data,
                                            tail_of(initdb_log, 20)));
        {
            std::ofstream conf(data + "/postgresql.conf", std::ios::app);
            // A unix socket in the directory and no TCP port: nothing to collide with.
            conf << "\n# idemkafka::TestDatabase\n"
                 << "listen_addresses = ''\n"
                 << "unix_socket_directories = '" << dir << "'\n"
                 << "port = 5432\n"
                 << "max_connections = 100\n"
                 << "fsync = on\n";
            if (!conf)
                throw DatabaseError("TestDatabase: cannot write " + data + "/postgresql.conf");
        }
        const std::string log = dir + "/postgres.log";
        if (run_process(as_server_user({pg_bin + "/pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "start"}),
                        dir + "/pg_ctl.log", dir) != 0)
            throw DatabaseError(
                fmt::format("TestDatabase: the PostgreSQL server in {} did not start within 60 s:\n{}{}", data,
                            tail_of(dir + "/pg_ctl.log", 10), tail_of(log, 20)));
        server = fmt::format("host={} port=5432 dbname=postgres user=postgres", dir);
    }

    void create_schema()
    {
        schema = unique_schema_name();
        try {
            pqxx::connection c(server);
            pqxx::nontransaction tx(c);
            tx.exec("CREATE SCHEMA " + schema);
        } catch (const std::exception& e) {
            const std::string name = std::move(schema);
            schema.clear();
            throw DatabaseError(fmt::format("TestDatabase: cannot create schema {} on '{}': {}", name,
                                            redact_conninfo(server), e.what()));
        }
        conninfo = with_search_path(server, schema);
    }

    void teardown()
    {
        std::string failure;
        if (dir.empty() && !schema.empty()) {
            try {
                pqxx::connection c(server);
                pqxx::nontransaction tx(c);
                // A client still connected (a consumer that outlives this object)
                // must not make the destructor wait for its locks for ever.
                tx.exec("SET lock_timeout = '10s'");
                tx.exec("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
            } catch (const std::exception& e) {
                failure = fmt::format("dropping schema {} on '{}': {}", schema, redact_conninfo(server), e.what());
            }
        }
        schema.clear();
        if (!dir.empty()) {
            const std::string data = dir + "/data";
            std::error_code ec;
            if (fs::exists(data + "/postmaster.pid", ec) &&
                run_process(
                    as_server_user({pg_bin + "/pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "60", "stop"}),
                    dir + "/pg_ctl.log", dir) != 0) {
                // Keep the directory: removing a running server's files helps nobody.
                failure += fmt::format("{}the PostgreSQL server in {} did not stop:\n{}", failure.empty() ? "" : "; ",
                                       data, tail_of(dir + "/pg_ctl.log", 10));
            } else {
                fs::remove_all(dir, ec);
                if (ec)
                    failure += fmt::format("{}removing {}: {}", failure.empty() ? "" : "; ", dir, ec.message());
            }
            dir.clear();
        }
        if (!failure.empty())
            throw DatabaseError(failure);
    }
};

TestDatabase::TestDatabase() : impl_(std::make_unique<Impl>())
{
    const char* env = std::getenv(env_conninfo);
    if (env && *env)
        impl_->server = env;
    else
        impl_->start_cluster();
    impl_->create_schema();
}

TestDatabase::TestDatabase(const std::string& conninfo) : impl_(std::make_unique<Impl>())
{
    if (conninfo.empty())
        throw ConfigError("TestDatabase: empty connection string (use TestDatabase() for IDEMKAFKA_TEST_PG or a "
                          "cluster of its own)");
    impl_->server = conninfo;
    impl_->create_schema();
}

TestDatabase::TestDatabase(OwnCluster) : impl_(std::make_unique<Impl>())
{
    impl_->start_cluster();
    impl_->create_schema();
}

TestDatabase TestDatabase::own_cluster()
{
    return TestDatabase(OwnCluster{});
}

TestDatabase::~TestDatabase() = default;
TestDatabase::TestDatabase(TestDatabase&&) noexcept = default;
TestDatabase& TestDatabase::operator=(TestDatabase&&) noexcept = default;

std::string TestDatabase::connection_string() const
{
    return impl_->conninfo;
}

std::string TestDatabase::schema() const
{
    return impl_->schema;
}

std::string TestDatabase::cluster_directory() const
{
    return impl_->dir;
}

void TestDatabase::configure(ConsumerConfig& cfg) const
{
    cfg.postgres = impl_->conninfo;
    cfg.schema = impl_->schema;
}

void TestDatabase::exec(const std::string& sql) const
{
    try {
        pqxx::connection c(impl_->conninfo);
        pqxx::work tx(c);
        tx.exec(sql);
        tx.commit();
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("TestDatabase::exec in schema {}: {}", impl_->schema, e.what()));
    }
}

std::int64_t TestDatabase::scalar(const std::string& sql) const
{
    pqxx::result r;
    try {
        pqxx::connection c(impl_->conninfo);
        pqxx::nontransaction tx(c);
        r = tx.exec(sql);
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("TestDatabase::scalar in schema {}: {}", impl_->schema, e.what()));
    }
    if (r.empty() || r.columns() == 0)
        throw DatabaseError(fmt::format("TestDatabase::scalar: no row from: {}", sql));
    if (r[0][0].is_null())
        throw DatabaseError(fmt::format("TestDatabase::scalar: null from: {}", sql));
    try {
        return r[0][0].as<std::int64_t>();
    } catch (const std::exception& e) {
        throw DatabaseError(fmt::format("TestDatabase::scalar: '{}' is not an integer: {}", r[0][0].c_str(), e.what()));
    }
}

} // namespace idemkafka
