#include "kafka/client.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/redact.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail::kafka {

void set(rd_kafka_conf_t* conf, const std::string& key, const std::string& value)
{
    char err[512];
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
        // librdkafka may quote the value it refused; a secret's is masked,
        // also when it is too short for Redactor to mask it everywhere.
        std::string why = err;
        if (is_secret_setting(key) && !value.empty()) {
            const std::string quoted = '"' + value + '"';
            for (std::size_t p = 0; (p = why.find(quoted, p)) != std::string::npos;)
                why.replace(p, quoted.size(), "\"***\"");
        }
        Redactor secret;
        secret.add_setting(key, value);
        throw ConfigError(secret(fmt::format("kafka[\"{}\"]: {}", key, why)));
    }
}

ConfPtr make_conf(const std::map<std::string, std::string>& props)
{
    ConfPtr conf(rd_kafka_conf_new());
    for (const auto& [k, v] : props)
        set(conf.get(), k, v);
    return conf;
}

LogLevel log_level(int syslog_level) noexcept
{
    return syslog_level <= 3   ? LogLevel::error
           : syslog_level == 4 ? LogLevel::warning
           : syslog_level <= 6 ? LogLevel::info
                               : LogLevel::debug;
}

namespace {

// librdkafka's own lines (and its errors, which it logs when no error_cb is
// set) go to the owner's sink rather than straight to stderr.
void log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf)
{
    auto* owner = static_cast<ClientOwner*>(rd_kafka_opaque(rk));
    std::lock_guard<std::mutex> lock(owner->log_mu);
    if (!owner->log)
        return; // silenced
    try {
        emit(owner->log, log_level(level), fmt::format("rdkafka {}: {}", fac, buf), "librdkafka", {{"facility", fac}});
    } catch (...) {
        // out of memory: the line is lost, librdkafka's thread goes on
    }
}

} // namespace

HandlePtr make_client(rd_kafka_type_t type, const std::map<std::string, std::string>& props, ClientOwner& owner,
                      const std::function<void(rd_kafka_conf_t*)>& setup, const Redactor& secrets)
{
    auto conf = make_conf(props);
    rd_kafka_conf_set_opaque(conf.get(), &owner);
    rd_kafka_conf_set_log_cb(conf.get(), log_cb);
    if (setup)
        setup(conf.get());
    char err[512];
    HandlePtr rk(rd_kafka_new(type, conf.get(), err, sizeof err));
    if (!rk)
        throw KafkaError(secrets(
            fmt::format("cannot create Kafka {}: {}", type == RD_KAFKA_CONSUMER ? "consumer" : "producer", err)));
    (void)conf.release(); // owned by the client now
    return rk;
}

std::map<std::string, std::string> connection_settings(const std::map<std::string, std::string>& kafka)
{
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : kafka)
        if (k.rfind("security.", 0) == 0 || k.rfind("sasl.", 0) == 0 || k.rfind("ssl.", 0) == 0 || k == "client.id" ||
            k == "client.rack")
            out[k] = v;
    return out;
}

std::string client_bug_warning(const std::map<std::string, std::string>& props, int version)
{
    constexpr int sticky_close_fixed = 0x020300ff; // 2.3.0
    const auto strategy = props.find("partition.assignment.strategy");
    if (version >= sticky_close_fixed || strategy == props.end() ||
        strategy->second.find("cooperative-sticky") == std::string::npos)
        return {};
    return fmt::format("partition.assignment.strategy={} with librdkafka {}.{}.{}: before 2.3.0 a member closed "
                       "after joining its group and before its first assignment aborts the process (an assertion "
                       "in librdkafka's sticky assignor); use range or roundrobin, or librdkafka 2.3.0 or later",
                       strategy->second, (version >> 24) & 0xff, (version >> 16) & 0xff, (version >> 8) & 0xff);
}

} // namespace idemkafka::detail::kafka
