// payload_fingerprint in the claim transaction: after the claim, a record
// whose event id was claimed with another payload is dead-lettered
// (event_id_reused) instead of skipped as a duplicate.

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "consumer/claim_parts.hpp"
#include "consumer/claim_transaction.hpp"
#include "pg/arrays.hpp"
#include "pg/exec.hpp"

namespace idemkafka::detail {

// With payload_fingerprint, after the claim: a record whose event id was
// claimed with another payload (by an earlier transaction, as its stored
// fingerprint says, or by an earlier record of this one) is dead-lettered
// (event_id_reused) instead of skipped as a duplicate. The stored
// fingerprints are read only for the ids that conflicted (committed claims:
// READ COMMITTED shows them to this next statement). The dead letters are
// sent before COMMIT, so a stored position never passes one that was not
// acknowledged.
ClaimTransaction::Reused ClaimTransaction::reject_reused(pqxx::transaction_base& tx, Worker& w, Batch& b,
                                                         const Attempt& a)
{
    std::unordered_map<EventId, PayloadReference> reference;
    std::vector<EventId> conflicted;
    for (std::size_t i : a.first) {
        const auto& it = b.items[i];
        if (a.claimed.contains(it.id))
            reference.emplace(it.id, PayloadReference{fingerprint_of(it), &it});
        else
            conflicted.push_back(it.id);
    }
    if (!conflicted.empty())
        for (const auto& row :
             pg::exec_prepared(tx, fingerprints_statement, s_.cfg.group_id, pg::uuid_array(conflicted)))
            reference.emplace(EventId::parse(row[0].c_str()), PayloadReference{row[1].as<std::int64_t>(), nullptr});
    // This transaction's records only: a later transaction of the unit
    // meets its own in its turn.
    const auto reused = mark_reused(w, b.items, reference, a.from, a.end);
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

std::vector<Item*> mark_reused(const BatchOutcome& w, std::vector<Item>& items,
                               const std::unordered_map<EventId, PayloadReference>& reference, std::size_t from,
                               std::size_t end)
{
    std::vector<Item*> reused;
    for (std::size_t k = from; k < std::min(end, w.items.size()); ++k) {
        auto& it = items[w.items[k]];
        if (!to_run(w.holds, it))
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
    return reused;
}

} // namespace idemkafka::detail
