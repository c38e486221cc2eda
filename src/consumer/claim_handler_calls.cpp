// The claim transaction's handler calls: one call per claimed record, or
// the records gathered into one batch handler call (split one at a time
// after a failed call), each timed and watched (RunningCall), what a call
// threw or left of the transaction turned into that record's failure, and
// the give-back of the records left when the batch is over its time budget.

#include <exception>

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"
#include "idemkafka/error.hpp"
#include "observe/trace.hpp"
#include "pg/arrays.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {

// The handler calls of the claimed records, in batch order: one call per
// record, or, for a batch handler that has not failed on this batch, each
// record gathered for call_gathered(). An outcome when the attempt ends here.
std::optional<ClaimTransaction::Outcome> ClaimTransaction::call_each(pqxx::work& tx, Worker& w, Batch& b, Attempt& a,
                                                                     Failure& failure)
{
    const bool batched = s_.stage.batched();
    const bool gather = batched && !w.scratch.one_by_one;
    std::size_t handled = 0;
    for (std::size_t k = 0; k < a.first.size(); ++k) {
        const std::size_t i = a.first[k];
        auto& it = b.items[i];
        if (!a.claimed.contains(it.id))
            continue;
        if (s_.forced() || w.revoked.load())
            throw Abandon{};
        if (handled > 0 && Clock::now() >= b.deadline) {
            over_budget(tx, w, b, a, k, handled);
            break;
        }
        if (!it.key_window_open)
            s_.metrics.key_window_closed.add();
        if (gather) {
            w.scratch.call_items.push_back(i);
            w.scratch.call_slots.push_back(it.slot);
            w.scratch.call_contexts.emplace_back(it.record, it.id, s_.ledger.attempt_of(*it.part, it.record.offset),
                                                 it.key_window_open);
            continue;
        }
        a.current = i;
        ++handled;
        const int attempt = s_.ledger.attempt_of(*it.part, it.record.offset);
        const bool ok = call_handler(i, failure, [&] {
            const pg::Watch::Paused paused(w.watch, s_.cfg.db_timeout); // the call's time is the handler's
            const CallScope running(w.call, it);
            const Context ctx(it.record, it.id, attempt, it.key_window_open);
            const TraceScope trace(&it.record); // what the handler publishes carries the record's trace
            if (batched)
                s_.stage.handle_batch(tx, &it.slot, &ctx, 1);
            else
                s_.stage.handle(it.slot, tx, ctx);
        });
        if (w.revoked.load())
            throw Abandon{}; // what the call did is not ours to commit any more
        if (!ok || !left_usable(tx, w, i, failure))
            return Outcome::handler_failed;
        ++w.tallies.calls_ok;
        w.tallies.calls_recovered += attempt > 1 ? 1 : 0;
        if (w.tallies.watch_keys)
            w.tallies.ok_keys.push_back(circuit_key(it));
        a.current = nobody;
    }
    return std::nullopt;
}

// Over the time budget after `handled` calls, at a.first[k]: commit what ran,
// give the rest back so the consumer polls again long before
// max.poll.interval.ms.
void ClaimTransaction::over_budget(pqxx::transaction_base& tx, Worker& w, Batch& b, Attempt& a, std::size_t k,
                                   std::size_t handled)
{
    const auto given_back = give_back(tx, w, b, a, k);
    say(s_.log, LogLevel::info, {}, "batch over its time budget after {} handler calls; {} records come again", handled,
        given_back);
    a.active = 0;
    for (std::size_t p = a.from; p < a.end; ++p)
        if (to_run(w.holds, b.items[w.items[p]]))
            ++a.active;
    w.info.records = a.active;
    a.claimed_override = handled;
}

// Releases the claims of the records of `a` from a.first[k] on (their
// handlers have not run) and holds their partitions there, so this
// transaction commits only finished work. Returns how many of its records
// are given back.
std::size_t ClaimTransaction::give_back(pqxx::transaction_base& tx, Worker& w, Batch& b, const Attempt& a,
                                        std::size_t k)
{
    std::vector<EventId> release;
    for (std::size_t j = k; j < a.first.size(); ++j) {
        const auto& it = b.items[a.first[j]];
        w.holds.add(it.part, it.record.offset, 0);
        if (a.claimed.contains(it.id))
            release.push_back(it.id);
    }
    if (!release.empty())
        pg::exec_params(tx,
                        fmt::format("DELETE FROM {} WHERE consumer_group = $1 AND event_id = ANY($2::uuid[])",
                                    s_.store.qualified_name()),
                        s_.cfg.group_id, pg::uuid_array(release));
    std::size_t n = 0;
    for (std::size_t p = a.from; p < a.end; ++p)
        if (held(w.holds, b.items[w.items[p]]))
            ++n;
    return n;
}

// One batch handler call for every record call_each() gathered. A failed call
// of several records splits the batch: they run again one at a time to find
// the failing one. An outcome when the attempt ends here.
std::optional<ClaimTransaction::Outcome> ClaimTransaction::call_gathered(pqxx::work& tx, Worker& w, Batch& b,
                                                                         Attempt& a, Failure& failure)
{
    if (w.scratch.call_items.empty())
        return std::nullopt;
    const std::size_t handled = w.scratch.call_items.size();
    a.current = w.scratch.call_items.front();
    bool ok = call_handler(a.current, failure, [&] {
        const pg::Watch::Paused paused(w.watch, s_.cfg.db_timeout); // the call's time is the handler's
        const CallScope running(w.call, b.items[a.current], handled);
        // One record: what the handler publishes carries its trace; several: each passes its own.
        const TraceScope trace(handled == 1 ? &b.items[a.current].record : nullptr);
        s_.stage.handle_batch(tx, w.scratch.call_slots.data(), w.scratch.call_contexts.data(), handled);
    });
    if (w.revoked.load())
        throw Abandon{};
    ok = ok && left_usable(tx, w, a.current, failure);
    if (!ok && handled == 1)
        return Outcome::handler_failed;
    if (!ok) {
        s_.metrics.batch_splits.add();
        say(s_.log, LogLevel::warning, {},
            "batch handler failed on {} events; running them one at a time to find the failing record: {}", handled,
            failure.what);
        w.scratch.one_by_one = true;
        return Outcome::split;
    }
    w.tallies.calls_ok += handled;
    for (const auto& ctx : w.scratch.call_contexts)
        w.tallies.calls_recovered += ctx.attempt() > 1 ? 1 : 0;
    if (w.tallies.watch_keys)
        for (const std::size_t i : w.scratch.call_items)
            w.tallies.ok_keys.push_back(circuit_key(b.items[i]));
    return std::nullopt;
}

// Runs one handler call and times it. False, with `failure` naming record
// `blame`, when the handler threw; connection loss, an in-doubt commit and
// serialization failures propagate (they concern the whole transaction).
template <class Call> bool ClaimTransaction::call_handler(std::size_t blame, Failure& failure, Call&& call)
{
    const auto t0 = Clock::now();
    try {
        call();
    } catch (const pqxx::broken_connection&) {
        throw;
    } catch (const pqxx::in_doubt_error&) {
        throw;
    } catch (const pqxx::transaction_rollback&) {
        throw;
    } catch (const pqxx::sql_error& e) {
        if (pg::is_lock_timeout(e))
            throw; // waiting on others' locks is no record's failure
        failure = {blame, e.what(), retryable(s_.cfg, e)};
        return false;
    } catch (const std::exception& e) {
        failure = {blame, e.what(), retryable(s_.cfg, e)};
        return false;
    } catch (...) {
        failure = {blame, "non-standard exception", true};
        return false;
    }
    s_.metrics.handler_seconds.observe(std::chrono::duration<double>(Clock::now() - t0).count());
    return true;
}

// After a handler call that returned normally: a transaction it left aborted
// (it caught a database error and went on), ended (ROLLBACK, or a COMMIT the
// commit guard refused) or replaced (ROLLBACK; BEGIN) is that record's
// failure. Its writes go with the rollback; none of them was committed (the
// commit guard, and read-only outside the library's transactions: see
// pg::guard_session).
bool ClaimTransaction::left_usable(const pqxx::dbtransaction& tx, const Worker& w, std::size_t blame, Failure& failure)
{
    const auto state = pg::state_of(tx);
    if (state == pg::TxState::open && !pg::replaced(tx))
        return true;
    if (state == pg::TxState::unknown && !w.db->is_open())
        throw pqxx::broken_connection("connection lost inside the handler");
    s_.metrics.handler_aborted_transactions.add();
    const auto last = pg::last_error(tx);
    std::string what;
    if (state == pg::TxState::open)
        what = fmt::format("{}: it ended the transaction and began another (ROLLBACK; BEGIN, ROLLBACK AND CHAIN or "
                           "the like) and returned normally; both are rolled back",
                           pg::transaction_ended);
    else if (last.find(pg::transaction_ended) != std::string::npos)
        what = last + " (the handler caught the error and returned normally)";
    else if (state == pg::TxState::ended && last.empty() && pg::rollback_on_failed_statement)
        // libpqxx 6 rolls back on the first failed statement: a caught error looks the same.
        what = "transaction aborted or ended inside the handler: it caught a database error (libpqxx 6 then rolls "
               "the transaction back), or ran ROLLBACK, ABORT or a COMMIT the library refused, and returned normally; "
               "everything of the transaction is rolled back";
    else if (state == pg::TxState::ended && last.empty())
        what = fmt::format("{}: it ran ROLLBACK or ABORT (or a COMMIT the library refused, and caught the error) and "
                           "returned normally; everything of the transaction is rolled back",
                           pg::transaction_ended);
    else
        what = "transaction aborted inside the handler: it returned normally with the " + pg::left_unusable(tx, state);
    failure = {blame, std::move(what), true};
    return false;
}

bool retryable(const ConsumerConfig& cfg, const std::exception& e)
{
    if (dynamic_cast<const NonRetryableError*>(&e))
        return false;
    if (!cfg.is_retryable)
        return true;
    try {
        return cfg.is_retryable(e);
    } catch (...) {
        return true; // a classifier that throws must not lose the record
    }
}

} // namespace idemkafka::detail
