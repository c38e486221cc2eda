#pragma once
// What the group member reads of its client's settings, and the rebalance
// protocol in use. Pure logic, no client. Private to the library.

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace idemkafka::detail::kafka {

/// The reset policy, max.poll.interval.ms, session.timeout.ms and the group
/// protocol, read from the client's properties once, before the client
/// exists; and whether rebalances are cooperative (incremental), which the
/// client tells at each rebalance.
///
/// Invariant: under group.protocol=consumer (KIP-848) the broker assigns
/// and every rebalance is incremental: cooperative() is then always true,
/// whatever rd_kafka_rebalance_protocol() says before the first
/// subscription or while the consumer closes. Settings absent from the
/// properties keep librdkafka's defaults.
class GroupSettings {
public:
    GroupSettings() = default;
    /// Reads the settings from the client's properties (as librdkafka gets them).
    explicit GroupSettings(const std::map<std::string, std::string>& props)
    {
        const auto value = [&](const char* key) {
            auto it = props.find(key);
            return it == props.end() ? std::string() : it->second;
        };
        const auto reset = value("auto.offset.reset");
        reset_to_latest_ = reset == "latest" || reset == "largest" || reset == "end";
        if (props.count("max.poll.interval.ms"))
            max_poll_interval_ =
                std::chrono::milliseconds(std::strtol(value("max.poll.interval.ms").c_str(), nullptr, 10));
        if (props.count("session.timeout.ms"))
            session_timeout_ = std::chrono::milliseconds(std::strtol(value("session.timeout.ms").c_str(), nullptr, 10));
        auto protocol = value("group.protocol");
        std::transform(protocol.begin(), protocol.end(), protocol.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        consumer_protocol_ = protocol.find("consumer") != std::string::npos; // validate() allows only the two
        cooperative_ = consumer_protocol_;
    }

    /// auto.offset.reset is latest: a partition without commits starts at the end.
    bool reset_to_latest() const noexcept { return reset_to_latest_; }
    /// max.poll.interval.ms (librdkafka's default when not set).
    std::chrono::milliseconds max_poll_interval() const noexcept { return max_poll_interval_; }
    /// session.timeout.ms (librdkafka's default when not set).
    std::chrono::milliseconds session_timeout() const noexcept { return session_timeout_; }
    /// group.protocol=consumer (KIP-848).
    bool consumer_protocol() const noexcept { return consumer_protocol_; }
    /// Rebalances are incremental (cooperative-sticky, or the consumer protocol).
    bool cooperative() const noexcept { return cooperative_; }

    /// At a rebalance: the protocol the client names (rd_kafka_rebalance_protocol()),
    /// null while it is unknown, as in the revoke the close serves (the last
    /// known one still holds).
    void observe_protocol(const char* protocol) noexcept
    {
        if (consumer_protocol_)
            cooperative_ = true;
        else if (protocol)
            cooperative_ = std::strcmp(protocol, "COOPERATIVE") == 0;
    }

private:
    bool reset_to_latest_ = false;
    std::chrono::milliseconds max_poll_interval_{300000};
    std::chrono::milliseconds session_timeout_{45000};
    bool consumer_protocol_ = false;
    bool cooperative_ = false;
};

} // namespace idemkafka::detail::kafka
