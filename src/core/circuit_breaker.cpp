#include "core/circuit_breaker.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

namespace idemkafka::detail {
namespace {

// Bounds the memory of a window full of failures (an outage with thousands
// of keys); the oldest go first, which only makes the evidence shorter.
constexpr std::size_t max_failures_kept = 10000;

} // namespace

// ---- the evidence window ----------------------------------------------------

void Circuit::Window::succeeded(std::size_t calls, std::size_t recovered)
{
    successes_ += calls;
    recovered_ += std::min(recovered, calls);
}

Circuit::Clock::time_point Circuit::Window::advance(Clock::time_point now)
{
    if (!window_.empty())
        now = std::max(now, window_.back().at);
    while (!window_.empty() && (window_.front().at < now - s_.window || window_.size() >= max_failures_kept))
        forget_oldest();
    return now;
}

void Circuit::Window::track(std::uint64_t partition, std::uint64_t key, Clock::time_point now)
{
    auto [st, fresh] = streaks_.try_emplace(key);
    if (fresh) {
        const double r = s_.failure_ratio;
        const double place = (1 - r) * static_cast<double>(failures_) - r * static_cast<double>(successes_);
        st->second = Streak{
            partition, failures_, successes_, now, 0, order_.emplace(place, key), partitions_[partition].insert(place)};
    }
    ++st->second.in_window;
    window_.push_back({now, key, failures_, successes_, recovered_});
    ++failures_;
}

void Circuit::Window::forget_oldest()
{
    auto st = streaks_.find(window_.front().key);
    window_.pop_front();
    if (st == streaks_.end() || --st->second.in_window > 0)
        return;
    order_.erase(st->second.order);
    auto p = partitions_.find(st->second.partition);
    p->second.erase(st->second.in_partition);
    if (p->second.empty())
        partitions_.erase(p);
    streaks_.erase(st);
}

void Circuit::Window::clear()
{
    window_.clear();
    streaks_.clear();
    order_.clear();
    partitions_.clear();
}

std::optional<Circuit::Evidence> Circuit::Window::flapping(Clock::time_point now) const
{
    if (window_.empty() || streaks_.size() < s_.min_keys || partitions_.size() < s_.min_partitions)
        return std::nullopt;
    const Failure& oldest = window_.front();
    const auto recovered = recovered_ - oldest.recovered_before;
    const auto successes = successes_ - oldest.successes_before;
    // Of the calls that succeeded since, the share that had failed before:
    // about the chance that a call fails, for records that are not poison.
    if (recovered < s_.min_keys ||
        static_cast<double>(recovered) < s_.failure_ratio / 2 * static_cast<double>(successes))
        return std::nullopt;
    Evidence e;
    e.failures = failures_ - oldest.failures_before;
    e.attempts = e.failures + successes;
    e.keys = streaks_.size();
    e.partitions = partitions_.size();
    e.recovered = recovered;
    e.span = std::chrono::duration_cast<milliseconds>(now - oldest.at);
    return e;
}

std::optional<Circuit::Evidence> Circuit::Window::judge(Clock::time_point now) const
{
    const double r = s_.failure_ratio;
    // Rounding must not turn "exactly the ratio" into "less".
    const double bound = (1 - r) * static_cast<double>(failures_) - r * static_cast<double>(successes_) + 1e-6;
    std::size_t partitions = 0;
    for (auto p = partitions_.begin(); p != partitions_.end() && partitions < s_.min_partitions; ++p)
        partitions += *p->second.begin() <= bound ? 1 : 0;
    if (partitions < s_.min_partitions)
        return std::nullopt;
    // Each key that is evidence failed at least once since the oldest of them
    // began: past max(min_keys, min_attempts) of them both counts are reached.
    std::size_t keys = 0;
    const Streak* first = nullptr;
    for (auto it = order_.begin(); it != order_.end() && it->first <= bound; ++it) {
        const Streak& st = streaks_.at(it->second);
        ++keys;
        if (!first || st.failures_before < first->failures_before)
            first = &st;
        const auto attempts = (failures_ - first->failures_before) + (successes_ - first->successes_before);
        if (keys < s_.min_keys || attempts < s_.min_attempts)
            continue;
        Evidence e;
        e.failures = failures_ - first->failures_before;
        e.attempts = attempts;
        e.keys = keys;
        e.partitions = partitions;
        e.span = std::chrono::duration_cast<milliseconds>(now - first->since);
        return e;
    }
    return std::nullopt;
}

// ---- the probes -------------------------------------------------------------

void Circuit::Probes::failed(std::uint64_t key)
{
    ++tally_.failures;
    ++round_failures_;
    tally_.new_keys += suspects_.insert(key).second ? 1 : 0;
    tally_.repeats += round_.insert(key).second ? 0 : 1; // already failed in this round
}

bool Circuit::Probes::passes(const Tally& t, bool given_up) const
{
    return t.failures > 0 && t.new_keys == 0 &&
           (given_up || ((t.repeats == 0 || t.skipped > 0) && round_failures_ <= limit_));
}

void Circuit::Probes::opened(Keys suspects)
{
    suspects_ = std::move(suspects);
    end_round();
}

Circuit::Keys Circuit::Probes::closed()
{
    end_round();
    return std::exchange(suspects_, Keys{});
}

void Circuit::Probes::end_round()
{
    round_.clear();
    round_failures_ = 0;
}

// ---- the blame --------------------------------------------------------------

void Circuit::Blame::convict(std::uint64_t key)
{
    if (blamed_.count(key) != 0 && convicted_.size() < max_failures_kept)
        convicted_.insert(key);
}

Circuit::Keys Circuit::Blame::take_blamed()
{
    auto blamed = std::exchange(blamed_, Keys{});
    update();
    return blamed;
}

std::pair<std::size_t, std::size_t> Circuit::Blame::blame(Keys suspects)
{
    blamed_ = std::move(suspects);
    if (blamed_.size() > max_failures_kept)
        blamed_.clear(); // bounded; forgetting only makes them evidence again
    std::size_t convicted = 0;
    for (const auto key : blamed_)
        convicted += convicted_.count(key);
    update();
    return {blamed_.size(), convicted};
}

void Circuit::Blame::succeeded_on(const std::vector<std::uint64_t>& keys)
{
    for (const auto key : keys) {
        blamed_.erase(key);
        convicted_.erase(key);
    }
    update();
}

// ---- the circuit ------------------------------------------------------------

Circuit::Circuit(const CircuitBreaker& settings)
    : s_(settings), window_(s_), probes_(s_.probe_records), backoff_(Backoff{settings.backoff, settings.backoff_max})
{
}

void Circuit::succeeded(std::size_t calls, std::size_t recovered)
{
    if (!s_.enabled || calls == 0)
        return;
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::probing)
        probes_.succeeded(calls);
    else if (state_ == State::closed)
        window_.succeeded(calls, recovered);
    // open: a batch that began before the circuit opened, no news
}

Circuit::Verdict Circuit::failed(std::uint64_t partition, std::uint64_t key, std::string_view what,
                                 Clock::time_point now, bool last_attempt)
{
    if (!s_.enabled)
        return Verdict::counted;
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::open)
        return Verdict::outage;
    last_error_.assign(what.data(), what.size());
    if (state_ == State::probing)
        return probe_failed(key, now);
    now = window_.advance(now);
    const bool blamed = blame_.blamed(key);
    std::optional<Evidence> evidence;
    if (blamed && blame_.convicted(key)) {
        // Its failures are its own, not evidence; at its last attempt only
        // a flapping downstream keeps it from the dead-letter topic.
        if (last_attempt)
            evidence = window_.flapping(now);
    } else {
        window_.track(partition, key, now);
        evidence = window_.judge(now);
        if (!evidence && last_attempt)
            evidence = window_.flapping(now);
    }
    if (!evidence || (!last_attempt && blamed))
        return Verdict::counted;
    if (blamed && !blame_.convicted(key))
        window_.for_each_key([this](std::uint64_t k) { blame_.convict(k); });
    open(std::move(*evidence), now);
    return Verdict::outage;
}

Circuit::Verdict Circuit::probe_failed(std::uint64_t key, Clock::time_point now)
{
    probes_.failed(key);
    if (s_.give_up_after.count() > 0 && now - opened_at_ >= s_.give_up_after)
        given_up_ = true;
    return given_up_ ? Verdict::counted : Verdict::probe;
}

void Circuit::open(Evidence evidence, Clock::time_point now)
{
    state_ = State::open;
    opened_at_ = now;
    given_up_ = given_up_told_ = false;
    probes_.opened(blame_.take_blamed()); // suspects again
    window_.for_each_key([this](std::uint64_t key) { probes_.suspect(key); });
    evidence.last_error = last_error_;
    evidence.wait = round_wait_ = backoff_.next();
    probe_at_ = now + evidence.wait;
    opened_ = std::move(evidence);
}

void Circuit::succeeded_on(const std::vector<std::uint64_t>& keys)
{
    if (keys.empty())
        return;
    std::lock_guard<std::mutex> lock(mu_);
    blame_.succeeded_on(keys);
}

void Circuit::skipped(std::size_t records)
{
    if (!s_.enabled || records == 0)
        return;
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::probing)
        probes_.skipped(records);
}

Circuit::milliseconds Circuit::round_wait() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return round_wait_;
}

Circuit::State Circuit::state() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
}

std::optional<Circuit::Evidence> Circuit::take_opened()
{
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(opened_, std::nullopt);
}

bool Circuit::probe_due(Clock::time_point now)
{
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::open || now < probe_at_)
        return false;
    state_ = State::probing;
    probes_.begin();
    return true;
}

Circuit::Probe Circuit::settle_probe(Clock::time_point now)
{
    std::lock_guard<std::mutex> lock(mu_);
    Probe p;
    if (state_ != State::probing)
        return p;
    const auto tally = probes_.take();
    p.successes = tally.successes;
    p.failures = tally.failures;
    p.new_keys = tally.new_keys;
    p.skipped = tally.skipped;
    p.last_error = last_error_;
    p.counted = given_up_;
    p.gave_up = given_up_ && !std::exchange(given_up_told_, true);
    p.open_for = std::chrono::duration_cast<milliseconds>(now - opened_at_);
    if (p.successes > 0) {
        p.outcome = Probe::Outcome::closed;
        state_ = State::closed;
        // A fresh start: the outage's failures must not reopen the circuit
        // at the next failure.
        window_.clear();
        std::tie(p.blamed, p.convicted) = blame_.blame(probes_.closed());
        backoff_.reset();
    } else if (probes_.passes(tally, given_up_)) {
        // Still probing: the next batch goes past them (or, given up, they
        // run out their attempts).
        p.outcome = Probe::Outcome::passed;
    } else if (p.failures > 0) {
        p.outcome = Probe::Outcome::reopened;
        probes_.end_round();
        p.wait = round_wait_ = backoff_.next();
        probe_at_ = now + p.wait;
        state_ = State::open;
    }
    return p;
}

const char* to_string(Circuit::State state) noexcept
{
    switch (state) {
    case Circuit::State::closed:
        return "closed";
    case Circuit::State::open:
        return "open";
    case Circuit::State::probing:
        return "probing";
    }
    return "?";
}

} // namespace idemkafka::detail
