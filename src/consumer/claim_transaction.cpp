#include "consumer/claim_transaction.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string_view>

#include "core/fingerprint.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/schema.hpp"
#include "observe/trace.hpp"
#include "pg/arrays.hpp"
#include "pg/claims.hpp"
#include "pg/connect.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {
namespace {

constexpr const char* claim_statement = "idemkafka_claim";
constexpr const char* fingerprints_statement = "idemkafka_stored_fingerprints"; // payload_fingerprint only

// Thrown inside the transaction to abandon it on a forced stop.
struct Abandon {};

// Thrown before COMMIT when the transaction is not the one the claim began.
struct Replaced {};

} // namespace

void Worker::reset(const Holds& initial)
{
    items.clear();
    holds = initial; // a record held before the transactions is held in every worker
    info = BatchInfo{};
    failed = lost_connection = abandoned = one_by_one = false;
    revoked = false;
    error = nullptr;
    stored.clear();
}

RetentionMode ClaimTransaction::settle_schema(pqxx::connection& db) const
{
    const auto spec = SchemaSpec::of(s_.cfg);
    const RetentionMode mode = s_.cfg.create_schema
                                   ? migrate_schema(db, spec, Maintenance::Existing::keep, s_.log).claims.mode
                                   : require_schema(db, spec).front().mode;
    // Before the first claim: maintenance of a table shared with groups of a
    // shorter retention then keeps this group's claims for its own.
    Maintenance(s_.store, s_.cfg.retention, s_.log).register_group(db, s_.cfg.group_id);
    return mode;
}

void ClaimTransaction::prepare(Worker& w)
{
    auto& db = *w.db;
    pg::require_own_session(db, s_.cfg.postgres); // before anything is left on the session
    pg::install_commit_guard(db);                 // before guard_session: it creates the session's guard objects
    {
        // Prepared in SQL, run with EXECUTE in a statement text of several
        // (claim()): libpqxx 6 would prepare a statement of its own only when
        // it first runs it, and libpqxx runs the prepared statements it knows
        // of one statement at a time.
        pqxx::nontransaction tx(db);
        tx.exec(fmt::format("PREPARE {} ({}) AS {}", claim_statement,
                            s_.cfg.payload_fingerprint ? "uuid[], text, bigint[]" : "uuid[], text",
                            pg::commit_guard_cte() + (s_.cfg.payload_fingerprint ? pg::fingerprint_claim_sql(s_.store)
                                                                                 : pg::claim_sql(s_.store))));
    }
    if (s_.cfg.payload_fingerprint)
        db.prepare(fingerprints_statement, pg::stored_fingerprints_sql(s_.store));
    pg::set_session(db, "lock_timeout", std::to_string(s_.cfg.lock_timeout.count())); // ms
    pg::set_session(db, "idle_in_transaction_session_timeout", "0");
    pg::guard_session(db);
    {
        // What a claim transaction sees of the session after putting it back:
        // the same at its arm means its handlers left the session alone.
        pqxx::work tx(db);
        tx.exec(pg::open_for_writes_sql(s_.cfg.lock_timeout, db.server_version()));
        w.clean_session = tx.exec("SELECT " + pg::session_state_sql())[0][0].as<std::string>();
    } // rolled back: nothing of it stays
    w.session_dirty = true;
    mark_member(w);
}

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

namespace {

// The circuit breaker's identity of a record's key: the key within its
// partition; a record without a key is a key of its own.
std::uint64_t circuit_key(const Item& it)
{
    constexpr std::uint64_t mix = 0x9e3779b97f4a7c15ull;
    const std::uint64_t own = it.record.key ? std::hash<std::string_view>{}(*it.record.key)
                                            : static_cast<std::uint64_t>(it.record.offset) * mix + 1;
    return own ^ (reinterpret_cast<std::uintptr_t>(it.part) * mix);
}

} // namespace

void ClaimTransaction::run(Worker& w, std::vector<Item>& items, Clock::time_point deadline)
{
    Batch b{items, deadline};
    int conflicts = 0;
    for (;;) {
        Failure failure{};
        const Outcome out = attempt(w, b, failure);
        s_.circuit.succeeded(w.calls_ok, w.calls_recovered); // before the failure, if any: they ran before it
        s_.circuit.succeeded_on(w.ok_keys);
        if (out == Outcome::committed) {
            s_.circuit.skipped(w.info.duplicates);
            return;
        }
        if (out == Outcome::split)
            continue;
        if (out == Outcome::conflict) {
            s_.metrics.transaction_retries.add();
            if (++conflicts <= s_.cfg.transaction_retries) {
                say(s_.log, LogLevel::warning, error_field(failure.what),
                    "transaction conflict, running the batch again ({}/{}): {}", conflicts, s_.cfg.transaction_retries,
                    failure.what);
                continue;
            }
            conflicts = 0; // persistent: a failure of the record that hit it
            if (failure.batch_call) {
                // In a call for several records: find which one, one at a time.
                w.one_by_one = true;
                continue;
            }
            if (failure.index == nobody) {
                // Not any record's doing: the batch waits for a backoff and
                // runs again; nobody is dead-lettered for it.
                s_.metrics.db_failures.add();
                say(s_.log, LogLevel::error, error_field(failure.what),
                    "transaction conflict persisted outside the handlers, batch rolled back and retried after a "
                    "backoff: {}",
                    failure.what);
                w.failed = true;
                return;
            }
        }
        if (out == Outcome::handler_failed || out == Outcome::conflict) {
            handler_failed(w, b, failure);
            continue;
        }
        w.failed = true;
        w.abandoned = out == Outcome::abandoned && !w.fenced;
        return;
    }
}

void ClaimTransaction::handler_failed(Worker& w, Batch& b, const Failure& f)
{
    auto& it = b.items[f.index];
    if (f.retryable && s_.circuit.enabled()) {
        const bool last = s_.ledger.attempt_of(*it.part, it.record.offset) >= s_.cfg.max_attempts;
        const auto verdict =
            s_.circuit.failed(reinterpret_cast<std::uintptr_t>(it.part), circuit_key(it), f.what, Clock::now(), last);
        if (verdict != Circuit::Verdict::counted) {
            not_counted(w, b, f, verdict);
            return;
        }
    }
    const int failures = s_.ledger.count_failure(*it.part, it.record.offset);
    s_.metrics.handler_failures.add();
    const auto where = it.where();
    auto fields = it.log_fields(f.what);
    fields.push_back({"attempt", std::to_string(failures)});
    if (!f.retryable || failures >= s_.cfg.max_attempts) {
        say(s_.log, LogLevel::error, std::move(fields), "handler failed on {} (event {}, attempt {} of {}{}): {}",
            where, it.id.to_string(), failures, s_.cfg.max_attempts, f.retryable ? "" : ", not retryable", f.what);
        it.poison(f.retryable ? DeadLetterReason::handler_failed : DeadLetterReason::non_retryable, f.what);
        s_.dead_letters.send({&it}, w.holds); // done when acknowledged, else held for another try
        return;
    }
    s_.metrics.retries.add();
    it.error = f.what; // the record's last error (HandlerHarness reports it)
    const bool by_key = s_.cfg.ordering == Ordering::key;
    say(s_.log, LogLevel::warning, std::move(fields),
        "handler failed on {} (event {}, attempt {} of {}), retrying in {} ms{}: {}", where, it.id.to_string(),
        failures, s_.cfg.max_attempts, s_.ledger.retry_backoff(failures).count(),
        by_key ? " (its key waits; the partition's other keys go on)" : "", f.what);
    // Ordering::key: only the record's key waits behind it (parked);
    // otherwise its whole partition does.
    if (by_key)
        w.holds.park(it.part, it.record.key, it.record.offset, failures);
    else
        w.holds.add(it.part, it.record.offset, failures);
}

// A handler failure the circuit breaker takes for an outage's, or one of
// its probe: not counted toward max_attempts. While the circuit is open the
// worker gives back every record it has not finished (they run again after
// the outage: the engine pauses the assignment); a probe goes on with its
// other records.
void ClaimTransaction::not_counted(Worker& w, Batch& b, const Failure& f, Circuit::Verdict verdict)
{
    auto& it = b.items[f.index];
    s_.metrics.handler_failures.add();
    s_.metrics.retries.add();
    it.error = f.what;
    const int failures = s_.ledger.attempt_of(*it.part, it.record.offset) - 1;
    const bool probe = verdict == Circuit::Verdict::probe;
    say(s_.log, LogLevel::info, it.log_fields(f.what),
        "handler failed on {} (event {}) {}; not counted toward max_attempts ({} of {} so far): {}", it.where(),
        it.id.to_string(),
        probe ? "in a probe of the open circuit" : "while the circuit is open (an outage, not this record's fault)",
        failures, s_.cfg.max_attempts, f.what);
    if (probe) {
        // Out of the rest of this round of probes: the next batches go past it.
        const auto wait = s_.circuit.round_wait();
        if (s_.cfg.ordering == Ordering::key)
            w.holds.park(it.part, it.record.key, it.record.offset, failures, wait);
        else
            w.holds.add(it.part, it.record.offset, failures, wait);
        return;
    }
    for (std::size_t j : w.items) {
        const auto& other = b.items[j];
        if (other.state == ItemState::pending && !held(w.holds, other))
            w.holds.add(other.part, other.record.offset, 0);
    }
}

bool ClaimTransaction::retryable(const std::exception& e) const
{
    if (dynamic_cast<const NonRetryableError*>(&e))
        return false;
    if (!s_.cfg.is_retryable)
        return true;
    try {
        return s_.cfg.is_retryable(e);
    } catch (...) {
        return true; // a classifier that throws must not lose the record
    }
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
        failure = {blame, e.what(), retryable(e)};
        return false;
    } catch (const std::exception& e) {
        failure = {blame, e.what(), retryable(e)};
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

namespace {

std::int64_t fingerprint_of(const Item& it)
{
    return fingerprint(it.record.value ? *it.record.value : std::string_view());
}

} // namespace

// The claim statement, after `before` (statements of their own, ending in
// "; ") in the same text: one round trip. Its result is the claim's.
pqxx::result ClaimTransaction::claim(pqxx::transaction_base& tx, const std::vector<EventId>& ids,
                                     const std::vector<std::int64_t>& fingerprints, const std::string& before)
{
    std::string sql = before;
    sql += "EXECUTE ";
    sql += claim_statement;
    sql += "('";
    sql += pg::uuid_array(ids); // hex digits, dashes, commas and braces: nothing to escape
    sql += "', ";
    sql += tx.quote(s_.cfg.group_id);
    if (s_.cfg.payload_fingerprint) {
        sql += ", '";
        sql += int_array(fingerprints);
        sql += '\'';
    }
    sql += ')';
    return tx.exec(sql);
}

// With payload_fingerprint, after the claim: a record whose event id was
// claimed with another payload (by an earlier transaction, as its stored
// fingerprint says, or by an earlier record of this one) is dead-lettered
// (event_id_reused) instead of skipped as a duplicate. The stored
// fingerprints are read only for the ids that conflicted (committed claims:
// READ COMMITTED shows them to this next statement). The dead letters are
// sent before COMMIT, so a stored position never passes one that was not
// acknowledged.
ClaimTransaction::Reused ClaimTransaction::reject_reused(pqxx::transaction_base& tx, Worker& w, Batch& b,
                                                         const std::vector<std::size_t>& first,
                                                         const pg::ClaimedIds& claimed)
{
    struct Reference {
        std::int64_t fingerprint;
        const Item* by; // the record of this transaction that claimed it; null: claimed before
    };
    std::unordered_map<EventId, Reference> reference;
    std::vector<EventId> conflicted;
    for (std::size_t i : first) {
        const auto& it = b.items[i];
        if (claimed.contains(it.id))
            reference.emplace(it.id, Reference{fingerprint_of(it), &it});
        else
            conflicted.push_back(it.id);
    }
    if (!conflicted.empty())
        for (const auto& row :
             pg::exec_prepared(tx, fingerprints_statement, s_.cfg.group_id, pg::uuid_array(conflicted)))
            reference.emplace(EventId::parse(row[0].c_str()), Reference{row[1].as<std::int64_t>(), nullptr});
    std::vector<Item*> reused;
    for (std::size_t i : w.items) {
        auto& it = b.items[i];
        if (it.state != ItemState::pending || held(w.holds, it))
            continue;
        const auto ref = reference.find(it.id);
        const std::int64_t own = ref == reference.end() ? 0 : fingerprint_of(it);
        if (ref == reference.end() || own == ref->second.fingerprint)
            continue;
        it.poison(DeadLetterReason::event_id_reused,
                  fmt::format("event id {} was claimed {} with a different payload (fingerprint {:016x}, this "
                              "record's {:016x}): the producer reused the id for another event; this record is not "
                              "processed, the id's effect stays that of the first payload",
                              it.id.to_string(),
                              ref->second.by ? "by " + ref->second.by->where() + " in the same transaction"
                                             : std::string("before"),
                              static_cast<std::uint64_t>(ref->second.fingerprint), static_cast<std::uint64_t>(own)));
        reused.push_back(&it);
    }
    Reused out;
    out.rejected = reused.size();
    if (reused.empty())
        return out;
    const pg::Watch::Paused paused(w.watch, s_.cfg.db_timeout); // the broker's time, not PostgreSQL's
    s_.dead_letters.send(reused, w.holds);
    for (const auto* it : reused)
        out.held = out.held || it->state != ItemState::done;
    return out;
}

// Releases the claims of the records from first[k] on (their handlers have
// not run) and holds their partitions there, so this transaction commits
// only finished work. Returns how many records are given back.
std::size_t ClaimTransaction::give_back(pqxx::transaction_base& tx, Worker& w, Batch& b,
                                        const std::vector<std::size_t>& first, std::size_t k,
                                        const pg::ClaimedIds& claimed)
{
    std::vector<EventId> release;
    for (std::size_t j = k; j < first.size(); ++j) {
        const auto& it = b.items[first[j]];
        w.holds.add(it.part, it.record.offset, 0);
        if (claimed.contains(it.id))
            release.push_back(it.id);
    }
    if (!release.empty())
        pg::exec_params(tx,
                        fmt::format("DELETE FROM {} WHERE consumer_group = $1 AND event_id = ANY($2::uuid[])",
                                    s_.store.qualified_name()),
                        s_.cfg.group_id, pg::uuid_array(release));
    std::size_t n = 0;
    for (std::size_t j : w.items)
        if (held(w.holds, b.items[j]))
            ++n;
    return n;
}

// One transaction over the worker's pending records that are not held.
ClaimTransaction::Outcome ClaimTransaction::attempt(Worker& w, Batch& b, Failure& failure)
{
    Attempt a = collect(w, b);
    w.info = BatchInfo{};
    w.info.records = a.active;
    w.calls_ok = w.calls_recovered = 0;
    w.ok_keys.clear();
    w.watch_keys = s_.circuit.blaming();
    if (a.ids.empty())
        return Outcome::committed;
    w.call_items.clear();
    w.call_slots.clear();
    w.call_contexts.clear();
    try {
        return transact(w, b, a, failure);
    } catch (...) {
        // What the transaction's end means is decided in one place, classify();
        // what is not ours to decide (a non-standard exception) goes on up.
        return recover(classify(std::current_exception(), a.current != nobody), w, a, failure);
    }
}

// The worker's pending records that are not held, each id once (its first
// record in batch order). Claims go in id order: workers that share ids lock
// them in the same order and cannot deadlock each other.
ClaimTransaction::Attempt ClaimTransaction::collect(const Worker& w, const Batch& b) const
{
    const auto& items = b.items;
    Attempt a;
    // (id, index) of the pending records; sorted, the first of each id's run
    // is its first record in batch order. No hash set: a sort of the batch
    // costs less than a node per id.
    std::vector<std::pair<EventId, std::size_t>> pending;
    pending.reserve(w.items.size());
    for (std::size_t i : w.items) {
        const auto& it = items[i];
        if (it.state != ItemState::pending || held(w.holds, it))
            continue;
        pending.emplace_back(it.id, i);
    }
    a.active = pending.size();
    std::sort(pending.begin(), pending.end());
    pending.erase(
        std::unique(pending.begin(), pending.end(), [](const auto& x, const auto& y) { return x.first == y.first; }),
        pending.end());
    a.ids.reserve(pending.size());
    a.first.reserve(pending.size());
    for (const auto& [id, i] : pending) {
        a.ids.push_back(id);
        a.first.push_back(i);
        if (s_.cfg.payload_fingerprint)
            a.fingerprints.push_back(fingerprint_of(items[i]));
    }
    std::sort(a.first.begin(), a.first.end()); // batch order
    return a;
}

// The transaction itself: claim, handler calls, stored positions, COMMIT.
// What ends it early throws (see classify()).
ClaimTransaction::Outcome ClaimTransaction::transact(Worker& w, Batch& b, Attempt& a, Failure& failure)
{
    // Armed before the transaction, so its ROLLBACK on the way out is bounded too.
    const pg::Watch::Armed armed(w.watch, locking_bound(s_.cfg));
    pqxx::work tx(*w.db);
    // One round trip for both: the transaction's settings come first. What a
    // handler left on the session goes back only when the last transaction's
    // arm saw a change (or could not look): a dozen statements fewer per
    // transaction otherwise.
    const bool clean = !w.session_dirty && pg::read_only_by_default(tx);
    w.session_dirty = true; // until this transaction's arm finds the session unchanged
    a.claimed = pg::ClaimedIds(pg::claimed_ids(claim(
        tx, a.ids, a.fingerprints,
        (clean ? pg::reopen_for_writes_sql() : pg::open_for_writes_sql(s_.cfg.lock_timeout, w.db->server_version())) +
            "; ")));
    w.watch.arm(s_.cfg.db_timeout);
    // Only where a record is not the first claim of its id: a conflict, or
    // an id twice in the batch.
    if (s_.cfg.payload_fingerprint && (a.claimed.size() < a.ids.size() || a.active > a.ids.size())) {
        const Reused reused = reject_reused(tx, w, b, a.first, a.claimed);
        if (reused.held)
            return Outcome::split; // again without the partition's tail behind the held dead letter
        a.active -= reused.rejected;
        w.info.records = a.active;
    }
    if (const auto out = call_each(tx, w, b, a, failure))
        return *out;
    if (const auto out = call_gathered(tx, w, b, a, failure))
        return *out;
    a.current = nobody;
    return commit(tx, w, b, a);
}

// The handler calls of the claimed records, in batch order: one call per
// record, or, for a batch handler that has not failed on this batch, each
// record gathered for call_gathered(). An outcome when the attempt ends here.
std::optional<ClaimTransaction::Outcome> ClaimTransaction::call_each(pqxx::work& tx, Worker& w, Batch& b, Attempt& a,
                                                                     Failure& failure)
{
    const bool batched = s_.stage.batched();
    const bool gather = batched && !w.one_by_one;
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
            w.call_items.push_back(i);
            w.call_slots.push_back(it.slot);
            w.call_contexts.emplace_back(it.record, it.id, s_.ledger.attempt_of(*it.part, it.record.offset),
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
        ++w.calls_ok;
        w.calls_recovered += attempt > 1 ? 1 : 0;
        if (w.watch_keys)
            w.ok_keys.push_back(circuit_key(it));
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
    const auto given_back = give_back(tx, w, b, a.first, k, a.claimed);
    say(s_.log, LogLevel::info, {}, "batch over its time budget after {} handler calls; {} records come again", handled,
        given_back);
    a.active = 0;
    for (std::size_t j : w.items)
        if (b.items[j].state == ItemState::pending && !held(w.holds, b.items[j]))
            ++a.active;
    w.info.records = a.active;
    a.claimed_override = handled;
}

// One batch handler call for every record call_each() gathered. A failed call
// of several records splits the batch: they run again one at a time to find
// the failing one. An outcome when the attempt ends here.
std::optional<ClaimTransaction::Outcome> ClaimTransaction::call_gathered(pqxx::work& tx, Worker& w, Batch& b,
                                                                         Attempt& a, Failure& failure)
{
    if (w.call_items.empty())
        return std::nullopt;
    const std::size_t handled = w.call_items.size();
    a.current = w.call_items.front();
    bool ok = call_handler(a.current, failure, [&] {
        const pg::Watch::Paused paused(w.watch, s_.cfg.db_timeout); // the call's time is the handler's
        const CallScope running(w.call, b.items[a.current], handled);
        // One record: what the handler publishes carries its trace; several: each passes its own.
        const TraceScope trace(handled == 1 ? &b.items[a.current].record : nullptr);
        s_.stage.handle_batch(tx, w.call_slots.data(), w.call_contexts.data(), handled);
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
        w.one_by_one = true;
        return Outcome::split;
    }
    w.calls_ok += handled;
    for (const auto& ctx : w.call_contexts)
        w.calls_recovered += ctx.attempt() > 1 ? 1 : 0;
    if (w.watch_keys)
        for (const std::size_t i : w.call_items)
            w.ok_keys.push_back(circuit_key(b.items[i]));
    return std::nullopt;
}

// The stored positions, the checks that the transaction is still the claim's
// own, and COMMIT.
ClaimTransaction::Outcome ClaimTransaction::commit(pqxx::work& tx, Worker& w, const Batch& b, const Attempt& a)
{
    std::vector<std::pair<PartitionState*, std::int64_t>> stored;
    if (s_.offsets && !s_.positions_after_merge)
        write_positions(tx, positions_of(w, b, &stored));
    if (const auto state = pg::state_of(tx); state != pg::TxState::open)
        throw std::runtime_error(fmt::format("transaction {} before COMMIT", pg::to_string(state)));
    const auto session = pg::arm_commit_state(tx);
    if (!session)
        throw Replaced{};
    if (w.revoked.load())
        throw Abandon{};
    tx.commit();
    w.session_dirty = *session != w.clean_session;
    w.stored = std::move(stored);
    w.info.claimed = a.claimed_override != SIZE_MAX ? a.claimed_override : a.claimed.size();
    w.info.duplicates = a.active - w.info.claimed;
    return Outcome::committed;
}

// What an exception that ended the transaction means. `in_handler`: a
// handler call was running. Rethrows what is none of the library's (not a
// std::exception): it goes on up as before.
ClaimTransaction::Classified ClaimTransaction::classify(const std::exception_ptr& error, bool in_handler)
{
    try {
        std::rethrow_exception(error);
    } catch (const Abandon&) {
        return {Fault::abandoned, {}};
    } catch (const Replaced&) {
        return {Fault::replaced, {}};
    } catch (const Fenced&) {
        return {Fault::fenced, {}};
    } catch (const pqxx::in_doubt_error& e) {
        // The commit may or may not have happened: never guess.
        return {Fault::connection, e.what()};
    } catch (const pqxx::broken_connection& e) {
        return {Fault::connection, e.what()};
    } catch (const pqxx::check_violation& e) {
        // 23514 on the claim: maintenance attached the partition for this id
        // at that moment (handler errors never get here).
        return {Fault::conflict, e.what()};
    } catch (const pqxx::transaction_rollback& e) {
        // 40001 / 40P01: the whole transaction is safe to run again.
        return {Fault::conflict, e.what()};
    } catch (const pqxx::sql_error& e) {
        if (!in_handler && (e.sqlstate() == "42P01" || e.sqlstate() == "26000"))
            return {Fault::setup_lost, e.what()};
        if (pg::is_lock_timeout(e))
            return {Fault::lock_timeout, e.what()};
        return {Fault::other, e.what()};
    } catch (const std::exception& e) {
        return {Fault::other, e.what()};
    }
}

// Does what classify() found: counts, logs, and names the attempt's outcome.
ClaimTransaction::Outcome ClaimTransaction::recover(const Classified& c, Worker& w, const Attempt& a, Failure& failure)
{
    switch (c.fault) {
    case Fault::abandoned:
        return Outcome::abandoned;
    case Fault::replaced:
        // A handler ended the transaction and began another, on a server that
        // does not report it at once (before PostgreSQL 14): which handler is
        // unknown. Nothing commits; the batch runs again after a backoff.
        s_.metrics.handler_aborted_transactions.add();
        s_.metrics.db_failures.add();
        say(s_.log, LogLevel::error, {},
            "{}: a handler of this batch ended the transaction and began another (ROLLBACK; BEGIN?); both are rolled "
            "back and the batch runs again after a backoff. PostgreSQL 14 or later names the record",
            pg::transaction_ended);
        return Outcome::db_failed;
    case Fault::fenced:
        w.fenced = true;
        return Outcome::abandoned;
    case Fault::connection:
        // Nothing is committed to Kafka; redelivery and dedup settle it.
        lost_connection(w, c.what.c_str());
        return Outcome::db_failed;
    case Fault::conflict:
        // In a handler call it may be that record's doing; at the claim or at
        // COMMIT it is nobody's. Run it again.
        failure = {a.current, c.what, true, a.current != nobody && w.call_items.size() > 1};
        return Outcome::conflict;
    case Fault::setup_lost:
        // The session lost what prepare() gave it (the guard table, the claim
        // statement): libpqxx 6 reconnected by itself, or a handler ran
        // DISCARD. A new connection gets them again.
        s_.metrics.db_failures.add();
        say(s_.log, LogLevel::error, error_field(c.what),
            "the PostgreSQL session lost the library's setup; reconnecting: {}", c.what);
        w.lost_connection = true;
        return Outcome::db_failed;
    case Fault::lock_timeout:
        s_.metrics.lock_timeouts.add();
        say(s_.log, LogLevel::warning, error_field(c.what),
            "a statement waited for a lock longer than lock_timeout ({} ms){}; the batch is rolled back and runs "
            "again after a backoff: {}",
            s_.cfg.lock_timeout.count(),
            a.current == nobody ? " at the claim (another member's batch holds these event ids?)" : " in a handler",
            c.what);
        if (a.current == nobody)
            end_frozen_members(w);
        return Outcome::db_failed;
    case Fault::other:
        break;
    }
    return db_error(w, c.what);
}

// Any other PostgreSQL error outside the handlers: the batch is rolled back
// and runs again after a backoff.
ClaimTransaction::Outcome ClaimTransaction::db_error(Worker& w, const std::string& what)
{
    s_.metrics.db_failures.add();
    say(s_.log, LogLevel::error, error_field(what),
        "PostgreSQL error outside the handler, batch rolled back and retried after a backoff: {}", what);
    if (w.db && !w.db->is_open())
        lost_connection(w, what.c_str());
    return Outcome::db_failed;
}

void ClaimTransaction::lost_connection(Worker& w, const char* why)
{
    if (w.watch.take_fired()) {
        s_.metrics.db_timeouts.add();
        say(s_.log, LogLevel::error, error_field(why),
            "PostgreSQL did not answer within db_timeout ({} ms, a claim {} ms more): the connection was cut (a "
            "frozen or unreachable server?); the batch's outcome is unknown until PostgreSQL answers again, so "
            "nothing of it is committed to Kafka and its records are redelivered and deduplicated",
            s_.cfg.db_timeout.count(), s_.cfg.lock_timeout.count());
    }
    s_.metrics.db_failures.add();
    say(s_.log, LogLevel::error, error_field(why),
        "PostgreSQL connection lost ({}); offsets of the batch are not committed, records will be redelivered", why);
    w.lost_connection = true;
}

// Next offset per partition of the worker: past every record of this batch
// that is not held (all of them are finished when the transaction commits).
std::vector<OffsetStore::Position>
ClaimTransaction::positions_of(const Worker& w, const Batch& b,
                               std::vector<std::pair<PartitionState*, std::int64_t>>* of) const
{
    std::map<PartitionState*, OffsetStore::Position> by_part;
    for (std::size_t i : w.items) {
        const auto& it = b.items[i];
        if (held(w.holds, it))
            continue;
        auto& p = by_part[it.part];
        if (p.topic.empty()) {
            p.topic = std::string(it.record.topic);
            p.partition = it.record.partition;
            p.epoch = it.part->epoch;
        }
        p.next_offset = std::max(p.next_offset, it.record.offset + 1);
    }
    std::vector<OffsetStore::Position> out;
    for (auto& [ps, p] : by_part) {
        if (of)
            of->emplace_back(ps, p.next_offset);
        out.push_back(std::move(p));
    }
    return out;
}

void ClaimTransaction::write_positions(pqxx::transaction_base& tx, const std::vector<OffsetStore::Position>& positions)
{
    const auto fenced = s_.offsets->write(tx, s_.cfg.group_id, positions);
    if (fenced.empty())
        return;
    s_.metrics.fenced_writes.add(fenced.size());
    {
        std::lock_guard<std::mutex> lock(fenced_mu_);
        for (const auto& p : fenced)
            fenced_.push_back({p.topic, p.partition});
    }
    for (const auto& p : fenced)
        say(s_.log, LogLevel::error,
            {{log_field::topic, p.topic},
             {log_field::partition, std::to_string(p.partition)},
             {"epoch", std::to_string(p.epoch)}},
            "position write for {}/{} refused: epoch {} is stale, another member owns the partition now; rolling back "
            "this transaction",
            p.topic, p.partition, p.epoch);
    throw Fenced{};
}

std::vector<TopicPartition> ClaimTransaction::take_fenced()
{
    std::lock_guard<std::mutex> lock(fenced_mu_);
    return std::exchange(fenced_, {});
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
        w.session_dirty = true; // the hook may change the session: the next claim transaction puts it back
        pqxx::work tx(*w.db);
        pg::open_for_writes(tx, s_.cfg.lock_timeout);
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
        if (!pg::arm_commit(tx))
            throw replaced_by_hook();
        tx.commit();
    } catch (const std::exception& e) {
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

} // namespace idemkafka::detail
