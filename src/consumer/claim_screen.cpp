// Before a unit's claim transactions: each record screened by Intake, the
// reconcile hook (in a transaction of its own) for records beyond the dedup
// horizon, and poison records to the dead letter.

#include <stdexcept>

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {

Holds ClaimTransaction::screen(Intake& intake, Worker& w, std::vector<Item>& items)
{
    Holds holds;
    for (auto& it : items) {
        intake.screen(it, s_.ledger);
        if (it.reconcile)
            reconcile(w, it);
        if (it.retry_later)
            holds.add(it.part, it.record.offset, it.retry_failures);
    }
    std::vector<Item*> poisoned;
    for (auto& it : items)
        if (it.state == ItemState::poison && !holds.covers(it.part, it.record.offset))
            poisoned.push_back(&it);
    s_.dead_letters.send(poisoned, holds);
    return holds;
}

void ClaimTransaction::reconcile(Worker& w, Item& it)
{
    const auto where = it.where();
    ReconcileOutcome outcome = ReconcileOutcome::dead_letter;
    const int attempt = s_.ledger.attempt_of(*it.part, it.record.offset);
    try {
        if (!w.db)
            throw pqxx::broken_connection("no PostgreSQL connection");
        const pg::Watch::Armed armed(w.watch, locking_bound(s_.cfg));
        w.session_dirty = true;            // the hook may change the session: the next claim transaction puts it back
        pg::KeptWork::Scope scope(w.kept); // rolled back unless committed
        pqxx::work& tx = w.kept.on(*w.db);
        pg::open_for_writes(tx, s_.cfg.lock_timeout, w.kept.begins()); // BEGIN in the same round trip
        pg::guard_transaction(tx); // the hook's own COMMIT would commit without the claim
        {
            const pg::Watch::Paused paused(w.watch, s_.cfg.db_timeout); // the hook's time is its own
            const CallScope running(w.call, it);
            outcome = s_.cfg.retention.reconcile(tx, Context(it.record, it.id, attempt, it.key_window_open));
        }
        if (const auto state = pg::state_of(tx); state != pg::TxState::open)
            throw std::runtime_error("the hook returned with the " + pg::left_unusable(tx, state));
        // Seen before the skip claim (which would arm a transaction the hook began) and at the arm.
        const auto replaced_by_hook = [] {
            return std::runtime_error(
                fmt::format("{}: the hook ended the transaction and began another", pg::transaction_ended));
        };
        if (pg::replaced(tx))
            throw replaced_by_hook();
        if (outcome == ReconcileOutcome::skip) // the effect is there: claimed with what the hook wrote
            claim(tx, {it.id}, {fingerprint_of(it)});
        if (!pg::commit_armed(tx))
            throw replaced_by_hook();
        scope.done();
    } catch (const std::exception& e) {
        reconcile_failed(it, where, e);
        return;
    }
    if (outcome == ReconcileOutcome::skip) {
        say(s_.log, LogLevel::info, it.log_fields(), "reconcile hook skipped {} (event {})", where, it.id.to_string());
        it.state = ItemState::done;
        s_.metrics.duplicates.add();
    } else if (outcome == ReconcileOutcome::dead_letter) {
        it.poison(DeadLetterReason::beyond_dedup_horizon, "reconcile hook chose the dead letter");
    } else {
        s_.metrics.horizon_processed.add();
    }
}

// The reconcile hook threw (or left its transaction unusable): a failure of
// the record, retried before any transaction until max_attempts, then its
// dead letter.
void ClaimTransaction::reconcile_failed(Item& it, const std::string& where, const std::exception& e)
{
    const int failures = s_.ledger.count_failure(*it.part, it.record.offset);
    s_.metrics.handler_failures.add();
    if (failures >= s_.cfg.max_attempts) {
        say(s_.log, LogLevel::error, it.log_fields(e.what()), "reconcile hook failed on {} (attempt {} of {}): {}",
            where, failures, s_.cfg.max_attempts, e.what());
        it.poison(DeadLetterReason::beyond_dedup_horizon,
                  fmt::format("reconcile hook failed {} times: {}", failures, e.what()));
        return;
    }
    s_.metrics.retries.add();
    say(s_.log, LogLevel::warning, it.log_fields(e.what()),
        "reconcile hook failed on {} (attempt {} of {}): {}; the record comes again", where, failures,
        s_.cfg.max_attempts, e.what());
    it.retry_later = true;
    it.retry_failures = failures;
}

} // namespace idemkafka::detail
