// Builds against the installed package and checks that the basics link and run.
#include <cstdio>

#include <idemkafka/consumer.hpp>

#if defined(_MSVC_LANG)
#define PACKAGE_SMOKE_CPLUSPLUS _MSVC_LANG
#else
#define PACKAGE_SMOKE_CPLUSPLUS __cplusplus
#endif
// The package requires C++17 as a minimum: a consumer's newer standard must not be lowered.
#if defined(PACKAGE_SMOKE_CXX_STANDARD) && PACKAGE_SMOKE_CXX_STANDARD >= 20
static_assert(PACKAGE_SMOKE_CPLUSPLUS >= 202002L, "CMAKE_CXX_STANDARD 20 did not reach the compiler");
#endif

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
        std::printf("package ok (C++ %ld; %s refused: %s)\n", static_cast<long>(PACKAGE_SMOKE_CPLUSPLUS),
                    id.to_string().c_str(), e.what());
    }
    return 0;
}
