#include "idemkafka/config.hpp"

#include <cctype>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>
#include <regex.h>

#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka {
namespace {

bool is_true(const std::string& v)
{
    std::string s;
    for (char c : v)
        s.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
    return s == "true" || s == "1" || s == "yes" || s == "on";
}

void require(bool ok, const char* what)
{
    if (!ok)
        throw ConfigError(what);
}

// Kafka's rule for a topic name: 1 to 249 of [a-zA-Z0-9._-], not "." or "..".
// Returns what is wrong, or nullptr.
const char* topic_name_problem(const std::string& name)
{
    if (name.empty())
        return "it is empty";
    if (name.size() > 249)
        return "it is longer than 249 characters";
    if (name == "." || name == "..")
        return "\".\" and \"..\" are not topic names";
    for (const char c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
            return "only ASCII letters, digits, '.', '_' and '-' are allowed";
    return nullptr;
}

// A subscription entry starting with '^' is a regular expression to
// librdkafka, which compiles it as a POSIX extended one (regcomp) on this
// platform. True when it matches `topic`; false also when it does not compile
// (librdkafka reports that itself).
bool pattern_matches(const std::string& pattern, const std::string& topic)
{
    regex_t re;
    if (regcomp(&re, pattern.c_str(), REG_EXTENDED | REG_NOSUB) != 0)
        return false;
    const bool match = regexec(&re, topic.c_str(), 0, nullptr, 0) == 0;
    regfree(&re);
    return match;
}

std::string lower_trimmed(const std::string& v)
{
    const auto first = v.find_first_not_of(" \t");
    const auto last = v.find_last_not_of(" \t");
    std::string s;
    if (first != std::string::npos)
        for (char c : v.substr(first, last - first + 1))
            s.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c));
    return s;
}

// KIP-848 (group.protocol=consumer) moves these to the broker; librdkafka
// refuses to create a consumer that sets them. Refused here, with what to do
// instead, rather than as a KafkaError from deep inside the constructor.
const char* consumer_protocol_replacement(const std::string& key)
{
    if (key == "session.timeout.ms")
        return "the broker's group.consumer.session.timeout.ms sets the session timeout";
    if (key == "heartbeat.interval.ms")
        return "the broker's group.consumer.heartbeat.interval.ms sets the heartbeat interval";
    if (key == "partition.assignment.strategy")
        return "the broker assigns partitions; choose its assignor with group.remote.assignor (uniform or range)";
    if (key == "group.protocol.type")
        return "the consumer protocol has no protocol type";
    return nullptr;
}

// librdkafka 2.12 made the consumer group protocol generally available; the
// versions before it had it as early access or preview only, or not at all.
constexpr int consumer_protocol_min_version = 0x020c0000;

void validate_group_protocol(const std::map<std::string, std::string>& kafka)
{
    const auto gp = kafka.find("group.protocol");
    const std::string protocol = gp == kafka.end() ? "classic" : lower_trimmed(gp->second);
    if (protocol != "classic" && protocol != "consumer")
        throw ConfigError(fmt::format("kafka[\"group.protocol\"]={}: expected classic or consumer", gp->second));
    if (protocol == "classic") {
        if (kafka.count("group.remote.assignor"))
            throw ConfigError("kafka[\"group.remote.assignor\"]: applies only with group.protocol=consumer; the "
                              "classic protocol takes partition.assignment.strategy");
        return;
    }
    if (rd_kafka_version() < consumer_protocol_min_version)
        throw ConfigError(fmt::format("kafka[\"group.protocol\"]=consumer: needs librdkafka 2.12 or later, this "
                                      "process runs librdkafka {}",
                                      rd_kafka_version_str()));
    for (const auto& [key, value] : kafka)
        if (const char* instead = consumer_protocol_replacement(key))
            throw ConfigError(
                fmt::format("kafka[\"{}\"]: not supported with group.protocol=consumer (KIP-848): {}", key, instead));
}

// Where to connect and what to consume.
void validate_subscription(const ConsumerConfig& c)
{
    require(!c.brokers.empty(), "brokers: must name at least one bootstrap server");
    require(!c.group_id.empty(), "group_id: must not be empty");
    require(!c.topics.empty(), "topics: must name at least one topic");
    for (const auto& t : c.topics)
        require(!t.empty(), "topics: a topic name is empty");
    require(!c.postgres.empty(), "postgres: must be a libpq connection string");
}

// Batches, prefetch and the workers.
void validate_workers(const ConsumerConfig& c)
{
    require(c.max_batch >= 1, "max_batch: must be at least 1");
    require(c.max_batch <= 100000, "max_batch: must be at most 100000");
    require(c.batches_per_unit >= 1, "batches_per_unit: must be at least 1");
    require(c.batches_per_unit <= 64, "batches_per_unit: must be at most 64");
    require(c.max_batch * c.batches_per_unit <= 100000,
            "batches_per_unit: max_batch x batches_per_unit must be at most 100000");
    require(c.max_batch_wait.count() >= 0, "max_batch_wait: must not be negative");
    require(c.commit_interval.count() >= 0, "commit_interval: must not be negative");
    require(c.max_batch_bytes >= 1, "max_batch_bytes: must be at least 1");
    require(c.max_prefetch_bytes >= 1024, "max_prefetch_bytes: must be at least 1024");
    require(c.max_prefetch_records >= 1 && c.max_prefetch_records <= 10000000,
            "max_prefetch_records: must be between 1 and 10000000");
    require(c.workers >= 1, "workers: must be at least 1");
    require(c.workers <= 256, "workers: must be at most 256");
    require(c.max_batch_duration.count() >= 0, "max_batch_duration: must not be negative");
}

// Attempts and the bounds of PostgreSQL's waits.
void validate_transactions(const ConsumerConfig& c)
{
    require(c.max_attempts >= 1, "max_attempts: must be at least 1");
    require(c.transaction_retries >= 0, "transaction_retries: must not be negative");
    require(c.lock_timeout.count() >= 0, "lock_timeout: must not be negative");
    require(c.frozen_member_timeout.count() >= 0, "frozen_member_timeout: must not be negative");
    // Ending a session idle in a transaction for less would end live
    // members' sessions between two statements of an ordinary handler call.
    if (c.frozen_member_timeout.count() != 0 && c.frozen_member_timeout < ConsumerConfig::frozen_member_floor)
        throw ConfigError(fmt::format("frozen_member_timeout: must be 0 (max.poll.interval.ms) or at least {} ms",
                                      ConsumerConfig::frozen_member_floor.count()));
    require(c.fetch_stall_after.count() >= 1000, "fetch_stall_after: must be at least 1 s");
    require(c.db_timeout.count() >= 0, "db_timeout: must not be negative");
}

// The dead-letter topic (never one the group consumes) and its producer.
void validate_dead_letters(const ConsumerConfig& c)
{
    require(c.max_payload_bytes >= 1, "max_payload_bytes: must be at least 1");
    require(c.dead_letter_timeout.count() > 0, "dead_letter_timeout: must be positive");
    const auto dlq = c.effective_dead_letter_topic();
    if (const char* problem = topic_name_problem(dlq))
        throw ConfigError(fmt::format("dead_letter_topic: \"{}\"{} is not a valid Kafka topic name: {}{}", dlq,
                                      c.dead_letter_topic.empty() ? " (group_id + \".dlq\")" : "", problem,
                                      c.dead_letter_topic.empty() ? "; set dead_letter_topic" : ""));
    for (const auto& t : c.topics) {
        require(t != dlq, "dead_letter_topic: must not be one of the consumed topics (a dead letter would loop)");
        if (t.front() == '^' && pattern_matches(t, dlq))
            throw ConfigError(fmt::format("topics: the pattern {} matches the dead-letter topic {}: the group would "
                                          "consume its own dead letters for ever; narrow the pattern or set "
                                          "dead_letter_topic to a name it does not match",
                                          t, dlq));
    }
    for (const auto& [key, value] : c.dead_letter_kafka) {
        if ((key == "enable.idempotence" && !is_true(value)) ||
            ((key == "acks" || key == "request.required.acks") && value != "all" && value != "-1"))
            throw ConfigError(fmt::format("dead_letter_kafka[\"{}\"]={}: refused, dead letters are produced "
                                          "idempotently with acks=all",
                                          key, value));
    }
}

// A record's retries and the circuit breaker.
void validate_backoff(const ConsumerConfig& c)
{
    require(c.retry_backoff.count() >= 0, "retry_backoff: must not be negative");
    require(c.retry_backoff_max >= c.retry_backoff, "retry_backoff_max: must not be below retry_backoff");
    const auto& cb = c.circuit_breaker;
    require(cb.window.count() > 0, "circuit_breaker.window: must be positive");
    require(cb.min_attempts >= 1, "circuit_breaker.min_attempts: must be at least 1");
    require(cb.failure_ratio > 0 && cb.failure_ratio <= 1,
            "circuit_breaker.failure_ratio: must be above 0 and at most 1");
    require(cb.min_keys >= 1, "circuit_breaker.min_keys: must be at least 1");
    require(cb.min_partitions >= 1, "circuit_breaker.min_partitions: must be at least 1");
    require(cb.backoff.count() > 0, "circuit_breaker.backoff: must be positive");
    require(cb.backoff_max >= cb.backoff, "circuit_breaker.backoff_max: must not be below circuit_breaker.backoff");
    require(cb.probe_records >= 1, "circuit_breaker.probe_records: must be at least 1");
    require(cb.give_up_after.count() >= 0, "circuit_breaker.give_up_after: must not be negative");
}

// The tables: the claims table, its retention, the outbox and the positions table.
void validate_database(const ConsumerConfig& c)
{
    // The table names are quoted, not checked against a pattern; this only
    // refuses what cannot be quoted.
    (void)ProcessedEventStore(c.schema, c.table);
    c.retention.validate();
    if (c.outbox)
        c.outbox->validate();
    if (c.offsets_in_database) {
        (void)OffsetStore(c.schema, c.offsets_table);
        require(c.offsets_table != c.table, "offsets_table: must differ from table");
    }
}

// The raw librdkafka properties: nothing that would move offsets before the
// effects commit, nothing the configuration sets itself.
void validate_kafka(const ConsumerConfig& c)
{
    for (const auto& [key, value] : c.kafka) {
        if ((key == "enable.auto.commit" || key == "enable.auto.offset.store") && is_true(value))
            throw ConfigError(fmt::format("kafka[\"{}\"]={}: refused, offsets are committed only after the PostgreSQL "
                                          "transaction that holds the event's effects has committed",
                                          key, value));
        if (key == "bootstrap.servers" || key == "metadata.broker.list")
            throw ConfigError(fmt::format("kafka[\"{}\"]: set ConsumerConfig::brokers instead", key));
        if (key == "group.id")
            throw ConfigError("kafka[\"group.id\"]: set ConsumerConfig::group_id instead");
        if (key == "enable.partition.eof" && is_true(value))
            throw ConfigError("kafka[\"enable.partition.eof\"]: not supported by the consumer loop");
    }
    validate_group_protocol(c.kafka);
}

} // namespace

// Each concern in turn; the first problem found is the one reported.
void ConsumerConfig::validate() const
{
    validate_subscription(*this);
    validate_workers(*this);
    validate_transactions(*this);
    validate_dead_letters(*this);
    validate_backoff(*this);
    require(shutdown_timeout.count() > 0, "shutdown_timeout: must be positive");
    require(oldest_claim_refresh.count() >= 0, "oldest_claim_refresh: must not be negative");
    validate_database(*this);
    validate_kafka(*this);
}

std::string ConsumerConfig::effective_dead_letter_topic() const
{
    return dead_letter_topic.empty() ? group_id + ".dlq" : dead_letter_topic;
}

} // namespace idemkafka
