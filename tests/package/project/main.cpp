// Builds against the installed package and checks that the basics link and run.
#include <cstdio>

#include <idemkafka/consumer.hpp>

struct Ping {
    idemkafka::EventId id;
};

int main()
{
    const auto id = idemkafka::new_event_id();
    if (idemkafka::EventId::parse(id.to_string()) != id || id.version() != 7) {
        std::puts("event id round trip failed");
        return 1;
    }
    idemkafka::ConsumerConfig cfg; // incomplete on purpose: must be refused
    try {
        idemkafka::IdempotentConsumer<Ping> c(
            cfg, [](std::string_view) { return Ping{}; }, [](const Ping& p) { return p.id; },
            [](pqxx::work&, const Ping&, const idemkafka::Context&) {});
        std::puts("an empty configuration was accepted");
        return 1;
    } catch (const idemkafka::ConfigError& e) {
        std::printf("package ok (%s refused: %s)\n", id.to_string().c_str(), e.what());
    }
    return 0;
}
