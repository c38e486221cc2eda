#pragma once
// The claim transaction: one PostgreSQL transaction per worker and batch
// that claims the records' event ids (INSERT ... ON CONFLICT DO NOTHING),
// runs the handler on the claimed ones, writes the stored positions
// (offsets_in_database) and commits. A failing record is held (or
// dead-lettered) and the rest runs again without its partition's tail.
// Its member functions are defined by concern in src/consumer/claim_*.cpp
// (the list at the top of claim_transaction.cpp); the worker it runs on is
// in worker.hpp. Private to the library.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <pqxx/pqxx>

#include "consumer/dead_letterer.hpp"
#include "consumer/intake.hpp"
#include "consumer/item.hpp"
#include "consumer/member_sessions.hpp"
#include "consumer/worker.hpp"
#include "core/circuit_breaker.hpp"
#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/consumer.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/redact.hpp"
#include "idemkafka/store.hpp"
#include "observe/log_context.hpp"
#include "pg/claims.hpp"
#include "pg/watch.hpp"

namespace idemkafka::detail {

/// How long a step that may wait for row locks (a claim, a position write)
/// may take before its connection is cut: db_timeout plus lock_timeout (zero
/// when db_timeout is: no bound).
inline std::chrono::milliseconds locking_bound(const ConsumerConfig& cfg)
{
    return cfg.db_timeout.count() > 0 ? cfg.db_timeout + cfg.lock_timeout : std::chrono::milliseconds(0);
}

/// How long a consumer's first connection may take over settling the tables
/// at start-up (the schema lock, DDL, a migration) before it is cut: the
/// locking bound, and at least 30 s; db_timeout is meant for the records'
/// transactions, not for DDL on a busy server (zero when db_timeout is: no
/// bound).
inline std::chrono::milliseconds schema_bound(const ConsumerConfig& cfg)
{
    const auto bound = locking_bound(cfg);
    return bound.count() > 0 ? std::max(bound, std::chrono::milliseconds(30000)) : bound;
}

/// Runs `connect` (a consumer's first connections, at start-up) and throws
/// what it threw as ConfigError or DatabaseError, with the secrets of the
/// configuration masked.
template <class Connect> void connect_at_start(const Redactor& secrets, Connect&& connect)
{
    try {
        connect();
    } catch (const ConfigError& e) {
        throw ConfigError(secrets(e.what()));
    } catch (const DatabaseError& e) {
        throw DatabaseError(secrets(e.what()));
    } catch (const std::exception& e) {
        throw DatabaseError(secrets(fmt::format("cannot start: PostgreSQL: {}", e.what())));
    }
}

/// Thrown inside a transaction when the offset table refused our epoch.
struct Fenced {};

class ClaimTransaction {
public:
    /// What the transactions need of the consumer. `forced` tells whether a
    /// stop abandons the current transaction before its next handler call
    /// (Worker::revoked abandons it also right after a handler call returns,
    /// and before COMMIT).
    struct Setup {
        const ConsumerConfig& cfg;
        Stage& stage;
        Metrics& metrics;
        const ProcessedEventStore& store;
        const std::optional<OffsetStore>& offsets;
        PartitionLedger& ledger;
        DeadLetterer& dead_letters;
        /// Tells an outage's handler failures from a record's own.
        Circuit& circuit;
        LogSink log;
        std::function<bool()> forced;
        /// Per-key ordering over several workers: positions are written after the merge.
        bool positions_after_merge;
        /// Records per transaction within a unit, the transactions run back
        /// to back, each COMMIT carrying the next one's claim: 1 with
        /// ConsumerConfig::transaction_per_record, a worker's share of
        /// max_batch with ConsumerConfig::batches_per_unit above 1. Zero:
        /// the unit in one transaction (also the share consumer's and the
        /// handler harness's).
        std::size_t tx_records = 0;
    };

    explicit ClaimTransaction(Setup setup)
        : s_(std::move(setup)), marker_(MemberMarker::of(s_.cfg.schema, s_.cfg.table, s_.cfg.group_id))
    {
    }

    /// On the first connection: the one schema definition
    /// (idemkafka/schema.hpp) is created (ConsumerConfig::create_schema) or,
    /// when a DBA manages it, checked so that a missing table fails now.
    /// Returns the claims table's layout as found.
    RetentionMode settle_schema(pqxx::connection& db) const;

    /// Prepares a worker's new connection: the claim statement, lock_timeout,
    /// (libpqxx 6) read-only by default, and the group's member marker. The
    /// worker's earlier session, when the server still has it (its
    /// connection was lost on this side only), is ended.
    void prepare(Worker& w);

    /// Before a decoded unit's transactions, on the worker that runs them
    /// (the consumer) or the caller's thread: each record is screened by
    /// `intake`, the reconcile hook runs on the worker's connection for
    /// those that need it, and poison records go to the dead letter (waiting
    /// for the broker's acknowledgement). Returns the holds the worker starts
    /// from (records to retry later, dead letters not acknowledged).
    Holds screen(Intake& intake, Worker& w, std::vector<Item>& items);

    /// Runs the worker's transactions over its records of `items` (decoded)
    /// until one commits, the worker's database fails, or the work is
    /// abandoned; the outcome is in the worker. Handler calls after `deadline`
    /// are given back. Never throws for a record's failure.
    void run(Worker& w, std::vector<Item>& items, Clock::time_point deadline);

    /// The reconcile hook for a record beyond the dedup horizon, in its own
    /// transaction on `w`'s connection: skip (claimed, a duplicate), dead
    /// letter, or process; a throwing hook counts as a failure of the record.
    void reconcile(Worker& w, Item& it);

    /// Writes stored positions in `tx`; throws Fenced (after recording the
    /// refused partitions, see take_fenced()) when the table refused our epoch.
    void write_positions(pqxx::transaction_base& tx, const std::vector<OffsetStore::Position>& positions);
    /// Partitions whose position write was refused since the last call.
    std::vector<TopicPartition> take_fenced();

    /// After a lock timeout: ends the sessions of this group's members that
    /// sit idle in a transaction past frozen_member_timeout (a member frozen
    /// with row locks: claims, stored positions), on `w`'s connection;
    /// counted and logged. Never throws.
    void end_frozen_members(pg::Session& w);

    /// Marks `s`'s new session as one of this member's (MemberMarker), so
    /// that other members can end it should this member freeze inside a
    /// transaction on it, and records it as this member's own: never taken
    /// for a frozen member's here, and the session it replaces (a lost
    /// connection the server still keeps) is ended. Once per connection.
    void mark_member(pg::Session& s);

    // The types of one attempt, for the claim_*.cpp files and their tests.

    /// How an attempt (one transaction) ended. claim_again: transact() only,
    /// a claim of ids expected new met a claimed one (optimistic_claims) and
    /// rolled back; attempt() makes it again with ON CONFLICT.
    enum class Outcome { committed, handler_failed, split, conflict, db_failed, abandoned, claim_again };
    /// A failure of record `index`; nobody when no record is to blame (a
    /// conflict at the claim or at COMMIT).
    struct Failure {
        std::size_t index = 0;
        std::string what;
        bool retryable = true;
        bool batch_call = false; // in a batch handler call of several records
    };
    static constexpr std::size_t nobody = SIZE_MAX;

    /// The records of a batch (a worker's are Worker::items) and its time budget.
    struct Batch {
        std::vector<Item>& items;
        Clock::time_point deadline;
    };

    /// What reject_reused() did: records dead-lettered or held for their dead letter.
    struct Reused {
        std::size_t rejected = 0;
        bool held = false; // a dead letter was not acknowledged: its partition is held there
    };

    /// One attempt's records and where it stands.
    struct Attempt {
        // Its records are among the worker's (Worker::items) at positions
        // [from, end): the whole batch, or a transaction's share of it
        // (Setup::tx_records).
        std::size_t from = 0;
        std::size_t end = 0;
        std::vector<EventId> ids;                // to claim, in id order
        std::vector<std::int64_t> fingerprints;  // payload_fingerprint: of ids, in their order
        std::vector<std::size_t> first;          // index of the first pending item per id, in batch order
        std::size_t active = 0;                  // pending records that are not held
        pg::ClaimedIds claimed;                  // the ids the claim took
        std::size_t current = nobody;            // the record whose handler runs
        std::size_t claimed_override = SIZE_MAX; // over the time budget: the claims that stay
    };

    /// What ended a transaction by an exception, so what attempt() does next.
    enum class Fault {
        abandoned,    // a forced stop or a revoke
        replaced,     // a handler ended the transaction and began another
        fenced,       // the offset table refused our epoch
        connection,   // connection lost or COMMIT in doubt
        conflict,     // serialization failure, deadlock, the claim's check violation: run it again
        setup_lost,   // the session lost what prepare() gave it
        lock_timeout, // waited for a lock longer than lock_timeout
        other,        // any other error: rolled back, again after a backoff
    };
    /// A Fault and the error's text.
    struct Classified {
        Fault fault;
        std::string what;
    };

private:
    // Drives attempt() in tests/integration/test_claim_transaction.cpp.
    friend struct ClaimTransactionProbe;

    // The transaction's skeleton (claim_transaction.cpp).
    Outcome attempt(Worker& w, Batch& b, Failure& failure);
    Outcome transact(Worker& w, Batch& b, Attempt& a, Failure& failure);
    Outcome commit(pqxx::work& tx, Worker& w, const Batch& b, const Attempt& a);
    pqxx::result claim(pqxx::transaction_base& tx, const std::vector<EventId>& ids,
                       const std::vector<std::int64_t>& fingerprints, const std::string& before = {},
                       bool as_new = false);
    std::string claim_text(pqxx::transaction_base& tx, const std::vector<EventId>& ids,
                           const std::vector<std::int64_t>& fingerprints, bool as_new = false) const;
    void not_new(Worker& w, const Attempt& a, const std::string& what);
    // Several transactions per unit (Setup::tx_records).
    bool chunked() const { return s_.tx_records != 0; }
    bool any_left(Worker& w, const Batch& b) const;
    bool may_chain(const Worker& w, const Batch& b) const;
    void commit_chained(pqxx::work& tx, Worker& w, const Attempt& next);
    void settle(Worker& w, const Batch& b, const Attempt& a);
    void give_back_rest(Worker& w, Batch& b);
    void end_chain(Worker& w);
    // Handler calls (claim_handler_calls.cpp).
    std::optional<Outcome> call_each(pqxx::work& tx, Worker& w, Batch& b, Attempt& a, Failure& failure);
    void over_budget(pqxx::transaction_base& tx, Worker& w, Batch& b, Attempt& a, std::size_t k, std::size_t handled);
    std::size_t give_back(pqxx::transaction_base& tx, Worker& w, Batch& b, const Attempt& a, std::size_t k);
    std::optional<Outcome> call_gathered(pqxx::work& tx, Worker& w, Batch& b, Attempt& a, Failure& failure);
    template <class Call> bool call_handler(std::size_t blame, Failure& failure, Call&& call);
    bool left_usable(const pqxx::dbtransaction& tx, const Worker& w, std::size_t blame, Failure& failure);
    // A record's failure: retries and the circuit breaker (claim_failures.cpp).
    void handler_failed(Worker& w, Batch& b, const Failure& f);
    void not_counted(Worker& w, Batch& b, const Failure& f, Circuit::Verdict verdict);
    // What ended a transaction early (claim_faults.cpp).
    Outcome recover(const Classified& c, Worker& w, const Attempt& a, Failure& failure);
    Outcome db_error(Worker& w, const std::string& what);
    void lost_connection(Worker& w, const char* why);
    // Reused ids (claim_reuse.cpp).
    Reused reject_reused(pqxx::transaction_base& tx, Worker& w, Batch& b, const Attempt& a);
    // Screening (claim_screen.cpp).
    void reconcile_failed(Item& it, const std::string& where, const std::exception& e);
    // The member lock (member_sessions.cpp).
    void frozen_member_ended(int pid, std::int64_t idle_ms, bool ended, std::chrono::milliseconds stale);
    void end_lost_session(pg::Session& s, const Backend& lost);

    Setup s_;
    std::mutex fenced_mu_;
    std::vector<TopicPartition> fenced_;
    MemberMarker marker_;
    // This member's own sessions: never taken for a frozen member's (see
    // end_frozen_members()); a connection's lost one is ended at its reconnect.
    OwnSessions own_;
};

} // namespace idemkafka::detail
