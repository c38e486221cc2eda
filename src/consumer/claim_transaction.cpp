// The claim transaction's skeleton: a worker's connection prepared, then per
// batch its attempts (one transaction each: claim, handler calls, stored
// positions, COMMIT) until one commits, the database fails or the work is
// abandoned. The concerns it wires are in files of their own: handler
// calls (claim_handler_calls.cpp), a record's failure with retries and the
// circuit breaker (claim_failures.cpp), what ended a transaction early
// (claim_faults.cpp), reused ids (claim_reuse.cpp), screening and the
// reconcile hook (claim_screen.cpp), stored positions (claim_positions.cpp)
// and the member lock (member_sessions.cpp).

#include "consumer/claim_transaction.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "consumer/claim_parts.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/schema.hpp"
#include "pg/arrays.hpp"
#include "pg/claims.hpp"
#include "pg/connect.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {

void Worker::reset(const Holds& initial)
{
    items.clear();
    holds = initial; // a record held before the transactions is held in every worker
    info = BatchInfo{};
    failed = lost_connection = abandoned = scratch.one_by_one = false;
    revoked = false;
    error = nullptr;
    stored.clear();
    commits.clear();
    settled = 0;
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
        const bool fp = s_.cfg.payload_fingerprint;
        const char* types = fp ? "uuid[], text, bigint[]" : "uuid[], text";
        tx.exec(
            fmt::format("PREPARE {} ({}) AS {}", claim_statement, types,
                        pg::commit_guard_cte() + (fp ? pg::fingerprint_claim_sql(s_.store) : pg::claim_sql(s_.store))));
        if (s_.cfg.optimistic_claims)
            tx.exec(fmt::format("PREPARE {} ({}) AS {}", new_claim_statement, types,
                                pg::commit_guard_cte() + pg::new_claim_sql(s_.store, fp)));
    }
    if (s_.cfg.payload_fingerprint)
        db.prepare(fingerprints_statement, pg::stored_fingerprints_sql(s_.store));
    pg::set_session(db, "lock_timeout", std::to_string(s_.cfg.lock_timeout.count())); // ms
    pg::set_session(db, "idle_in_transaction_session_timeout", "0");
    pg::guard_session(db);
    // The session as open_for_writes_sql() puts it back (its defaults and the
    // settings above): the same after a claim transaction's COMMIT means its
    // handlers left the session alone.
    w.clean_session = pg::session_state(db);
    w.session_dirty = true;
    mark_member(w);
}

void ClaimTransaction::run(Worker& w, std::vector<Item>& items, Clock::time_point deadline)
{
    Batch b{items, deadline};
    // However it ends: a transaction the last COMMIT began for records that
    // do not run now is rolled back.
    struct Chain {
        ClaimTransaction& self;
        Worker& w;
        ~Chain() { self.end_chain(w); }
    } chain{*this, w};
    int conflicts = 0;
    for (;;) {
        // Several transactions per unit: past the time budget, the records
        // not begun yet come again (one transaction at least, as in a batch).
        if (chunked() && !w.commits.empty() && !w.chained && Clock::now() >= b.deadline) {
            give_back_rest(w, b);
            return;
        }
        Failure failure{};
        const Outcome out = attempt(w, b, failure);
        s_.circuit.succeeded(w.tallies.calls_ok,
                             w.tallies.calls_recovered); // before the failure, if any: they ran before it
        s_.circuit.succeeded_on(w.tallies.ok_keys);
        if (out == Outcome::committed) {
            s_.circuit.skipped(w.info.duplicates);
            // Several transactions per unit: on to the next one, until none
            // is left to run (a record left pending would be taken for done).
            if (!chunked() || !any_left(w, b))
                return;
            conflicts = 0;
            continue;
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
                w.scratch.one_by_one = true;
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

// One transaction over the worker's pending records that are not held.
ClaimTransaction::Outcome ClaimTransaction::attempt(Worker& w, Batch& b, Failure& failure)
{
    // Several transactions per unit: the first records still to run.
    Attempt a = chunked() ? collect(w, b.items, s_.cfg.payload_fingerprint, s_.tx_records, w.settled)
                          : collect(w, b.items, s_.cfg.payload_fingerprint);
    w.info = BatchInfo{};
    w.info.records = a.active;
    w.tallies.calls_ok = w.tallies.calls_recovered = 0;
    w.tallies.ok_keys.clear();
    w.tallies.watch_keys = s_.circuit.blaming();
    if (a.ids.empty())
        return Outcome::committed;
    w.scratch.call_items.clear();
    w.scratch.call_slots.clear();
    w.scratch.call_contexts.clear();
    try {
        const Outcome out = transact(w, b, a, failure);
        // Rolled back before any handler ran: made again, with ON CONFLICT.
        return out == Outcome::claim_again ? transact(w, b, a, failure) : out;
    } catch (...) {
        // What the transaction's end means is decided in one place, classify();
        // what is not ours to decide (a non-standard exception) goes on up.
        return recover(classify(std::current_exception(), a.current != nobody), w, a, failure);
    }
}

// The worker's pending records that are not held, each id once (its first
// record in batch order). Claims go in id order: workers that share ids lock
// them in the same order and cannot deadlock each other.
ClaimTransaction::Attempt collect(const BatchOutcome& w, const std::vector<Item>& items, bool fingerprints,
                                  std::size_t most, std::size_t from)
{
    ClaimTransaction::Attempt a;
    a.from = from;
    a.end = w.items.size();
    // (id, index) of the pending records; sorted, the first of each id's run
    // is its first record in batch order. No hash set: a sort of the batch
    // costs less than a node per id.
    std::vector<std::pair<EventId, std::size_t>> pending;
    pending.reserve(std::min(most, w.items.size() - std::min(from, w.items.size())));
    for (std::size_t k = from; k < w.items.size(); ++k) {
        const std::size_t i = w.items[k];
        const auto& it = items[i];
        if (!to_run(w.holds, it))
            continue;
        pending.emplace_back(it.id, i);
        if (pending.size() == most) {
            a.end = k + 1;
            break;
        }
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
        if (fingerprints)
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
    // Several transactions per unit: the last COMMIT's text began this
    // transaction and claimed its records (commit_chained()).
    auto chained = std::exchange(w.chained, std::nullopt);
    if (chained && chained->first != a.first) {
        w.kept.drop(); // begun for other records: rolled back
        chained.reset();
    }
    pg::KeptWork::Scope scope(w.kept); // rolled back unless commit() commits
    pqxx::work& tx = w.kept.on(*w.db);
    const bool was_clean = !w.session_dirty;
    w.session_dirty = true; // until this transaction's end finds the session unchanged
    if (chained) {
        a.claimed = pg::ClaimedIds(std::move(chained->claimed));
    } else {
        // One round trip for all: BEGIN (where the kept work's last
        // transaction committed), the transaction's settings, the claim.
        // What a handler left on the session goes back only when the last
        // transaction's end saw a change (or could not look): a dozen
        // statements fewer per transaction otherwise.
        const bool clean = was_clean && pg::read_only_by_default(tx);
        const bool begin = w.kept.begins();
        std::string before = clean ? pg::reopen_for_writes_sql(begin)
                                   : pg::open_for_writes_sql(s_.cfg.lock_timeout, w.db->server_version(), begin);
        before += "; ";
        const bool as_new = s_.cfg.optimistic_claims && w.claims_on_conflict == 0;
        std::string not_all; // a claim of ids expected new that did not take them all: why
        try {
            const auto r = claim(tx, a.ids, a.fingerprints, before, as_new);
            if (!as_new)
                a.claimed = pg::ClaimedIds(pg::claimed_ids(r));
            else if (static_cast<std::size_t>(r.affected_rows()) == a.ids.size())
                a.claimed = pg::ClaimedIds(a.ids);
            else // a trigger of the table's skipped rows: which, the claim with ON CONFLICT tells
                not_all = fmt::format("{} rows inserted", r.affected_rows());
        } catch (const pqxx::unique_violation& e) {
            if (!as_new)
                throw;
            not_all = e.what();
        }
        if (!not_all.empty()) {
            // Rolled back (the scope) before any handler ran, and with it
            // the settings the claim's text made.
            w.session_dirty = !was_clean;
            not_new(w, a, not_all);
            return Outcome::claim_again;
        }
    }
    if (w.claims_on_conflict > 0)
        w.claims_on_conflict = a.claimed.size() < a.ids.size() ? claims_before_optimism : w.claims_on_conflict - 1;
    w.watch.arm(s_.cfg.db_timeout);
    // Only where a record is not the first claim of its id: a conflict, or
    // an id twice in the batch.
    if (s_.cfg.payload_fingerprint && (a.claimed.size() < a.ids.size() || a.active > a.ids.size())) {
        const Reused reused = reject_reused(tx, w, b, a);
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
    const Outcome out = commit(tx, w, b, a);
    scope.done();
    return out;
}

// The stored positions, the checks that the transaction is still the claim's
// own, and COMMIT (with the guard's arm: one round trip; several
// transactions per unit: with the next one's claim too, see
// commit_chained()).
ClaimTransaction::Outcome ClaimTransaction::commit(pqxx::work& tx, Worker& w, const Batch& b, const Attempt& a)
{
    // Several transactions per unit: the last of its records, past which
    // the later transactions' records must not move their partitions'
    // positions yet.
    const std::size_t upto = chunked() ? w.items[a.end - 1] : SIZE_MAX;
    std::vector<std::pair<PartitionState*, std::int64_t>> stored;
    if (s_.offsets && !s_.positions_after_merge)
        write_positions(tx, positions_of(w, b.items, &stored, upto));
    if (const auto state = pg::state_of(tx); state != pg::TxState::open)
        throw std::runtime_error(fmt::format("transaction {} before COMMIT", pg::to_string(state)));
    if (w.revoked.load())
        throw Abandon{};
    Attempt next;
    if (chunked() && may_chain(w, b))
        next = collect(w, b.items, s_.cfg.payload_fingerprint, s_.tx_records, a.end);
    if (!next.ids.empty()) {
        commit_chained(tx, w, next);
    } else {
        const auto session = pg::commit_armed(tx);
        if (!session)
            throw Replaced{};
        w.session_dirty = *session != w.clean_session;
        w.chain_failed = false;
    }
    w.stored = std::move(stored);
    w.info.claimed = a.claimed_override != SIZE_MAX ? a.claimed_override : a.claimed.size();
    w.info.duplicates = a.active - w.info.claimed;
    if (w.info.records)
        w.commits.push_back(w.info);
    if (chunked())
        settle(w, b, a);
    return Outcome::committed;
}

// Several transactions per unit, after one committed: its records are done
// (not run again, nor held if a later transaction fails), and the next
// transaction's records are found from its end on. A batch handler called
// one record at a time after a failed call is called with whole
// transactions again.
void ClaimTransaction::settle(Worker& w, const Batch& b, const Attempt& a)
{
    for (std::size_t k = a.from; k < a.end; ++k) {
        auto& it = b.items[w.items[k]];
        if (to_run(w.holds, it))
            it.state = ItemState::done;
    }
    w.settled = std::max(w.settled, a.end);
    w.scratch.one_by_one = false;
}

// Several transactions per unit: whether a record of the batch is still to
// run. The records it passes that are done or held stay so: the next search
// starts after them (one pass over the batch in all, whatever its size).
bool ClaimTransaction::any_left(Worker& w, const Batch& b) const
{
    while (w.settled < w.items.size() && !to_run(w.holds, b.items[w.items[w.settled]]))
        ++w.settled;
    return w.settled < w.items.size();
}

// Several transactions per unit: whether the COMMIT may begin the next
// transaction (not on a stop, a revoke, past the time budget, nor right
// after such a COMMIT failed).
bool ClaimTransaction::may_chain(const Worker& w, const Batch& b) const
{
    return !w.chain_failed && !s_.forced() && !w.revoked.load() && Clock::now() < b.deadline;
}

// COMMIT, and in the same text the next transaction begun and its claim
// (of `next`'s records): one round trip fewer per transaction. Between
// them, the session's settings are checked against the clean ones (what
// commit_armed() reads after its COMMIT): where a handler changed them, the
// check raises before the claim, this transaction having committed. A
// failure of anything after the COMMIT is taken for one of the COMMIT (its
// records run again, with a COMMIT of their own, and find their claims:
// duplicates); only the check's own error, in the next transaction, tells
// that the COMMIT went through.
void ClaimTransaction::commit_chained(pqxx::work& tx, Worker& w, const Attempt& next)
{
    w.watch.arm(locking_bound(s_.cfg)); // the claim may wait for row locks
    w.chain_failed = true;              // until it returns
    auto chained = pg::commit_armed_then(tx, w.clean_session, claim_text(tx, next.ids, next.fingerprints));
    w.chain_failed = false;
    switch (chained.ended) {
    case pg::ChainedCommit::End::replaced:
        throw Replaced{};
    case pg::ChainedCommit::End::session_changed:
        // Committed; the next transaction, stopped before its claim, is
        // rolled back, and the next claim puts the session back first.
        w.session_dirty = true;
        w.kept.drop();
        return;
    case pg::ChainedCommit::End::begun:
        w.session_dirty = false; // as the check found it, in the next transaction
        w.chained = Worker::Chained{next.first, pg::claimed_ids(chained.claim)};
        return;
    }
}

// Several transactions per unit, over the time budget: the records not
// begun yet come again (their partitions held there, no backoff).
void ClaimTransaction::give_back_rest(Worker& w, Batch& b)
{
    std::vector<const Item*> rest;
    for (std::size_t i : w.items)
        if (to_run(w.holds, b.items[i]))
            rest.push_back(&b.items[i]);
    for (const Item* it : rest)
        w.holds.add(it->part, it->record.offset, 0);
    if (!rest.empty())
        say(s_.log, LogLevel::info, {}, "batch over its time budget after {} transactions; {} records come again",
            w.commits.size(), rest.size());
}

// A transaction the last COMMIT began for records that do not run in it
// (run() ends first): rolled back. Never throws.
void ClaimTransaction::end_chain(Worker& w)
{
    if (!w.chained)
        return;
    w.chained.reset();
    const pg::Watch::Armed armed(w.watch, locking_bound(s_.cfg));
    w.kept.drop();
}

// The claim statement, after `before` (statements of their own, ending in
// "; ") in the same text: one round trip. Its result is the claim's.
// With `as_new`, the claim of ids expected new (optimistic_claims): it
// returns no ids, and fails with unique_violation where one was claimed.
pqxx::result ClaimTransaction::claim(pqxx::transaction_base& tx, const std::vector<EventId>& ids,
                                     const std::vector<std::int64_t>& fingerprints, const std::string& before,
                                     bool as_new)
{
    return tx.exec(before + claim_text(tx, ids, fingerprints, as_new));
}

// A claim of ids expected new met one claimed already: counted and logged,
// and claims keep to ON CONFLICT for a while.
void ClaimTransaction::not_new(Worker& w, const Attempt& a, const std::string& what)
{
    s_.metrics.optimistic_claim_fallbacks.add();
    w.claims_on_conflict = claims_before_optimism;
    say(s_.log, LogLevel::debug, error_field(what),
        "a claim of {} ids expected new met a claimed one; claimed again with ON CONFLICT DO NOTHING", a.ids.size());
}

// The claim statement's text: EXECUTE of the prepared claim with `ids`.
std::string ClaimTransaction::claim_text(pqxx::transaction_base& tx, const std::vector<EventId>& ids,
                                         const std::vector<std::int64_t>& fingerprints, bool as_new) const
{
    std::string sql = "EXECUTE ";
    sql += as_new ? new_claim_statement : claim_statement;
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
    return sql;
}

} // namespace idemkafka::detail
