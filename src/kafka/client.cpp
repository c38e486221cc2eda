#include "kafka/client.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "idemkafka/redact.hpp"

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

} // namespace idemkafka::detail::kafka
