// Properties of EventId::parse / EventId::try_parse on arbitrary bytes:
//  - both accept exactly the same inputs, and agree on the value;
//  - parse() reports a rejection only as InvalidEventId, with a bounded message;
//  - an accepted input is 36 characters and to_string() gives it back lower-cased;
//  - format_to() and operator<< agree with to_string(), and the text parses back.

#include "fuzz_check.hpp"

#include <idemkafka/error.hpp>
#include <idemkafka/event_id.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <string_view>

using idemkafka::EventId;

namespace {

std::string lower_ascii(std::string_view text)
{
    std::string out(text);
    for (char& c : out) {
        if (c >= 'A' && c <= 'Z')
            c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
}

// The parser quotes at most 48 input characters, each escaped into at most 4, so a
// message far beyond that means the input leaked into it unabridged (think of a whole
// payload ending up in a log line).
constexpr std::size_t max_message_length = 400;

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    // A copy into an exactly-sized heap block lets ASan catch any read past the end,
    // which a view into libFuzzer's own buffer might not.
    const std::string owned(reinterpret_cast<const char*>(data), size);
    const std::string_view text(owned);

    // Start from a non-nil value so that a silent "success" leaving `out` alone shows.
    const EventId sentinel(
        EventId::Bytes{0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef, 0xde, 0xad, 0xbe, 0xef});
    EventId via_try = sentinel;
    const bool try_ok = EventId::try_parse(text, via_try);

    bool parse_ok = false;
    EventId via_parse;
    try {
        via_parse = EventId::parse(text);
        parse_ok = true;
    } catch (const idemkafka::InvalidEventId& e) {
        const std::size_t length = std::strlen(e.what());
        FUZZ_CHECK(length > 0, "empty InvalidEventId message");
        FUZZ_CHECK(length <= max_message_length, "InvalidEventId message of %zu bytes for a %zu-byte input", length,
                   size);
    } catch (const std::exception& e) {
        FUZZ_CHECK(false, "parse() threw something other than InvalidEventId: %s", e.what());
    } catch (...) {
        FUZZ_CHECK(false, "parse() threw a non-std exception");
    }

    FUZZ_CHECK(try_ok == parse_ok, "try_parse() %s but parse() %s", try_ok ? "accepted" : "rejected",
               parse_ok ? "accepted" : "rejected");
    if (!try_ok)
        return 0;

    FUZZ_CHECK(via_try == via_parse, "try_parse() gave %s, parse() gave %s", via_try.to_string().c_str(),
               via_parse.to_string().c_str());
    FUZZ_CHECK(size == 36, "accepted a %zu-character id", size);

    const std::string canonical = via_parse.to_string();
    FUZZ_CHECK(canonical == lower_ascii(text), "to_string() is %s for input %s", canonical.c_str(), owned.c_str());

    char formatted[36];
    via_parse.format_to(formatted);
    FUZZ_CHECK(std::string_view(formatted, sizeof formatted) == canonical, "format_to() differs from to_string()");

    std::ostringstream streamed;
    streamed << via_parse;
    FUZZ_CHECK(streamed.str() == canonical, "operator<< gave %s", streamed.str().c_str());

    EventId again;
    FUZZ_CHECK(EventId::try_parse(canonical, again) && again == via_parse, "to_string() output %s does not parse back",
               canonical.c_str());
    return 0;
}
