// The share consumer's engine (docs/share-groups.md): members, each a thread
// with a share consumer (kafka::ShareMember) and a PostgreSQL connection.
//
// A batch's path, in order:
//  1. member_loop(): kafka::ShareMember::poll() returns one ShareFetch
//     response's records, all acquired (locked) for this member. Nothing else
//     is polled until every one of them is acknowledged (explicit mode).
//  2. run_chunk(): each record gets a ledger state of its own (so that a hold
//     stops that record alone: a share group keeps no order) whose failure
//     count is its delivery count minus one, so Context::attempt() is the
//     delivery count and ClaimTransaction dead-letters a record that fails on
//     its last delivery. Intake decodes and screens; poison records go to the
//     DeadLetterer; ClaimTransaction::run() claims, handles and commits within
//     the batch budget, giving back what does not fit.
//  3. outcome(): each record's acknowledgement, only once what it asserts is
//     durable: ACCEPT after COMMIT (or a duplicate), REJECT after the dead
//     letter was acknowledged, RELEASE otherwise; a record on its last
//     delivery is dead-lettered instead of released.
//  4. ShareMember::commit() sends the acknowledgements and reads the broker's
//     answer per partition (refused: a lock lapsed; counted and logged).
//
// Outages (docs/share-groups.md, "Outages"): the broker counts deliveries,
// so a record acquired only to fail for an outage spends one. One circuit
// breaker for all members tells an outage (handler calls failing across many
// records) from poison; while it is open, or after PostgreSQL failed, a member
// keeps the records in hand and runs them again once the circuit's backoff
// is over (a probe) or PostgreSQL is back, while the batch budget lasts, and
// acquires nothing more until then (may_acquire()).

#include "idemkafka/share_consumer.hpp"

#include <algorithm>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "consumer/claim_age.hpp"
#include "consumer/claim_transaction.hpp"
#include "consumer/dead_letterer.hpp"
#include "consumer/intake.hpp"
#include "consumer/item.hpp"
#include "core/backoff.hpp"
#include "core/circuit_breaker.hpp"
#include "core/ledger.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"
#include "kafka/group_member.hpp"
#include "kafka/share_member.hpp"
#include "observe/log_context.hpp"
#include "share/share_config.hpp"

namespace idemkafka::detail {

using std::chrono::milliseconds;

namespace {

// A poll cannot be woken up: this bounds how long stop() waits for one.
constexpr milliseconds poll_timeout{500};
constexpr Backoff db_backoff_shape{milliseconds(100), milliseconds(5000)};

} // namespace

struct ShareEngine::Impl {
    ShareConsumerConfig share_cfg;
    ConsumerConfig cfg; // effective_consumer_config(share_cfg)
    Stage& stage;
    const std::atomic<bool>& stop;
    Redactor secrets;
    LogSink log;
    Metrics metrics;
    ShareMetrics share;
    ProcessedEventStore store;
    std::optional<OffsetStore> no_offsets;
    milliseconds budget;
    std::size_t slot_cap;
    // One for all members: an outage shows across them, and one probe at a time.
    Circuit circuit;

    // One member of the share group: a thread, a share consumer and a
    // PostgreSQL connection, with the consumer's pieces of its own.
    struct Member {
        Member(Impl& e, std::size_t index)
            : n(index), first_slot(index * e.slot_cap),
              ledger(Backoff{e.cfg.retry_backoff, e.cfg.retry_backoff_max}, db_backoff_shape),
              intake(e.cfg, e.stage, e.metrics, e.log), dead_letters(e.cfg, ledger, e.metrics, e.log, e.secrets),
              // stop() abandons a running transaction before its next handler call: what
              // committed is ACCEPTed, the rest RELEASEd (another delivery, at once).
              claims(ClaimTransaction::Setup{e.cfg, e.stage, e.metrics, e.store, e.no_offsets, ledger, dead_letters,
                                             e.circuit, e.log, [&stop = e.stop] { return stop.load(); }, false})
        {
            intake.count_deliveries();
        }
        std::size_t n;
        std::size_t first_slot;
        PartitionLedger ledger;
        Intake intake;
        DeadLetterer dead_letters;
        ClaimTransaction claims;
        Worker worker;
        GrowingBackoff db_backoff{db_backoff_shape};
        Clock::time_point db_retry_at{};
        bool probing = false; // this member runs the circuit breaker's probe
        bool paused = false;  // not acquiring: an outage
        std::unique_ptr<kafka::ShareMember> kafka;
    };
    std::vector<std::unique_ptr<Member>> members;

    Impl(ShareConsumerConfig c, Stage& s, const std::atomic<bool>& stopped)
        : share_cfg(std::move(c)), cfg(effective_consumer_config(share_cfg)), stage(s), stop(stopped),
          secrets(secrets_of(cfg.postgres,
                             {&cfg.kafka, &cfg.dead_letter_kafka, cfg.outbox ? &cfg.outbox->kafka : nullptr})),
          log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}}, secrets)),
          store(cfg.schema, cfg.table), budget(share_cfg.effective_batch_budget()), slot_cap(cfg.max_batch),
          circuit(cfg.circuit_breaker)
    {
    }

    void connect(Member& m, bool first);
    bool ensure_db(Member& m);
    bool may_acquire(Member& m);
    bool circuit_allows(Member& m, Clock::time_point now);
    void note_outage();
    void settle_probe(Member& m);
    bool await_circuit(Member& m, Clock::time_point deadline);
    bool rerun_in_hand(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                       Clock::time_point deadline);
    void db_outage(Member& m);
    void start();
    void member_loop(Member& m);
    void process(Member& m, const kafka::ShareMember::Batch& batch, Clock::time_point acquired_at);
    void run_chunk(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries, Clock::time_point deadline,
                   std::vector<kafka::Ack>& acks);
    void run_claims(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                    Clock::time_point deadline);
    void settle(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries, std::vector<kafka::Ack>& acks);
    void last_delivery(Member& m, std::vector<Item*>& items, std::vector<kafka::Ack*>& acks);
    void acknowledge(Member& m, const std::vector<const rd_kafka_message_t*>& msgs, const std::vector<kafka::Ack>& acks,
                     Clock::time_point acquired_at);
};

void ShareEngine::Impl::connect(Member& m, bool first)
{
    m.worker.connect(cfg.postgres); // connect_timeout bounds this
    const pg::Watch::Armed armed(m.worker.watch, first ? schema_bound(cfg) : cfg.db_timeout);
    if (first) {
        const auto layout = m.claims.settle_schema(*m.worker.db);
        for (auto& each : members)
            each->intake.set_layout(layout);
    }
    m.claims.prepare(m.worker);
}

// True when the member has a connection and PostgreSQL's backoff is over;
// otherwise one reconnect is tried once its backoff has passed. Nothing is
// polled without one: records would only be acquired to be released, each
// costing a delivery.
bool ShareEngine::Impl::ensure_db(Member& m)
{
    if (Clock::now() < m.db_retry_at)
        return false;
    if (m.worker.db)
        return true;
    try {
        connect(m, false);
        metrics.db_reconnects.add();
        m.db_backoff.reset();
        say(log, LogLevel::info, {}, "reconnected to PostgreSQL (share member {})", m.n);
        return true;
    } catch (const std::exception& e) {
        m.worker.disconnect();
        const auto wait = m.db_backoff.next();
        m.db_retry_at = Clock::now() + wait;
        say(log, LogLevel::warning, error_field(e.what()),
            "PostgreSQL reconnect failed (share member {}), next attempt in {} ms: {}", m.n, wait.count(), e.what());
        return false;
    }
}

void ShareEngine::Impl::start()
{
    stage.reserve(share_cfg.members * slot_cap);
    for (std::size_t i = 0; i < share_cfg.members; ++i)
        members.push_back(std::make_unique<Member>(*this, i));
    connect_at_start(secrets, [this] {
        for (std::size_t i = 0; i < members.size(); ++i)
            connect(*members[i], i == 0);
    });
    // Before the share consumers: the mock cluster (librdkafka 2.15) ends
    // every share session on a broker when any connection to it closes, as a
    // new client's bootstrap connection does soon after it starts.
    for (auto& m : members)
        m->dead_letters.open();
    kafka::ShareMember::Settings settings{cfg.brokers, cfg.group_id, cfg.topics, cfg.kafka, cfg.max_batch};
    for (auto& m : members)
        m->kafka = std::make_unique<kafka::ShareMember>(settings, log, secrets);
}

void ShareEngine::Impl::member_loop(Member& m)
{
    while (!stop.load()) {
        if (!may_acquire(m)) {
            std::this_thread::sleep_for(std::min(milliseconds(100), poll_timeout));
            continue;
        }
        const auto poll_start = Clock::now();
        const auto batch = m.kafka->poll(poll_timeout);
        if (batch.failed)
            metrics.kafka_errors.add();
        if (batch.size() > 0)
            process(m, batch, poll_start);
        if (m.probing && batch.size() > 0)
            settle_probe(m);
    }
    m.kafka->close();
}

// Whether the member may acquire records now: not while PostgreSQL is away
// or its backoff runs, nor while the circuit breaker is open (unless this
// member runs its probe): records acquired then would only be released,
// each having spent a delivery. Pauses and resumes are counted and logged.
bool ShareEngine::Impl::may_acquire(Member& m)
{
    const auto now = Clock::now();
    note_outage();
    const bool db = ensure_db(m);
    const bool ok = db && circuit_allows(m, now);
    if (!ok && !m.paused) {
        m.paused = true;
        share.acquisition_pauses.add();
        say(log, LogLevel::warning, {},
            "share member {} stops acquiring records ({}): acquired now, they would only be released, each "
            "having spent a delivery",
            m.n, db ? "the circuit breaker is open: an outage" : "PostgreSQL is away; reconnecting after a backoff");
    } else if (ok && m.paused) {
        m.paused = false;
        share.acquisition_resumes.add();
        say(log, LogLevel::info, {}, "share member {} acquires records again{}", m.n,
            m.probing ? " (the circuit breaker's probe)" : "");
    }
    return ok;
}

bool ShareEngine::Impl::circuit_allows(Member& m, Clock::time_point now)
{
    if (!circuit.enabled() || m.probing)
        return true;
    const auto state = circuit.state();
    if (state == Circuit::State::closed)
        return true;
    if (state == Circuit::State::open && circuit.probe_due(now)) {
        m.probing = true;
        say(log, LogLevel::info, {}, "circuit breaker probing: share member {} runs the next batch", m.n);
        return true;
    }
    return false; // open, or another member probes
}

// Once per opening of the circuit (from closed): counted and logged.
void ShareEngine::Impl::note_outage()
{
    const auto e = circuit.take_opened();
    if (!e)
        return;
    metrics.circuit_opened.add();
    metrics.circuit_open.set(1);
    share.outages.add();
    say(log, LogLevel::warning, error_field(e->last_error),
        "circuit breaker open: {} of {} handler attempts failed within {} ms, on {} or more records: taken for an "
        "outage, not the records' fault. Members keep the records in hand and run them again after {} ms (a probe), "
        "while their batch budget ({} ms) lasts, and acquire nothing more until the circuit closes. Last error: {}",
        e->failures, e->attempts, e->span.count(), e->keys, e->wait.count(), budget.count(), e->last_error);
}

void ShareEngine::Impl::settle_probe(Member& m)
{
    const auto p = circuit.settle_probe(Clock::now());
    using Outcome = Circuit::Probe::Outcome;
    if (p.outcome == Outcome::closed) {
        m.probing = false;
        metrics.circuit_open.set(0);
        say(log, LogLevel::info, {},
            "circuit breaker closed after {} ms: {} handler call(s) of share member {}'s probe succeeded ({} "
            "failed); every member acquires records again",
            p.open_for.count(), p.successes, m.n, p.failures);
    } else if (p.outcome == Outcome::reopened) {
        m.probing = false;
        say(log, LogLevel::warning, error_field(p.last_error),
            "circuit breaker probe failed ({} handler call(s) failed, none succeeded): open again, the next probe in "
            "{} ms. Last error: {}",
            p.failures, p.wait.count(), p.last_error);
    }
    if (p.gave_up) {
        metrics.circuit_gave_up.add();
        say(log, LogLevel::warning, error_field(p.last_error),
            "circuit breaker gives up: open for {} ms (give_up_after {} ms) and no handler call succeeded; the "
            "probes' failures count from now on. Last error: {}",
            p.open_for.count(), cfg.circuit_breaker.give_up_after.count(), p.last_error);
    }
    // unsettled or passed: this member's next batch probes again
}

// Waits, within `deadline`, until the circuit lets the records in hand run
// again: closed (another member's probe succeeded), or its backoff over and
// this member the one to probe. False when the deadline or a stop came first.
bool ShareEngine::Impl::await_circuit(Member& m, Clock::time_point deadline)
{
    for (;;) {
        note_outage();
        const auto now = Clock::now();
        if (circuit_allows(m, now))
            return true;
        if (stop.load() || now + milliseconds(50) >= deadline)
            return false;
        std::this_thread::sleep_for(milliseconds(50));
    }
}

// After a transaction in which the circuit opened: the records it gave back
// for the outage (not those whose own failure counted) run again once the
// circuit lets them, while the budget lasts, instead of being released.
// False when there were none, or the budget ran out first.
bool ShareEngine::Impl::rerun_in_hand(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                                      Clock::time_point deadline)
{
    if (!circuit.enabled() || (circuit.state() == Circuit::State::closed && !m.probing))
        return false;
    auto& w = m.worker;
    std::vector<std::size_t> again;
    for (std::size_t i : w.items) {
        const auto& it = chunk[i];
        if (it.state != ItemState::pending)
            continue;
        const auto h = std::find_if(w.holds.begin(), w.holds.end(), [&](const auto& e) { return e.first == it.part; });
        if (h == w.holds.end() || h->second.failures <= deliveries[i] - 1)
            again.push_back(i); // its failure did not count: the outage's
    }
    if (again.empty())
        return false;
    const auto held = w.holds;
    Holds keep; // records whose own failure counted stay held: released, as before
    for (const auto& [part, hold] : held)
        if (std::none_of(again.begin(), again.end(), [&, p = part](std::size_t i) { return chunk[i].part == p; }))
            keep.add(part, hold.offset, hold.failures, hold.wait);
    if (m.probing) {
        settle_probe(m); // the transaction just run was the probe
        if (m.probing) { // only records that had failed before failed: probe on after the circuit's wait
            const auto wait =
                std::min(circuit.round_wait(),
                         std::chrono::duration_cast<milliseconds>(deadline - Clock::now() - milliseconds(50)));
            if (wait.count() > 0)
                std::this_thread::sleep_for(wait);
        }
    }
    if (!await_circuit(m, deadline))
        return false;
    w.reset(keep);
    w.items = std::move(again);
    return true;
}

// The records of one poll, in chunks of at most max_batch (a poll may return
// more: one ShareFetch response), all within the batch's budget.
void ShareEngine::Impl::process(Member& m, const kafka::ShareMember::Batch& batch, Clock::time_point acquired_at)
{
    const auto deadline = acquired_at + budget;
    std::vector<const rd_kafka_message_t*> msgs;
    std::vector<kafka::Ack> acks;
    for (std::size_t i = 0; i < batch.size(); ++i) {
        const auto* msg = batch.at(i);
        if (msg->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            // librdkafka acknowledged it itself (REJECT for a corrupt batch,
            // RELEASE for a decompression failure).
            share.record_errors.add();
            metrics.kafka_errors.add();
            say(log, LogLevel::error,
                coordinates(msg->rkt ? rd_kafka_topic_name(msg->rkt) : "", msg->partition, msg->offset),
                "share consumer: record error from librdkafka (acknowledged by librdkafka itself, no dead letter): {}",
                rd_kafka_message_errstr(msg));
            continue;
        }
        msgs.push_back(msg);
    }
    // Records on their last delivery first, in transactions of their own: a
    // stop() or a slow neighbour that ends the others' transaction must not
    // take them along (they could only be dead-lettered then). Then the
    // others by delivery count, highest first: a record given back past an
    // earlier budget is tried before the fresh ones of its batch.
    std::stable_sort(msgs.begin(), msgs.end(), [](const rd_kafka_message_t* a, const rd_kafka_message_t* b) {
        return kafka::ShareMember::delivery_count(*a) > kafka::ShareMember::delivery_count(*b);
    });
    const auto last_end =
        static_cast<std::size_t>(std::count_if(msgs.begin(), msgs.end(), [this](const rd_kafka_message_t* msg) {
            return kafka::ShareMember::delivery_count(*msg) >= share_cfg.delivery_limit;
        }));
    acks.assign(msgs.size(), kafka::Ack::release);
    for (std::size_t start = 0; start < msgs.size();) {
        const std::size_t end = std::min(start < last_end ? last_end : msgs.size(), start + slot_cap);
        std::vector<Item> chunk(end - start);
        std::vector<int> deliveries(end - start);
        std::vector<kafka::Ack> chunk_acks(end - start, kafka::Ack::release);
        for (std::size_t i = start; i < end; ++i) {
            kafka::GroupMember::read(*msgs[i], chunk[i - start].record);
            deliveries[i - start] = std::max(1, kafka::ShareMember::delivery_count(*msgs[i]));
        }
        metrics.consumed.add(chunk.size());
        run_chunk(m, chunk, deliveries, deadline, chunk_acks);
        std::copy(chunk_acks.begin(), chunk_acks.end(), acks.begin() + static_cast<std::ptrdiff_t>(start));
        start = end;
    }
    acknowledge(m, msgs, acks, acquired_at);
}

void ShareEngine::Impl::run_chunk(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                                  Clock::time_point deadline, std::vector<kafka::Ack>& acks)
{
    // A ledger state per record: a hold (a failure, a give-back) stops that
    // record only, and its failure count makes the attempt its delivery count.
    std::set<TopicPartition> own;
    for (std::size_t i = 0; i < chunk.size(); ++i) {
        auto& it = chunk[i];
        const TopicPartition tp{std::string(it.record.topic), static_cast<std::int32_t>(i)};
        own.insert(tp);
        it.part = &m.ledger.assign(tp);
        if (deliveries[i] > 1)
            m.ledger.inherit_failures(*it.part, {{it.record.offset, deliveries[i] - 1}}, it.record.offset);
    }
    m.intake.decode(chunk, m.first_slot);
    auto& w = m.worker;
    const Holds initial = m.claims.screen(m.intake, w, chunk);
    w.reset(initial);
    // Highest delivery count first (the chunk is in that order): a slow
    // neighbour must not use up the budget of a record on its last delivery,
    // nor of one given back before.
    for (std::size_t i = 0; i < chunk.size(); ++i)
        w.items.push_back(i);
    run_claims(m, chunk, deliveries, deadline);

    settle(m, chunk, deliveries, acks);
    m.ledger.revoke(own);
}

// Each record's acknowledgement once its outcome is known and durable.
void ShareEngine::Impl::settle(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                               std::vector<kafka::Ack>& acks)
{
    const auto& w = m.worker;
    std::vector<Item*> last;
    std::vector<kafka::Ack*> last_acks;
    for (std::size_t i = 0; i < chunk.size(); ++i) {
        auto& it = chunk[i];
        const bool on_last = deliveries[i] >= share_cfg.delivery_limit;
        const bool unfinished = it.state == ItemState::pending && (w.failed || held(w.holds, it));
        if (it.part->dead_letters.acknowledged.count(it.record.offset)) {
            acks[i] = kafka::Ack::reject;
            if (on_last && it.reason == DeadLetterReason::handler_failed)
                share.delivery_limit_dead_letters.add();
            continue;
        }
        if (it.state != ItemState::poison && !unfinished) {
            acks[i] = kafka::Ack::accept; // committed, a duplicate, or skipped by the reconcile hook
            continue;
        }
        acks[i] = kafka::Ack::release; // unless on its last delivery, see last_delivery()
        if (unfinished) {
            const auto h =
                std::find_if(w.holds.begin(), w.holds.end(), [&](const auto& e) { return e.first == it.part; });
            if (!w.failed && h != w.holds.end() && h->second.failures == 0)
                share.budget_given_back.add();
            if (on_last) {
                it.poison(DeadLetterReason::handler_failed,
                          w.abandoned ? "not processed on its last delivery: the consumer was stopped"
                          : w.failed  ? "not processed on its last delivery: the database failed (see the log)"
                          : it.error.empty()
                              ? fmt::format("not processed within the batch budget ({} ms) on its last delivery "
                                            "(delivery_limit {}): a share group would archive it on release",
                                            budget.count(), share_cfg.delivery_limit)
                              : it.error);
                it.attempts = deliveries[i];
            }
        }
        if (on_last) { // a poison record whose dead letter was not acknowledged, or one unfinished
            last.push_back(&it);
            last_acks.push_back(&acks[i]);
        }
    }
    if (!last.empty())
        last_delivery(m, last, last_acks);
}

// ClaimTransaction::run(), again after a database failure (reconnected, after
// a backoff) or an outage the circuit breaker saw, while the budget lasts: an
// outage must not cost the records a delivery. A database failure that
// outlasts the budget stops the member's acquisitions for a backoff.
void ShareEngine::Impl::run_claims(Member& m, std::vector<Item>& chunk, const std::vector<int>& deliveries,
                                   Clock::time_point deadline)
{
    auto& w = m.worker;
    for (;;) {
        if (w.db)
            m.claims.run(w, chunk, deadline);
        else
            w.failed = true;
        if (!w.failed) {
            m.db_backoff.reset();
            metrics.db_commits.add();
            metrics.batch_records.observe(static_cast<double>(w.info.records));
            metrics.claimed.add(w.info.claimed);
            metrics.duplicates.add(w.info.duplicates);
            if (cfg.hooks.after_db_commit)
                cfg.hooks.after_db_commit(w.info); // may throw: nothing of the batch is acknowledged then
            note_outage();
            if (rerun_in_hand(m, chunk, deliveries, deadline))
                continue;
            return;
        }
        if (w.error)
            std::rethrow_exception(w.error);
        if (w.abandoned)
            return; // stop(): released
        if (w.lost_connection)
            w.disconnect();
        const auto wait = m.db_backoff.next();
        if (stop.load() || Clock::now() + wait >= deadline) {
            db_outage(m);
            return; // w.failed: released
        }
        std::this_thread::sleep_for(wait);
        if (!w.db && !ensure_db(m))
            continue; // w.failed stays: tried again after the next backoff
        w.failed = w.lost_connection = w.abandoned = false;
    }
}

// PostgreSQL failed for longer than the batch's budget: its records are
// released (one delivery each, spent when they were acquired), and the
// member acquires nothing until PostgreSQL's backoff is over.
void ShareEngine::Impl::db_outage(Member& m)
{
    if (stop.load())
        return;
    const auto wait = m.db_backoff.upcoming();
    m.db_retry_at = Clock::now() + wait;
    share.outages.add();
    say(log, LogLevel::warning, {},
        "PostgreSQL failed for the whole batch budget ({} ms) of share member {}: an outage; its records are "
        "released, and it acquires nothing for {} ms (then after each failure a longer backoff)",
        budget.count(), m.n, wait.count());
}

// Records on their last delivery that cannot be accepted: a release would
// have the broker archive them without a trace, so they are dead-lettered and
// rejected; one whose dead letter is refused is released anyway (archived),
// loudly.
void ShareEngine::Impl::last_delivery(Member& m, std::vector<Item*>& items, std::vector<kafka::Ack*>& acks)
{
    Holds holds;
    m.dead_letters.send(items, holds);
    for (std::size_t k = 0; k < items.size(); ++k) {
        auto& it = *items[k];
        if (it.state == ItemState::done) {
            *acks[k] = kafka::Ack::reject;
            share.delivery_limit_dead_letters.add();
            say(log, LogLevel::warning, it.log_fields(it.error),
                "{} (event {}) dead-lettered on its last delivery ({} of delivery_limit {}) instead of released: {}",
                it.where(), it.id.to_string(), it.attempts, share_cfg.delivery_limit, it.error);
            continue;
        }
        share.archived_without_dead_letter.add();
        say(log, LogLevel::error, it.log_fields(it.error),
            "{} (event {}) on its last delivery could not be dead-lettered in time: released, and the broker "
            "archives it without a dead letter (recover it from the topic): {}",
            it.where(), it.id.to_string(), it.error);
    }
}

void ShareEngine::Impl::acknowledge(Member& m, const std::vector<const rd_kafka_message_t*>& msgs,
                                    const std::vector<kafka::Ack>& acks, Clock::time_point acquired_at)
{
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        if (!m.kafka->acknowledge(msgs[i], acks[i])) {
            share.acks_refused.add(); // logged by ShareMember; the record comes again when its lock lapses
            continue;
        }
        (acks[i] == kafka::Ack::accept   ? share.accepted
         : acks[i] == kafka::Ack::reject ? share.rejected
                                         : share.released)
            .add();
    }
    const auto refused = m.kafka->commit(std::min(share_cfg.lock_duration, milliseconds(10000)));
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - acquired_at);
    for (const auto& r : refused) {
        share.acks_refused.add();
        say(log, LogLevel::warning,
            error_field(r.error, {{log_field::topic, r.topic}, {log_field::partition, std::to_string(r.partition)}}),
            "acknowledgements of {}/{} refused ({}) after {} ms: a lock lapsed (lock_duration {} ms, batch budget {} "
            "ms) or the broker did not answer; nothing is undone, the records come again and their claims make them "
            "duplicates",
            r.topic.empty() ? "every partition" : r.topic, r.partition, r.error, took.count(),
            share_cfg.lock_duration.count(), budget.count());
    }
}

ShareEngine::ShareEngine(ShareConsumerConfig config, Stage& stage)
{
    config.validate();
    impl_ = std::make_unique<Impl>(std::move(config), stage, stop_);
}

ShareEngine::~ShareEngine() = default;

void ShareEngine::run()
{
    auto& e = *impl_;
    e.start();
    std::unique_ptr<MaintenanceRunner> maintenance;
    if (e.cfg.retention.maintenance)
        maintenance = std::make_unique<MaintenanceRunner>(e.cfg.postgres, e.store, e.cfg.retention, e.log);
    std::unique_ptr<ClaimAgeMonitor> claim_age;
    if (e.cfg.oldest_claim_refresh.count() > 0)
        claim_age = std::make_unique<ClaimAgeMonitor>(
            e.cfg.postgres, e.store, e.cfg.group_id, e.cfg.oldest_claim_refresh, e.metrics.oldest_claim_unix_ms, e.log);
    std::mutex error_mu;
    std::exception_ptr error;
    std::vector<std::thread> threads;
    for (auto& m : e.members)
        threads.emplace_back([&, member = m.get()] {
            try {
                e.member_loop(*member);
            } catch (...) {
                {
                    std::lock_guard<std::mutex> lock(error_mu);
                    if (!error)
                        error = std::current_exception();
                }
                stop_ = true; // the others finish their batches and leave
            }
        });
    for (auto& t : threads)
        t.join();
    say(e.log, LogLevel::info, {}, "share consumer stopped");
    e.members.clear(); // a member that failed leaves without acknowledging: its locks are released
    if (error)
        std::rethrow_exception(error);
}

void ShareEngine::stop() noexcept
{
    stop_ = true;
}

const Metrics& ShareEngine::metrics() const noexcept
{
    return impl_->metrics;
}

const ShareMetrics& ShareEngine::share_metrics() const noexcept
{
    return impl_->share;
}

} // namespace idemkafka::detail
