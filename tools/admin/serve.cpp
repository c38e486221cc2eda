// serve: the operations console. A JSON API and a small web page over it
// (static files, no build step): consumer groups and their lag per partition,
// dead letters grouped by cause with their records, replay with a dry-run
// preview and a rate, the replay audit, the claims table's status. Read-only
// unless --allow-replay; loopback unless --listen says otherwise; an optional
// bearer token for the API.

#include "commands.hpp"

#if IDEMKAFKA_ADMIN_CONSOLE

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <idemkafka/error.hpp>

#include "cli.hpp"
#include "dead_letter_options.hpp"
#include "lag.hpp"
#include "pg/connect.hpp"
#include "triage_json.hpp"

#include <unistd.h>

namespace idemkafka::detail::admin {
namespace {

constexpr const char* serve_help = R"(usage: idemkafka-admin serve --topic DLQ [options]

The operations console: a web page and a JSON API over the claims table, the consumer groups' lag
and the dead-letter topic. Read-only unless started with --allow-replay (a dry-run preview of a
replay is always allowed: it publishes and records nothing).

  --listen HOST:PORT         where to listen (default 127.0.0.1:8080; port 0: any free port, printed)
  --token TOKEN              require `Authorization: Bearer TOKEN` on the API (default:
                             $IDEMKAFKA_CONSOLE_TOKEN); the page asks for it
  --allow-replay             allow replays (each recorded in the replay audit table)
  --static-dir DIR           the page's files (default: found next to the binary or installed)
  --brokers SERVERS          Kafka (default: $IDEMKAFKA_BROKERS)
  --topic NAME               the dead-letter topic (required)
  --postgres CONNINFO        the database (default: $IDEMKAFKA_POSTGRES)
  --schema NAME              schema of the claims and audit tables (default public)
  --table NAME               the claims table (default processed_event)
  --replay-audit-table NAME  the replay audit table (default dead_letter_replay)
  --group NAME               a consumer group to show the lag of; repeatable (default: the groups
                             with claims)
  --lag-topic NAME           the topics of those groups; repeatable (default: the topics Kafka lists
                             committed offsets for)
  --kafka KEY=VALUE          librdkafka property; repeatable. Secret values are never printed.
  --timeout DURATION         bound of each Kafka read (default 60s)

API (JSON; errors as {"error": "..."} with a 4xx or 5xx status):
  GET  /api/config                      what the console serves and whether replay is allowed
  GET  /api/status                      the claims table (idemkafka-admin status --json)
  GET  /api/lag                         lag per group and partition (records and seconds)
  GET  /api/dead-letters/groups         dead letters grouped by cause
  GET  /api/dead-letters/records?cause=ID[&limit=N][&payload=1]   the records of a cause
  POST /api/replay                      {"cause", "reasons", "groups", "source_topic", "from_ms",
                                        "to_ms", "coordinates", "rate", "dry_run", "again",
                                        "target_topic", "requested_by"}
  GET  /api/replays                     the replay audit, newest first
)";

struct ServeOptions {
    DeadLetterOptions dl;
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string token;
    bool allow_replay = false;
    std::string static_dir;
    std::string claims_table = "processed_event";
    std::vector<std::string> groups, lag_topics;
};

// A client error: its message goes back with status 400 (or `status`).
struct ApiError : std::runtime_error {
    int status;
    ApiError(int s, const std::string& what) : std::runtime_error(what), status(s) {}
};

void parse_listen(ServeOptions& o, const std::string& text)
{
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
        throw UsageError(fmt::format("serve: --listen: '{}' is not HOST:PORT", text));
    o.host = text.substr(0, colon);
    if (o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']')
        o.host = o.host.substr(1, o.host.size() - 2);
    const auto port = parse_count(text.substr(colon + 1), "--listen");
    if (port > 65535)
        throw UsageError(fmt::format("serve: --listen: port {} is out of range", port));
    o.port = static_cast<int>(port);
}

ServeOptions parse_serve_args(std::vector<std::string> args, bool& help)
{
    ArgReader a("serve", std::move(args));
    ServeOptions o;
    while (a.more()) {
        if (a.option("--listen"))
            parse_listen(o, a.value());
        else if (a.option("--token"))
            o.token = a.value();
        else if (a.option("--allow-replay"))
            o.allow_replay = true;
        else if (a.option("--static-dir"))
            o.static_dir = a.value();
        else if (a.option("--table"))
            o.claims_table = a.value();
        else if (a.option("--group"))
            o.groups.push_back(a.value());
        else if (a.option("--lag-topic"))
            o.lag_topics.push_back(a.value());
        else if (a.option("--help") || a.option("-h"))
            help = true;
        else if (!dead_letter_option(a, o.dl))
            a.unknown();
    }
    if (help)
        return o;
    check_dead_letter_options(o.dl, "serve");
    if (o.token.empty() && std::getenv("IDEMKAFKA_CONSOLE_TOKEN"))
        o.token = std::getenv("IDEMKAFKA_CONSOLE_TOKEN");
    if (!o.token.empty())
        redactor().add_secret(o.token);
    return o;
}

bool readable(const std::string& dir)
{
    return std::ifstream(dir + "/index.html").good();
}

// The page's files: --static-dir, else next to the binary (the build tree),
// else the install prefix's share/idemkafka/console, else the source tree.
std::string static_dir(const ServeOptions& o)
{
    if (!o.static_dir.empty()) {
        if (!readable(o.static_dir))
            throw UsageError(fmt::format("serve: --static-dir {} has no index.html", o.static_dir));
        return o.static_dir;
    }
    char buf[4096];
    const auto n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    std::vector<std::string> candidates;
    if (n > 0) {
        const std::string exe(buf, static_cast<std::size_t>(n));
        const std::string dir = exe.substr(0, exe.rfind('/'));
        candidates = {dir + "/console", dir + "/../share/idemkafka/console"};
    }
    candidates.push_back(IDEMKAFKA_CONSOLE_INSTALL_DIR);
    candidates.push_back(IDEMKAFKA_CONSOLE_SOURCE_DIR);
    for (const auto& c : candidates)
        if (readable(c))
            return c;
    throw Error(fmt::format("serve: the console's files (index.html) are in none of: {}; pass --static-dir",
                            fmt::join(candidates, ", ")));
}

// ---- the API -----------------------------------------------------------------------

nlohmann::json groups_json(const ServeOptions& o)
{
    DeadLetterGrouping grouping;
    const auto started = std::chrono::steady_clock::now();
    const auto read = read_dead_letters(o.dl.source, [&](DeadLetterRecord&& d) {
        grouping.add(d);
        return true;
    });
    auto arr = nlohmann::json::array();
    for (const auto& g : grouping.groups())
        arr.push_back(group_json(g));
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    return {{"topic", o.dl.source.topic}, {"read", read}, {"groups", arr}, {"read_ms", took.count()}};
}

nlohmann::json records_of_cause(const ServeOptions& o, const httplib::Request& req)
{
    const std::string cause = req.get_param_value("cause");
    if (cause.empty())
        throw ApiError(400, "records: the parameter cause (a cause id from /api/dead-letters/groups) is required");
    std::uint64_t limit = 100;
    if (req.has_param("limit"))
        limit = std::max<std::uint64_t>(1, std::stoull(req.get_param_value("limit")));
    const bool payload = req.get_param_value("payload") == "1";
    DeadLetterFilter f;
    f.causes = {cause};
    std::uint64_t matched = 0;
    auto records = nlohmann::json::array();
    (void)read_dead_letters(o.dl.source, [&](DeadLetterRecord&& d) {
        if (f.matches(d) && ++matched <= limit)
            records.push_back(record_json(d, payload));
        return true;
    });
    return {{"cause", cause}, {"matched", matched}, {"records", records}};
}

nlohmann::json group_lag_json(const ServeOptions& o)
{
    std::vector<std::string> groups = o.groups;
    if (groups.empty()) {
        const auto status = nlohmann::json::parse(status_json_of(o.dl.postgres, o.dl.audit.schema, o.claims_table, {}));
        for (const auto& g : status["groups"])
            groups.push_back(g["consumer_group"].get<std::string>());
    }
    const auto rows = partition_lag(o.dl.source.brokers, o.dl.source.kafka, groups, o.lag_topics,
                                    std::min(o.dl.source.timeout, std::chrono::milliseconds(10000)));
    return {{"groups", groups}, {"partitions", lag_json(rows)}};
}

template <class T> T field(const nlohmann::json& body, const char* name, T fallback)
{
    const auto it = body.find(name);
    if (it == body.end() || it->is_null())
        return fallback;
    try {
        return it->get<T>();
    } catch (const std::exception&) {
        throw ApiError(400, fmt::format("replay: the field {} has the wrong type", name));
    }
}

DeadLetterFilter filter_of(const nlohmann::json& body)
{
    DeadLetterFilter f;
    if (const auto cause = field<std::string>(body, "cause", ""); !cause.empty())
        f.causes.insert(cause);
    for (const auto& r : field<std::vector<std::string>>(body, "reasons", {}))
        f.reasons.insert(r);
    for (const auto& g : field<std::vector<std::string>>(body, "groups", {}))
        f.consumer_groups.insert(g);
    if (const auto t = field<std::string>(body, "source_topic", ""); !t.empty())
        f.source_topic = t;
    if (body.contains("from_ms") && !body["from_ms"].is_null())
        f.from_ms = field<std::int64_t>(body, "from_ms", 0);
    if (body.contains("to_ms") && !body["to_ms"].is_null())
        f.to_ms = field<std::int64_t>(body, "to_ms", 0);
    for (const auto& c : field<nlohmann::json>(body, "coordinates", nlohmann::json::array()))
        f.coordinates.insert({c.at("partition").get<std::int32_t>(), c.at("offset").get<std::int64_t>()});
    return f;
}

nlohmann::json replay_json(const ServeOptions& o, const httplib::Request& req)
{
    const auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object())
        throw ApiError(400, "replay: the body is not a JSON object");
    ReplayRequest r = o.dl.replay_request(fmt::format("idemkafka-admin serve (from {})", req.remote_addr));
    r.filter = filter_of(body);
    if (r.filter.causes.empty() && r.filter.reasons.empty() && r.filter.consumer_groups.empty() &&
        !r.filter.source_topic && r.filter.coordinates.empty() && !r.filter.from_ms && !r.filter.to_ms)
        throw ApiError(400, "replay: give a filter (cause, reasons, groups, source_topic, time range or coordinates)");
    r.dry_run = field<bool>(body, "dry_run", true);
    r.again = field<bool>(body, "again", false);
    r.rate_per_second = field<double>(body, "rate", 0);
    if (const auto t = field<std::string>(body, "target_topic", ""); !t.empty())
        r.target_topic = t;
    r.requested_by = field<std::string>(body, "requested_by", "");
    if (r.requested_by.empty())
        throw ApiError(400, "replay: requested_by (who asks) is required");
    if (!r.dry_run && !o.allow_replay)
        throw ApiError(403, "replay: this console is read-only (start it with --allow-replay to replay)");
    r.log = [](LogLevel level, std::string_view line) {
        err(fmt::format("idemkafka-admin serve: {}: {}", level >= LogLevel::warning ? "warning" : "info", line));
    };
    const auto conn = pg::connect(o.dl.postgres);
    return replay_report_json(replay_dead_letters(*conn, r));
}

nlohmann::json audit_list_json(const ServeOptions& o)
{
    const auto conn = pg::connect(o.dl.postgres);
    auto arr = nlohmann::json::array();
    for (const auto& e : replay_audit(*conn, o.dl.audit, o.dl.source.topic, 100))
        arr.push_back(audit_json(e));
    return {{"replays", arr}};
}

// ---- the server --------------------------------------------------------------------

void send_json(httplib::Response& res, int status, const nlohmann::json& j)
{
    res.status = status;
    res.set_header("Cache-Control", "no-store");
    res.set_content(redactor()(dump(j)), "application/json");
}

using Handler = std::function<nlohmann::json(const httplib::Request&)>;

// Every API answer: the token checked, errors as {"error": ...} (and on stderr).
httplib::Server::Handler api(const ServeOptions& o, Handler h)
{
    return [&o, h = std::move(h)](const httplib::Request& req, httplib::Response& res) {
        if (!o.token.empty() && req.get_header_value("Authorization") != "Bearer " + o.token)
            return send_json(res, 401, {{"error", "missing or wrong bearer token"}});
        try {
            send_json(res, 200, h(req));
        } catch (const ApiError& e) {
            send_json(res, e.status, {{"error", e.what()}});
        } catch (const ConfigError& e) {
            send_json(res, 400, {{"error", e.what()}});
        } catch (const std::exception& e) {
            err(fmt::format("idemkafka-admin serve: error: {} {}: {}", req.method, req.path, e.what()));
            send_json(res, 500, {{"error", e.what()}});
        }
    };
}

void routes(httplib::Server& server, const ServeOptions& o)
{
    server.Get("/api/config", api(o, [&o](const httplib::Request&) {
                   return nlohmann::json{{"dead_letter_topic", o.dl.source.topic},
                                         {"allow_replay", o.allow_replay},
                                         {"claims_table", o.claims_table},
                                         {"version", IDEMKAFKA_VERSION_TEXT}};
               }));
    server.Get("/api/status", api(o, [&o](const httplib::Request&) {
                   return nlohmann::json::parse(
                       status_json_of(o.dl.postgres, o.dl.audit.schema, o.claims_table, o.dl.audit.table));
               }));
    server.Get("/api/lag", api(o, [&o](const httplib::Request&) { return group_lag_json(o); }));
    server.Get("/api/dead-letters/groups", api(o, [&o](const httplib::Request&) { return groups_json(o); }));
    server.Get("/api/dead-letters/records",
               api(o, [&o](const httplib::Request& req) { return records_of_cause(o, req); }));
    server.Post("/api/replay", api(o, [&o](const httplib::Request& req) { return replay_json(o, req); }));
    server.Get("/api/replays", api(o, [&o](const httplib::Request&) { return audit_list_json(o); }));
}

} // namespace

int run_serve(std::vector<std::string> args)
{
    bool help = false;
    const ServeOptions o = parse_serve_args(std::move(args), help);
    if (help) {
        out(serve_help);
        return exit_ok;
    }
    const std::string files = static_dir(o);
    httplib::Server server;
    routes(server, o);
    server.set_mount_point("/", files);
    server.set_default_headers({{"X-Content-Type-Options", "nosniff"}});
    const int port =
        o.port == 0 ? server.bind_to_any_port(o.host) : (server.bind_to_port(o.host, o.port) ? o.port : -1);
    if (port < 0)
        throw Error(
            fmt::format("serve: cannot listen on {}:{} (in use, or not an address of this host)", o.host, o.port));
    if (o.host != "127.0.0.1" && o.host != "localhost" && o.host != "::1" && o.token.empty())
        err(fmt::format("idemkafka-admin serve: warning: listening on {} without --token: anyone who reaches it can "
                        "read the dead letters{}",
                        o.host, o.allow_replay ? " and replay them" : ""));
    out(fmt::format("idemkafka-admin serve: listening on http://{}:{}/ ({}; files from {})", o.host, port,
                    o.allow_replay ? "replay allowed" : "read-only", files));
    if (!server.listen_after_bind())
        throw Error("serve: the server stopped with an error");
    return exit_ok;
}

} // namespace idemkafka::detail::admin

#else // built without cpp-httplib

#include <idemkafka/error.hpp>

namespace idemkafka::detail::admin {

int run_serve(std::vector<std::string>)
{
    throw Error("serve: this idemkafka-admin was built without cpp-httplib, so it has no console (install "
                "libcpp-httplib-dev and rebuild)");
}

} // namespace idemkafka::detail::admin

#endif
