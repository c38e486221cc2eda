#include "kafka/client.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"

namespace idemkafka::detail::kafka {

void set(rd_kafka_conf_t* conf, const std::string& key, const std::string& value)
{
    char err[512];
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK)
        throw ConfigError(fmt::format("kafka[\"{}\"]: {}", key, err));
}

ConfPtr make_conf(const std::map<std::string, std::string>& props)
{
    ConfPtr conf(rd_kafka_conf_new());
    for (const auto& [k, v] : props)
        set(conf.get(), k, v);
    return conf;
}

} // namespace idemkafka::detail::kafka
