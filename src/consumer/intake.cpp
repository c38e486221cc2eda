#include "consumer/intake.hpp"

#include <fmt/format.h>

#include "idemkafka/error.hpp"

namespace idemkafka::detail {

using std::chrono::milliseconds;

void Intake::set_layout(RetentionMode layout)
{
    auto g = cfg_.retention;
    g.mode = layout;
    guard_.emplace(g);
}

void Intake::decode(std::vector<Item>& batch, std::size_t first_slot)
{
    for (std::size_t i = 0; i < batch.size(); ++i) {
        batch[i].slot = first_slot + i;
        decode(batch[i]);
    }
}

void Intake::decode(Item& it)
{
    const auto& r = it.record;
    if (!r.value || r.value->empty()) {
        it.poison(DeadLetterReason::empty_payload, r.value ? "empty payload" : "null payload");
        return;
    }
    if (r.value->size() > cfg_.max_payload_bytes) {
        it.poison(DeadLetterReason::payload_too_large, fmt::format("payload of {} bytes exceeds max_payload_bytes {}",
                                                                   r.value->size(), cfg_.max_payload_bytes));
        return;
    }
    try {
        it.id = stage_.decode(it.slot, r);
        if (it.id.is_nil())
            throw InvalidEventId("event id is the nil UUID");
    } catch (const MissingEventId& e) {
        it.poison(DeadLetterReason::missing_event_id, e.what());
    } catch (const InvalidEventId& e) {
        it.poison(DeadLetterReason::invalid_event_id, e.what());
    } catch (const std::exception& e) {
        it.poison(DeadLetterReason::decode_error, e.what());
    } catch (...) {
        it.poison(DeadLetterReason::decode_error, "non-standard exception");
    }
}

void Intake::screen(Item& it, PartitionLedger& ledger)
{
    const auto history = ledger.history_of(*it.part, it.record.offset);
    if (history.dead_lettered) {
        it.state = ItemState::done;
        return;
    }
    if (history.due) {
        it.poison(history.due->reason, history.due->error);
        it.attempts = history.due->attempts;
        return;
    }
    if (it.state == ItemState::poison) {
        if (it.reason == DeadLetterReason::invalid_event_id || it.reason == DeadLetterReason::missing_event_id)
            metrics_.invalid_event_ids.add();
        else
            metrics_.decode_errors.add();
        return;
    }
    if (failures_are_handlers_ && history.failures >= cfg_.max_attempts) {
        exhausted(it, history.failures);
        return;
    }
    apply_horizon(it);
}

// Failed max_attempts times already, counted before this member held the
// partition (the count travels with the offset commit) while its dead letter
// never got through: a member stopped or died between the last failure and
// the broker's acknowledgement. Another call would be one attempt too many.
void Intake::exhausted(Item& it, int failures)
{
    it.poison(DeadLetterReason::handler_failed,
              fmt::format("the handler failed {} times (max_attempts {}), counted before this member held the "
                          "partition; the last error is in the log of the member that counted it",
                          failures, cfg_.max_attempts));
    it.attempts = failures;
    say(log_, LogLevel::warning, it.log_fields(it.error),
        "{} (event {}) failed {} times before this assignment and its dead letter was not acknowledged then: "
        "dead-lettered without another handler call",
        it.where(), it.id.to_string(), failures);
}

// An event whose claim may already be purged is not handed to the handler
// blindly. The reconcile hook needs PostgreSQL: the engine runs it.
void Intake::apply_horizon(Item& it)
{
    const auto d = guard_->check(it.id);
    it.key_window_open = d.key_window_open;
    if (d.beyond_horizon)
        metrics_.beyond_dedup_horizon.add();
    if (d.action == HorizonAction::dead_letter) {
        if (d.reason == DeadLetterReason::non_v7_event_id)
            it.poison(DeadLetterReason::non_v7_event_id,
                      "event id " + it.id.to_string() + " is not a UUIDv7; the partitioned claims table needs one");
        else
            it.poison(DeadLetterReason::beyond_dedup_horizon,
                      fmt::format("event {} is {} ms old; dedup horizon is {} ms", it.id.to_string(), d.age.count(),
                                  std::chrono::duration_cast<milliseconds>(cfg_.retention.dedup_horizon()).count()));
        explain_default_once(it.reason);
        return;
    }
    if (d.action == HorizonAction::reconcile) {
        it.reconcile = true;
        return;
    }
    if (d.beyond_horizon) {
        metrics_.horizon_processed.add();
        say(log_, LogLevel::warning, it.log_fields(), "{} (event {}) is beyond the dedup horizon; processed by policy",
            it.where(), it.id.to_string());
    }
}

// The first record a default policy dead-letters gets one error line saying
// which setting decided it and what to change.
void Intake::explain_default_once(DeadLetterReason reason)
{
    if (reason == DeadLetterReason::non_v7_event_id && !non_v7_explained_.exchange(true))
        emit(log_, LogLevel::error,
             "event ids that are not UUIDv7 are dead-lettered: retention.non_v7 is dead_letter (the default with the "
             "partitioned claims table, whose partitions expire by the id's time). Producers that send UUIDv4 or "
             "other ids need retention.non_v7 = NonV7Policy::process or retention.mode = RetentionMode::purge "
             "(docs/event-ids.md). Logged once; every such record is dead-lettered with reason non_v7_event_id",
             "consumer");
    if (reason == DeadLetterReason::beyond_dedup_horizon && !horizon_explained_.exchange(true))
        emit(log_, LogLevel::error,
             fmt::format("events older than the dedup horizon ({} h) are dead-lettered: retention.beyond_horizon is "
                         "dead_letter (the default), as their claims may already be purged. To handle them set "
                         "beyond_horizon = reconcile with a reconcile hook, or process, or keep claims longer "
                         "(retention.retention). Logged once; every such record is dead-lettered with reason "
                         "beyond_dedup_horizon",
                         std::chrono::duration_cast<std::chrono::hours>(cfg_.retention.dedup_horizon()).count()),
             "consumer");
}

} // namespace idemkafka::detail
