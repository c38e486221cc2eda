#pragma once
// One pqxx::work kept across the server transactions of a connection.
//
// libpqxx sends BEGIN when a pqxx::work is made and COMMIT when it commits,
// each in a round trip of its own. The claim transaction sends a statement
// at both ends anyway (the claim, the guard's arm), so a work kept for the
// connection's life lets the library send BEGIN in the claim's text and
// COMMIT in the arm's (commit_armed()): two round trips fewer per
// transaction, where a transaction of one record has five. libpqxx still
// sees one open transaction: between the server's transactions it is idle
// (not "idle in transaction"), and the next transaction's first statement
// begins it (begins()). Anything but a commit drops the work (Scope), so
// a failure ends the server's transaction as libpqxx always did, with
// ROLLBACK, and the next transaction gets a new work. Private to the library.

#include <optional>

#include <pqxx/pqxx>

namespace idemkafka::detail::pg {

/// The kept work of one connection. Thread safety: the connection's.
class KeptWork {
public:
    KeptWork() = default;
    KeptWork(const KeptWork&) = delete;
    KeptWork& operator=(const KeptWork&) = delete;
    ~KeptWork() { drop(); }

    /// The work on `conn`, made on first use (libpqxx sends BEGIN then) or
    /// when `conn` is not the work's connection.
    pqxx::work& on(pqxx::connection& conn);
    /// Whether a work is kept.
    bool held() const noexcept { return work_.has_value(); }
    /// True where the kept work's server transaction is not begun (the last
    /// one committed): the text of the transaction's first statement begins
    /// it (BEGIN READ WRITE, see open_for_writes()).
    bool begins() const noexcept;
    /// COMMIT in a round trip of its own; the work stays, its next server
    /// transaction not begun.
    void commit();
    /// The work gone: libpqxx ends its server transaction with ROLLBACK (a
    /// round trip, which warns on the server where none is open; a lost
    /// connection fails it at once, silently).
    void drop() noexcept;

    /// A transaction of the kept work for one scope: unless done() (it
    /// committed), leaving the scope (an exception, an early return) drops
    /// the work, which rolls its server transaction back.
    class Scope {
    public:
        explicit Scope(KeptWork& kept) noexcept : kept_(kept) {}
        Scope(const Scope&) = delete;
        Scope& operator=(const Scope&) = delete;
        ~Scope()
        {
            if (!done_)
                kept_.drop();
        }
        /// The transaction committed: the work stays.
        void done() noexcept { done_ = true; }

    private:
        KeptWork& kept_;
        bool done_ = false;
    };

private:
    std::optional<pqxx::work> work_;
};

} // namespace idemkafka::detail::pg
