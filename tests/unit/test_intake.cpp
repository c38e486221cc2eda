// What happens to a polled record before any transaction: decoding into the
// typed Stage the consumer builds, the payload and event id checks, dead
// letters settled earlier in the assignment, and the dedup-horizon guard, with
// the counters and log lines each of them owes.

#include <chrono>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <idemkafka/consumer.hpp>
#include <idemkafka/retention.hpp>

#include "catch_compat.hpp"
#include "consumer/intake.hpp"

using namespace idemkafka;
using namespace idemkafka::detail;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;

namespace {

struct Order {
    EventId id;
    std::string body;
};

// A decoder as users write them: "<event id>:<body>"; "boom", "std" and
// "int" throw (DecodeError, another std::exception, a non-standard one);
// "noid" has no event id at all.
Order decode_order(std::string_view payload)
{
    if (payload.rfind("boom", 0) == 0)
        throw DecodeError("not an order: " + std::string(payload));
    if (payload == "std")
        throw std::runtime_error("std failure");
    if (payload == "int")
        throw 42;
    if (payload == "noid")
        throw MissingEventId("no eventId field");
    const auto colon = payload.find(':');
    return Order{EventId::parse(payload.substr(0, colon)),
                 std::string(colon == std::string_view::npos ? "" : payload.substr(colon + 1))};
}

std::int64_t now_ms()
{
    return std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A UUIDv7 created `age` ago (negative: in the future).
EventId aged(milliseconds age)
{
    return EventId::from_v7_parts(static_cast<std::uint64_t>(now_ms() - age.count()), 0x123, 0x456);
}

const EventId v4 = EventId::parse("3f2504e0-4f89-41d3-9a0c-0305e82c3301");

std::string payload_of(const EventId& id, std::string_view body = "order")
{
    return id.to_string() + ":" + std::string(body);
}

bool ends_with(const std::string& text, std::string_view tail)
{
    return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// The record is marked for the dead letter with `reason` and `error`.
void check_poison(const Item& it, DeadLetterReason reason, const std::string& error)
{
    CAPTURE(it.record.offset);
    CHECK(it.state == ItemState::poison);
    CHECK(it.reason == reason);
    CHECK(it.error == error);
}

// Intake as the engine builds it: the consumer's configuration, the typed
// Stage IdempotentConsumer holds, the consumer's Metrics and log sink; the
// records' partition from the ledger.
struct Fixture {
    ConsumerConfig cfg;
    int decoder_calls = 0;
    TypedStage<Order> stage{[this](std::string_view payload) {
                                ++decoder_calls;
                                return decode_order(payload);
                            },
                            [](const Order& o) { return o.id; }, [](pqxx::work&, const Order&, const Context&) {}};
    Metrics metrics;
    std::vector<LogRecord> lines;
    PartitionLedger ledger{Backoff{milliseconds(100), milliseconds(1000)},
                           Backoff{milliseconds(1000), milliseconds(30000)}};
    PartitionState& ps = ledger.assign({"orders", 3});
    std::deque<std::optional<std::string>> payloads; // what the records' values view
    std::vector<Item> batch;
    Intake intake{cfg, stage, metrics, LogSink([this](const LogRecord& r) { lines.push_back(r); })};

    Fixture()
    {
        stage.reserve(64);
        cfg.brokers = "localhost:9092";
        cfg.group_id = "billing";
        cfg.topics = {"orders"};
        cfg.postgres = "dbname=x";
    }

    // The layout the engine found at start-up (by default the configured one).
    void start(std::optional<RetentionMode> layout = std::nullopt)
    {
        intake.set_layout(layout ? *layout : cfg.retention.mode);
    }

    void poll(std::optional<std::string> payload, std::int64_t offset = -1)
    {
        payloads.push_back(std::move(payload));
        Item it;
        it.record.topic = ps.tp.topic;
        it.record.partition = ps.tp.partition;
        it.record.offset = offset >= 0 ? offset : static_cast<std::int64_t>(batch.size());
        it.record.key = std::string_view("customer-7");
        if (payloads.back())
            it.record.value = std::string_view(*payloads.back());
        it.part = &ps;
        batch.push_back(std::move(it));
    }

    // decode(), then screen() each record, as the engine and the claim transaction do.
    void take(std::size_t first_slot = 0)
    {
        intake.decode(batch, first_slot);
        for (auto& it : batch)
            intake.screen(it, ledger);
    }

    std::vector<const LogRecord*> at(LogLevel level) const
    {
        std::vector<const LogRecord*> out;
        for (const auto& r : lines)
            if (r.level == level)
                out.push_back(&r);
        return out;
    }
};

} // namespace

TEST_CASE("intake: a record that decodes keeps its event id and slot; nothing is counted or logged", "[unit][intake]")
{
    Fixture f;
    f.start();
    const auto a = new_event_id(), b = new_event_id();
    f.poll(payload_of(a));
    f.poll(payload_of(b));
    f.take(10);
    CHECK(f.decoder_calls == 2);
    for (std::size_t i = 0; i < 2; ++i) {
        const auto& it = f.batch[i];
        CAPTURE(i);
        CHECK(it.state == ItemState::pending);
        CHECK(it.slot == 10 + i);
        CHECK(it.error.empty());
        CHECK_FALSE(it.reconcile);
        CHECK(it.key_window_open);
    }
    CHECK(f.batch[0].id == a);
    CHECK(f.batch[1].id == b);
    const auto m = f.metrics.snapshot();
    CHECK(m.decode_errors == 0);
    CHECK(m.invalid_event_ids == 0);
    CHECK(m.beyond_dedup_horizon == 0);
    CHECK(m.horizon_processed == 0);
    CHECK(f.lines.empty());
}

TEST_CASE("intake: a decoder that throws makes its record poison (decode_error) with the decoder's message; the "
          "rest of the batch goes on",
          "[unit][intake]")
{
    Fixture f;
    f.start();
    const auto good = new_event_id();
    f.poll("boom!");
    f.poll(payload_of(good));
    f.poll("std");
    f.poll("int");
    f.intake.decode(f.batch, 0);
    CHECK(f.decoder_calls == 4);
    check_poison(f.batch[0], DeadLetterReason::decode_error, "not an order: boom!");
    CHECK(f.batch[0].id.is_nil());
    CHECK(f.batch[1].state == ItemState::pending);
    CHECK(f.batch[1].id == good);
    CHECK(f.batch[1].slot == 1);
    check_poison(f.batch[2], DeadLetterReason::decode_error, "std failure");
    check_poison(f.batch[3], DeadLetterReason::decode_error, "non-standard exception");
    // Counted when screened (handed to the workers), not when decoded.
    CHECK(f.metrics.snapshot().decode_errors == 0);

    for (auto& it : f.batch)
        f.intake.screen(it, f.ledger);
    const auto m = f.metrics.snapshot();
    CHECK(m.decode_errors == 3);
    CHECK(m.invalid_event_ids == 0);
    CHECK(f.batch[1].state == ItemState::pending);
    CHECK(f.lines.empty()); // the dead-letterer logs them
}

TEST_CASE("intake: null, empty and oversized payloads are poison before the decoder runs", "[unit][intake]")
{
    Fixture f;
    f.cfg.max_payload_bytes = 40;
    f.start();
    const auto id = new_event_id();
    f.poll(std::nullopt);
    f.poll(std::string());
    f.poll(payload_of(id, "abc")); // 36 + 1 + 3: at the bound
    f.poll(payload_of(id, "abcd"));
    f.take();
    CHECK(f.decoder_calls == 1);
    check_poison(f.batch[0], DeadLetterReason::empty_payload, "null payload");
    check_poison(f.batch[1], DeadLetterReason::empty_payload, "empty payload");
    CHECK(f.batch[2].state == ItemState::pending);
    CHECK(f.batch[2].id == id);
    check_poison(f.batch[3], DeadLetterReason::payload_too_large, "payload of 41 bytes exceeds max_payload_bytes 40");
    // They are counted with the decode errors (dead_lettered tells the reasons apart).
    const auto m = f.metrics.snapshot();
    CHECK(m.decode_errors == 3);
    CHECK(m.invalid_event_ids == 0);
}

TEST_CASE("intake: a nil, missing or malformed event id is poison with its own reason", "[unit][intake]")
{
    Fixture f;
    f.start();
    f.poll("00000000-0000-0000-0000-000000000000:order");
    f.poll("noid");
    f.poll("017f22e2-79b0-7cc3-98c4-dc0c0c07398:order"); // one digit short
    std::string parse_error;
    try {
        EventId::parse("017f22e2-79b0-7cc3-98c4-dc0c0c07398");
    } catch (const InvalidEventId& e) {
        parse_error = e.what();
    }
    REQUIRE_FALSE(parse_error.empty());
    f.take();
    CHECK(f.decoder_calls == 3);
    check_poison(f.batch[0], DeadLetterReason::invalid_event_id, "event id is the nil UUID");
    check_poison(f.batch[1], DeadLetterReason::missing_event_id, "no eventId field");
    check_poison(f.batch[2], DeadLetterReason::invalid_event_id, parse_error);
    const auto m = f.metrics.snapshot();
    CHECK(m.invalid_event_ids == 3);
    CHECK(m.decode_errors == 0);
}

TEST_CASE("intake: decode puts each record in its own Stage slot, from the first slot it is given on",
          "[unit][intake]")
{
    // A Stage that tells what it was asked (the typed one keeps that to itself).
    struct Recording final : Stage {
        std::vector<std::size_t> decoded;
        void reserve(std::size_t) override {}
        EventId decode(std::size_t slot, const Record& record) override
        {
            decoded.push_back(slot);
            return EventId::parse(*record.value);
        }
        void handle(std::size_t, pqxx::work&, const Context&) override {}
        bool batched() const noexcept override { return false; }
        void handle_batch(pqxx::work&, const std::size_t*, const Context*, std::size_t) override {}
    };
    Fixture f;
    Recording stage;
    Intake intake(f.cfg, stage, f.metrics, {});
    intake.set_layout(RetentionMode::partitioned);
    f.poll(new_event_id().to_string());
    f.poll(std::nullopt); // skipped by the decoder, its slot kept
    f.poll(new_event_id().to_string());
    intake.decode(f.batch, 40);
    CHECK(stage.decoded == std::vector<std::size_t>{40, 42});
    CHECK(f.batch[0].slot == 40);
    CHECK(f.batch[1].slot == 41);
    CHECK(f.batch[2].slot == 42);
}

TEST_CASE("intake: an event beyond the dedup horizon is dead-lettered by default, counted, and explained once",
          "[unit][intake]")
{
    Fixture f; // retention 7 d, horizon_margin 1 d: the horizon is 6 d
    f.start();
    const auto old1 = aged(hours(24 * 6) + minutes(1));
    const auto young = aged(hours(24 * 6) - minutes(1));
    const auto future = aged(-hours(1)); // a producer whose clock runs fast
    const auto old2 = aged(hours(24 * 30));
    for (const auto& id : {old1, young, future, old2})
        f.poll(payload_of(id));
    f.take();

    for (std::size_t i : {0, 3}) {
        const auto& it = f.batch[i];
        CAPTURE(i);
        CHECK(it.state == ItemState::poison);
        CHECK(it.reason == DeadLetterReason::beyond_dedup_horizon);
        CHECK(it.error.rfind("event " + it.id.to_string() + " is ", 0) == 0);
        CHECK(ends_with(it.error, " ms old; dedup horizon is 518400000 ms"));
    }
    CHECK(f.batch[1].state == ItemState::pending);
    CHECK(f.batch[2].state == ItemState::pending);
    CHECK_FALSE(f.batch[1].reconcile);
    const auto m = f.metrics.snapshot();
    CHECK(m.beyond_dedup_horizon == 2);
    CHECK(m.horizon_processed == 0);
    CHECK(m.decode_errors == 0);
    CHECK(m.invalid_event_ids == 0);

    // One error line names the setting that decided it, however many records.
    const auto errors = f.at(LogLevel::error);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0]->message.find("dedup horizon (144 h)") != std::string::npos);
    CHECK(errors[0]->message.find("retention.beyond_horizon is dead_letter") != std::string::npos);
    CHECK(errors[0]->field(log_field::component) == std::optional<std::string_view>("consumer"));
    CHECK(f.lines.size() == 1);
}

TEST_CASE("intake: the dedup horizon is the configured retention less its margin", "[unit][intake]")
{
    Fixture f;
    f.cfg.retention.retention = hours(2);
    f.cfg.retention.partition_width = hours(1);
    f.cfg.retention.horizon_margin = minutes(30);
    f.start();
    f.poll(payload_of(aged(minutes(91))));
    f.poll(payload_of(aged(minutes(89))));
    f.take();
    CHECK(f.batch[0].reason == DeadLetterReason::beyond_dedup_horizon);
    CHECK(ends_with(f.batch[0].error, "dedup horizon is 5400000 ms"));
    CHECK(f.batch[1].state == ItemState::pending);
    CHECK(f.metrics.snapshot().beyond_dedup_horizon == 1);
    REQUIRE(f.at(LogLevel::error).size() == 1);
    CHECK(f.at(LogLevel::error)[0]->message.find("dedup horizon (1 h)") != std::string::npos);
}

TEST_CASE("intake: beyond the horizon, policy process hands the event on with a warning; reconcile marks it for "
          "the hook",
          "[unit][intake]")
{
    Fixture f;
    SECTION("process")
    {
        f.cfg.retention.beyond_horizon = HorizonPolicy::process;
        f.start();
        const auto old = aged(hours(24 * 8));
        f.poll(payload_of(old), 42);
        f.take();
        CHECK(f.batch[0].state == ItemState::pending);
        CHECK_FALSE(f.batch[0].reconcile);
        const auto m = f.metrics.snapshot();
        CHECK(m.beyond_dedup_horizon == 1);
        CHECK(m.horizon_processed == 1);
        REQUIRE(f.lines.size() == 1);
        const auto& w = f.lines[0];
        CHECK(w.level == LogLevel::warning);
        CHECK(w.message ==
              "orders/3@42 (event " + old.to_string() + ") is beyond the dedup horizon; processed by policy");
        CHECK(w.field(log_field::topic) == std::optional<std::string_view>("orders"));
        CHECK(w.field(log_field::partition) == std::optional<std::string_view>("3"));
        CHECK(w.field(log_field::offset) == std::optional<std::string_view>("42"));
        CHECK(w.field(log_field::event_id) == std::optional<std::string_view>(old.to_string()));
    }
    SECTION("reconcile")
    {
        f.cfg.retention.beyond_horizon = HorizonPolicy::reconcile;
        f.cfg.retention.reconcile = [](pqxx::work&, const Context&) { return ReconcileOutcome::process; };
        f.start();
        f.poll(payload_of(aged(hours(24 * 8))));
        f.poll(payload_of(aged(hours(1))));
        f.take();
        CHECK(f.batch[0].state == ItemState::pending);
        CHECK(f.batch[0].reconcile);
        CHECK_FALSE(f.batch[1].reconcile);
        const auto m = f.metrics.snapshot();
        CHECK(m.beyond_dedup_horizon == 1);
        CHECK(m.horizon_processed == 0); // the hook's outcome decides, in the engine
        CHECK(f.lines.empty());
    }
}

TEST_CASE("intake: the downstream key window is open for young and future ids, closed for older and non-v7 ones",
          "[unit][intake]")
{
    Fixture f;
    f.cfg.retention.downstream_key_window = hours(24);
    f.cfg.retention.non_v7 = NonV7Policy::process;
    f.start();
    f.poll(payload_of(aged(hours(23))));
    f.poll(payload_of(aged(hours(25))));
    f.poll(payload_of(aged(-hours(2))));
    f.poll(payload_of(v4));
    f.take();
    for (const auto& it : f.batch)
        CHECK(it.state == ItemState::pending);
    CHECK(f.batch[0].key_window_open);
    CHECK_FALSE(f.batch[1].key_window_open);
    CHECK(f.batch[2].key_window_open);
    CHECK_FALSE(f.batch[3].key_window_open);
    CHECK(f.metrics.snapshot().beyond_dedup_horizon == 0);
}

TEST_CASE("intake: an id that is not a UUIDv7 follows the claims table's layout as found, not the configured mode",
          "[unit][intake]")
{
    Fixture f;
    auto dead_lettered = [&] {
        f.poll(payload_of(v4));
        f.poll(payload_of(v4, "again"));
        f.take();
        for (const auto& it : f.batch) {
            if (it.state != ItemState::poison)
                return false;
            CHECK(it.reason == DeadLetterReason::non_v7_event_id);
            CHECK(it.error ==
                  "event id " + v4.to_string() + " is not a UUIDv7; the partitioned claims table needs one");
        }
        return true;
    };
    SECTION("partitioned table: dead-lettered, explained once")
    {
        f.start(RetentionMode::partitioned);
        CHECK(dead_lettered());
        const auto errors = f.at(LogLevel::error);
        REQUIRE(errors.size() == 1);
        CHECK(errors[0]->message.find("retention.non_v7 is dead_letter") != std::string::npos);
        CHECK(f.lines.size() == 1);
        const auto m = f.metrics.snapshot();
        CHECK(m.invalid_event_ids == 0);
        CHECK(m.decode_errors == 0);
        CHECK(m.beyond_dedup_horizon == 0);
    }
    SECTION("a plain table kept from before, though partitioned is configured: processed")
    {
        f.start(RetentionMode::purge);
        CHECK_FALSE(dead_lettered());
        CHECK(f.batch[0].state == ItemState::pending);
        CHECK(f.batch[1].state == ItemState::pending);
        CHECK(f.lines.empty());
    }
    SECTION("a partitioned table, though purge is configured: dead-lettered")
    {
        f.cfg.retention.mode = RetentionMode::purge;
        f.start(RetentionMode::partitioned);
        CHECK(dead_lettered());
    }
    SECTION("non_v7 = process: processed")
    {
        f.cfg.retention.non_v7 = NonV7Policy::process;
        f.start(RetentionMode::partitioned);
        CHECK_FALSE(dead_lettered());
        CHECK(f.lines.empty());
    }
}

TEST_CASE("intake: both default-policy explanations are logged, each once", "[unit][intake]")
{
    Fixture f;
    f.start();
    for (int round = 0; round < 2; ++round) {
        f.batch.clear();
        f.poll(payload_of(v4));
        f.poll(payload_of(aged(hours(24 * 10))));
        f.take();
        CHECK(f.batch[0].reason == DeadLetterReason::non_v7_event_id);
        CHECK(f.batch[1].reason == DeadLetterReason::beyond_dedup_horizon);
    }
    const auto errors = f.at(LogLevel::error);
    REQUIRE(errors.size() == 2);
    CHECK(errors[0]->message.find("retention.non_v7") != std::string::npos);
    CHECK(errors[1]->message.find("retention.beyond_horizon") != std::string::npos);
    CHECK(f.metrics.snapshot().beyond_dedup_horizon == 2);
}

TEST_CASE("intake: a record whose dead letter was acknowledged is done; one whose dead letter was refused goes "
          "again as it was",
          "[unit][intake]")
{
    Fixture f;
    f.start();
    f.ledger.dead_lettered(f.ps, 5);
    f.ledger.dead_letter_refused(f.ps, 6, DeadLetterReason::handler_failed, "handler said no", 3);
    f.poll("boom", 5);                          // poison again: already dead-lettered
    f.poll(payload_of(new_event_id()), 6);      // decodes now: its dead letter goes as it was
    f.poll("boom", 7);                          // poison, for the first time
    f.poll(payload_of(aged(hours(24 * 9))), 8); // beyond the horizon
    f.take();
    CHECK(f.batch[0].state == ItemState::done);
    check_poison(f.batch[1], DeadLetterReason::handler_failed, "handler said no");
    CHECK(f.batch[1].attempts == 3);
    CHECK(f.batch[2].state == ItemState::poison);
    CHECK(f.batch[2].reason == DeadLetterReason::decode_error);
    CHECK(f.batch[2].attempts == -1);
    CHECK(f.batch[3].reason == DeadLetterReason::beyond_dedup_horizon);
    const auto m = f.metrics.snapshot();
    CHECK(m.decode_errors == 1); // only the record not settled before
    CHECK(m.invalid_event_ids == 0);
    CHECK(m.beyond_dedup_horizon == 1);
}
