#if __has_include(<catch2/catch_session.hpp>)
#include <catch2/catch_session.hpp>
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>
namespace catch_compat {
using ListenerBase = Catch::EventListenerBase;
}
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
namespace catch_compat {
using ListenerBase = Catch::TestEventListenerBase;
}
#endif

#include "recent_log.hpp"

namespace {

// Prints the log lines of a test case that failed (see recent_log.hpp).
class FailureLog : public catch_compat::ListenerBase {
public:
    using catch_compat::ListenerBase::ListenerBase;

    void testCaseStarting(Catch::TestCaseInfo const& info) override
    {
        idemkafka::test::forget_log_lines();
        catch_compat::ListenerBase::testCaseStarting(info);
    }

    void testCaseEnded(Catch::TestCaseStats const& stats) override
    {
        if (stats.totals.assertions.failed > 0)
            idemkafka::test::print_log_lines("failed");
        catch_compat::ListenerBase::testCaseEnded(stats);
    }
};

} // namespace

CATCH_REGISTER_LISTENER(FailureLog)

int main(int argc, char* argv[])
{
    return Catch::Session().run(argc, argv);
}
