// ShareConsumerConfig::validate(): what has no meaning for a share group, and
// bounds that do not fit the lock's time budget, are refused with the field's
// name; timeouts left at their defaults are derived from the budget.

#include <idemkafka/error.hpp>

#include "catch_compat.hpp"
#include "share/share_config.hpp"
#include "share_fixture.hpp"

using namespace idemkafka;
using namespace idemkafka::test::share;
using namespace std::chrono_literals;

namespace {

ShareConsumerConfig valid()
{
    ShareConsumerConfig cfg;
    cfg.consumer.brokers = "localhost:9092";
    cfg.consumer.group_id = "g";
    cfg.consumer.topics = {"t"};
    cfg.consumer.postgres = "dbname=x";
    return cfg;
}

std::string refusal(const ShareConsumerConfig& cfg)
{
    try {
        cfg.validate();
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

// True when validate() refuses `cfg` with a message that starts with `field`.
bool refused_for(const ShareConsumerConfig& cfg, const std::string& field)
{
    const auto why = refusal(cfg);
    INFO("refusal: " << why);
    return why.rfind(field, 0) == 0;
}

} // namespace

TEST_CASE("share config: what a share group has no use for is refused, naming the field", "[share]")
{
    CHECK(refusal(valid()).empty());
    auto cfg = valid();
    cfg.consumer.offsets_in_database = true;
    CHECK(refused_for(cfg, "consumer.offsets_in_database"));
    cfg = valid();
    cfg.consumer.ordering = Ordering::key;
    CHECK(refused_for(cfg, "consumer.ordering"));
    cfg = valid();
    cfg.consumer.workers = 2;
    CHECK(refused_for(cfg, "consumer.workers"));
    cfg = valid();
    cfg.consumer.kafka["group.instance.id"] = "a";
    CHECK(refused_for(cfg, "consumer.kafka[\"group.instance.id\"]"));
    cfg = valid();
    cfg.members = 0;
    CHECK(refused_for(cfg, "members"));
    cfg = valid();
    cfg.delivery_limit = 0;
    CHECK(refused_for(cfg, "delivery_limit"));
    cfg = valid();
    cfg.consumer.group_id.clear();
    CHECK(refused_for(cfg, "group_id")); // ConsumerConfig's own checks
}

TEST_CASE("share config: every bound of a batch fits the lock's budget", "[share]")
{
    auto cfg = valid();
    cfg.lock_duration = 10s;
    cfg.batch_budget = 10s;
    CHECK(refused_for(cfg, "batch_budget"));
    cfg.batch_budget = 0ms;
    CHECK(cfg.effective_batch_budget() == 5s);
    cfg.consumer.db_timeout = 6s;
    CHECK(refused_for(cfg, "consumer.db_timeout"));
    cfg.consumer.db_timeout = 0ms; // no bound: refused, a batch must end within the lock
    CHECK(refused_for(cfg, "consumer.db_timeout"));
    cfg.consumer.db_timeout = 2s;
    cfg.consumer.dead_letter_timeout = 5s;
    CHECK(refused_for(cfg, "consumer.dead_letter_timeout"));
    cfg.consumer.dead_letter_timeout = std::chrono::milliseconds(30000); // the default: derived
    CHECK(refusal(cfg).empty());

    cfg.consumer.max_attempts = 9;
    cfg.delivery_limit = 4;
    const auto effective = detail::effective_consumer_config(cfg);
    CHECK(effective.db_timeout == 2s);           // set: kept
    CHECK(effective.lock_timeout == 5000ms / 3); // default: a third of the budget
    CHECK(effective.dead_letter_timeout == 5000ms / 3);
    CHECK(effective.max_batch_duration == 5s);
    CHECK(effective.max_attempts == 4);       // at most the delivery limit
    CHECK(effective.circuit_breaker.enabled); // as configured: one for all members (docs/share-groups.md, "Outages")
}
