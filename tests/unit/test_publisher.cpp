// The publisher's configuration: it refuses what would make its sends
// non-idempotent.

#include <idemkafka/error.hpp>
#include <idemkafka/publisher.hpp>

#include "catch_compat.hpp"

using namespace idemkafka;

TEST_CASE("publisher refuses a non-idempotent configuration", "[unit]")
{
    PublisherConfig p;
    p.brokers = "localhost:9092";
    REQUIRE_NOTHROW(p.validate());
    p.kafka["enable.idempotence"] = "false";
    REQUIRE_THROWS_AS(p.validate(), ConfigError);
    p.kafka.clear();
    p.kafka["acks"] = "1";
    REQUIRE_THROWS_AS(p.validate(), ConfigError);
}
