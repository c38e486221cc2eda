// W3C trace context: which traceparent values are taken, and what a handler's
// Context and what it publishes carry.

#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "idemkafka/context.hpp"
#include "observe/trace.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;

namespace {

const std::string good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

} // namespace

TEST_CASE("trace: well-formed traceparent values are taken, others are not", "[unit][trace]")
{
    CHECK(valid_traceparent(good) == std::optional<std::string_view>(good));
    CHECK(trace_id_of(good) == "4bf92f3577b34da6a3ce929d0e0e4736");
    // A later version may append fields after a dash.
    const std::string later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
    CHECK(valid_traceparent(later));
    for (const std::string& bad : {
             std::string(),
             std::string("garbage"),
             good + "-extra",                                                        // version 00 has no more fields
             std::string("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), // version ff is invalid
             std::string("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), // all-zero trace id
             std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), // all-zero parent id
             std::string("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), // upper case
             std::string("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"),  // short trace id
             std::string("00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01"),
             std::string("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"),
         }) {
        INFO(bad);
        CHECK_FALSE(valid_traceparent(bad));
    }
}

TEST_CASE("trace: a handler's Context reads the record's trace context", "[unit][trace]")
{
    Record r;
    r.headers = {{"x", std::string("1")}, {"traceparent", good}, {"tracestate", std::string("vendor=abc")}};
    const Context ctx(r, new_event_id(), 1);
    CHECK(ctx.trace_parent() == std::optional<std::string_view>(good));
    CHECK(ctx.trace_state() == std::optional<std::string_view>("vendor=abc"));
    CHECK(ctx.trace_id() == "4bf92f3577b34da6a3ce929d0e0e4736");
    const auto headers = ctx.trace_headers();
    REQUIRE(headers.size() == 2);
    CHECK(headers[0].name == "traceparent");
    CHECK(headers[0].value == good);
    CHECK(headers[1].name == "tracestate");

    Record malformed;
    malformed.headers = {{"traceparent", std::string("nope")}, {"tracestate", std::string("vendor=abc")}};
    const Context none(malformed, new_event_id(), 1);
    CHECK_FALSE(none.trace_parent());
    CHECK_FALSE(none.trace_state()); // without a trace parent a state means nothing
    CHECK(none.trace_id().empty());
    CHECK(none.trace_headers().empty());
}

TEST_CASE("trace: inside a handler call, published headers gain the record's trace context", "[unit][trace]")
{
    Record r;
    r.headers = {{"traceparent", good}};
    std::vector<Header> storage;
    const std::vector<Header> mine{{"k", std::string("v")}};
    CHECK(&with_trace(mine, storage) == &mine); // no handler call: nothing added
    {
        const TraceScope scope(&r);
        const auto& out = with_trace(mine, storage);
        REQUIRE(out.size() == 2);
        CHECK(out[0].name == "k");
        CHECK(out[1].name == "traceparent");
        CHECK(out[1].value == good);
        // A traceparent of the caller's own wins.
        const std::vector<Header> own{
            {"traceparent", std::string("00-11111111111111111111111111111111-2222222222222222-01")}};
        CHECK(&with_trace(own, storage) == &own);
        {
            const TraceScope batch(nullptr); // a batch call of several records: none
            CHECK(&with_trace(mine, storage) == &mine);
        }
        CHECK(with_trace(mine, storage).size() == 2); // the outer scope again
    }
    CHECK(&with_trace(mine, storage) == &mine);
}
