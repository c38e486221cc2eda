#include "core/ledger.hpp"

#include <algorithm>
#include <charconv>
#include <utility>

namespace idemkafka::detail {
namespace {

constexpr std::string_view failures_tag = "idemkafka.failures=";
constexpr std::size_t failures_metadata_max = 1000; // brokers allow 4096 (offset.metadata.max.bytes)

} // namespace

std::string failures_metadata(const std::map<std::int64_t, int>& failures, std::int64_t from)
{
    std::string out;
    for (auto it = failures.lower_bound(from); it != failures.end(); ++it) {
        if (it->second <= 0)
            continue;
        const std::string entry = std::to_string(it->first) + ':' + std::to_string(it->second);
        if (out.size() + entry.size() + 1 > failures_metadata_max)
            break;
        out += out.empty() ? std::string(failures_tag) : std::string(",");
        out += entry;
    }
    return out;
}

std::map<std::int64_t, int> parse_failures_metadata(std::string_view metadata)
{
    std::map<std::int64_t, int> out;
    if (metadata.substr(0, failures_tag.size()) != failures_tag)
        return out;
    metadata.remove_prefix(failures_tag.size());
    while (!metadata.empty()) {
        const auto comma = metadata.find(',');
        const auto entry = metadata.substr(0, comma);
        const auto colon = entry.find(':');
        std::int64_t offset = -1;
        int failures = 0;
        if (colon != std::string_view::npos) {
            const auto* o = entry.data();
            const auto* c = entry.data() + colon;
            const auto* e = entry.data() + entry.size();
            if (std::from_chars(o, c, offset).ptr == c && std::from_chars(c + 1, e, failures).ptr == e && offset >= 0 &&
                failures > 0)
                out[offset] = failures;
        }
        if (comma == std::string_view::npos)
            break;
        metadata.remove_prefix(comma + 1);
    }
    return out;
}

void Holds::add(PartitionState* ps, std::int64_t offset, int failures, std::chrono::milliseconds wait)
{
    auto [it, fresh] = by_partition_.emplace(ps, Hold{offset, failures, wait});
    if (!fresh) {
        it->second.offset = std::min(it->second.offset, offset);
        it->second.failures = std::max(it->second.failures, failures);
        it->second.wait = std::max(it->second.wait, wait);
    }
}

void Holds::park(PartitionState* ps, std::optional<std::string_view> key, std::int64_t offset, int failures,
                 std::chrono::milliseconds wait)
{
    auto [it, fresh] = by_key_.emplace(std::make_pair(ps, key_id(key)), Hold{offset, failures, wait});
    if (!fresh) {
        it->second.offset = std::min(it->second.offset, offset);
        it->second.failures = std::max(it->second.failures, failures);
        it->second.wait = std::max(it->second.wait, wait);
    }
}

void Holds::merge(const Holds& other)
{
    for (const auto& [ps, h] : other)
        add(ps, h.offset, h.failures, h.wait);
    for (const auto& [pk, h] : other.by_key_)
        park(pk.first, pk.second, h.offset, h.failures, h.wait);
}

bool Holds::covers(const PartitionState* ps, std::int64_t offset) const
{
    auto h = by_partition_.find(ps);
    return h != by_partition_.end() && offset >= h->second.offset;
}

bool Holds::covers(PartitionState* ps, std::int64_t offset, std::optional<std::string_view> key) const
{
    if (covers(ps, offset))
        return true;
    if (by_key_.empty())
        return false;
    auto h = by_key_.find(std::make_pair(ps, key_id(key)));
    return h != by_key_.end() && offset >= h->second.offset;
}

PartitionState& PartitionLedger::assign(const TopicPartition& tp)
{
    PartitionState ps;
    ps.tp = tp;
    auto& slot = parts_[tp];
    ps.unit = slot.unit; // a unit running records of a replaced state still holds the partition
    slot = std::move(ps);
    return slot;
}

void PartitionLedger::revoke(const std::set<TopicPartition>& tps, bool retire)
{
    for (const auto& tp : tps) {
        auto it = parts_.find(tp);
        if (it == parts_.end())
            continue;
        if (retire) {
            it->second.retired = true;
            retired_.push_back(parts_.extract(it)); // a node keeps its element's address
        } else
            parts_.erase(it);
    }
}

PartitionState* PartitionLedger::find(std::string_view topic, std::int32_t partition)
{
    auto it = parts_.find(TopicPartitionView{topic, partition});
    return it == parts_.end() ? nullptr : &it->second;
}

Admission PartitionLedger::admit(PartitionState* ps, std::int64_t offset) noexcept
{
    if (!ps)
        return Admission::foreign;
    if (ps->rewind.resume_from >= 0) {
        if (offset < ps->rewind.resume_from)
            return Admission::stale;
        ps->rewind.resume_from = -1;
        ps->rewind.needs_seek = false;
    }
    if (ps->stored.began_at < 0 || offset < ps->stored.began_at)
        ps->stored.began_at = offset;
    ps->lag.fetched_at = Clock::now();
    return Admission::take;
}

void PartitionLedger::rewind(PartitionState& ps, std::int64_t offset) noexcept
{
    ps.rewind.resume_from = offset;
    ps.rewind.needs_seek = true;
    // What comes again is not finished: the position must not pass it.
    ps.parked.erase(ps.parked.lower_bound(offset), ps.parked.end());
    // Running records from `offset` on come again too: their outcome, when
    // it is merged, must not count (the engine drops them).
    ps.in_flight.erase_from(offset);
    if (ps.processed_next > offset)
        ps.processed_next = offset;
}

std::vector<PartitionLedger::Action> PartitionLedger::apply(const Holds& holds, Clock::time_point now)
{
    std::vector<Action> out;
    for (const auto& [ps, h] : holds) {
        if (!owns(ps))
            continue;
        rewind(*ps, h.offset);
        const auto wait = std::max(h.failures > 0 ? retry_.after(h.failures) : std::chrono::milliseconds(0), h.wait);
        const bool pause = wait.count() > 0;
        if (pause) {
            ps->rewind.paused = true;
            ps->rewind.resume_at = now + wait;
        }
        out.push_back({ps, pause});
    }
    return out;
}

void PartitionLedger::complete(PartitionState& ps, std::int64_t offset)
{
    ps.processed_next = std::max(ps.processed_next, offset + 1);
    ps.parked.erase(offset);
    ps.in_flight.erase(offset);
    ps.stored.fenced = 0;
    forget_failures(ps, offset); // under the lock: workers count failures of the partition's other records
}

void PartitionLedger::trim(PartitionState& ps)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    ps.dead_letters.acknowledged.erase(ps.dead_letters.acknowledged.begin(),
                                       ps.dead_letters.acknowledged.lower_bound(ps.position()));
}

PartitionLedger::Due PartitionLedger::due(Clock::time_point now)
{
    Due out;
    for (auto& [tp, ps] : parts_) {
        if (ps.rewind.needs_seek && ps.rewind.resume_from < 0)
            ps.rewind.needs_seek = false; // the rewound record arrived: the seek happened
        if (ps.rewind.needs_seek)
            out.seek.push_back(&ps);
        if (ps.rewind.paused && now >= ps.rewind.resume_at && !ps.rewind.needs_seek) {
            ps.rewind.paused = false;
            if (std::exchange(ps.stored.retake, false))
                ps.stored.verified = false; // taken over again before it is resumed
            out.resume.push_back(&ps);
        }
    }
    return out;
}

std::optional<std::chrono::milliseconds> PartitionLedger::fence(const TopicPartition& tp, Clock::time_point now)
{
    auto it = parts_.find(tp);
    if (it == parts_.end() || it->second.stored.retake)
        return std::nullopt;
    auto& ps = it->second;
    ++ps.stored.fenced;
    ps.stored.retake = true;
    ps.rewind.paused = true;
    const auto wait = fence_.after(ps.stored.fenced);
    ps.rewind.resume_at = now + wait;
    return wait;
}

std::vector<OffsetCommit> PartitionLedger::take_commits(const std::set<TopicPartition>* only)
{
    std::vector<OffsetCommit> out;
    std::lock_guard<std::mutex> lock(failures_mu_);
    for (auto& [tp, ps] : parts_) {
        if (only && !only->count(tp))
            continue;
        auto position = ps.position();
        if (position < 0 && ps.failures_dirty && ps.lag.start_known)
            position = ps.lag.start_offset; // where it stands: committed before
        if (position < 0 || (position == ps.committed_next && !ps.failures_dirty))
            continue;
        out.push_back({tp, position, failures_metadata(ps.failures, position)});
        ps.committed_next = position;
        ps.failures_dirty = false;
    }
    return out;
}

void PartitionLedger::commit_failed(std::string_view topic, std::int32_t partition, std::int64_t offset)
{
    auto* ps = find(topic, partition);
    if (ps && ps->committed_next == offset) {
        ps->committed_next = -1;
        std::lock_guard<std::mutex> lock(failures_mu_);
        ps->failures_dirty = true; // its failures go again too
    }
}

int PartitionLedger::attempt_of(PartitionState& ps, std::int64_t offset)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    auto f = ps.failures.find(offset);
    return f == ps.failures.end() ? 1 : f->second + 1;
}

int PartitionLedger::count_failure(PartitionState& ps, std::int64_t offset)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    ps.failures_dirty = true;
    return ++ps.failures[offset];
}

void PartitionLedger::forget_failures(PartitionState& ps, std::int64_t offset)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    if (ps.failures.erase(offset))
        ps.failures_dirty = true;
}

std::size_t PartitionLedger::inherit_failures(PartitionState& ps, const std::map<std::int64_t, int>& failures,
                                              std::int64_t from)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    std::size_t n = 0;
    for (auto it = failures.lower_bound(from); it != failures.end(); ++it, ++n) {
        int& mine = ps.failures[it->first];
        mine = std::max(mine, it->second);
    }
    return n;
}

void PartitionLedger::forgive_failures()
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    for (auto& [tp, ps] : parts_)
        if (!ps.failures.empty()) {
            ps.failures.clear();
            ps.failures_dirty = true; // the commit's metadata forgets them too
        }
}

void PartitionLedger::dead_lettered(PartitionState& ps, std::int64_t offset)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    if (ps.failures.erase(offset))
        ps.failures_dirty = true;
    ps.dead_letters.due.erase(offset);
    ps.dead_letters.acknowledged.insert(offset);
}

int PartitionLedger::dead_letter_refused(PartitionState& ps, std::int64_t offset, DeadLetterReason reason,
                                         const std::string& error, int attempts)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    auto& due = ps.dead_letters.due[offset];
    due.reason = reason;
    due.error = error;
    due.attempts = attempts;
    return ++due.refusals;
}

RecordHistory PartitionLedger::history_of(const PartitionState& ps, std::int64_t offset)
{
    std::lock_guard<std::mutex> lock(failures_mu_);
    RecordHistory h;
    if (ps.dead_letters.acknowledged.count(offset)) {
        h.dead_lettered = true;
        return h;
    }
    if (auto d = ps.dead_letters.due.find(offset); d != ps.dead_letters.due.end())
        h.due = d->second;
    if (auto f = ps.failures.find(offset); f != ps.failures.end())
        h.failures = f->second;
    return h;
}

// At most this many noted times per partition: a partition taken far ahead of
// its position (a stuck record, a huge waiting room) forgets the newest, so
// the front, the one that counts, is kept.
constexpr std::size_t max_taken_times = 100000;

void PartitionLedger::note_taken(PartitionState& ps, std::int64_t offset, std::int64_t timestamp_ms)
{
    while (!ps.lag.taken_times.empty() && ps.lag.taken_times.back().first >= offset)
        ps.lag.taken_times.pop_back();
    if (ps.lag.taken_times.size() < max_taken_times)
        ps.lag.taken_times.emplace_back(offset, timestamp_ms);
}

double PartitionLedger::lag_seconds(PartitionState& ps, std::int64_t lag, std::int64_t now_ms)
{
    // Before the first record is processed the position is unknown, and the
    // first record taken is the first unconsumed one.
    const std::int64_t position = ps.position();
    while (!ps.lag.taken_times.empty() && position >= 0 && ps.lag.taken_times.front().first < position)
        ps.lag.taken_times.pop_front();
    if (lag == 0)
        return 0;
    if (ps.lag.taken_times.empty() || (position >= 0 && ps.lag.taken_times.front().first != position) ||
        ps.lag.taken_times.front().second < 0)
        return -1;
    return static_cast<double>(std::max<std::int64_t>(0, now_ms - ps.lag.taken_times.front().second)) / 1000.0;
}

} // namespace idemkafka::detail
