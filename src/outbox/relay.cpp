#include "idemkafka/outbox.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "core/backoff.hpp"
#include "core/fnv1a.hpp"
#include "idemkafka/error.hpp"
#include "kafka/client.hpp"
#include "observe/log_context.hpp"
#include "outbox/row_format.hpp"
#include "pg/arrays.hpp"
#include "pg/bounds.hpp"
#include "pg/connect.hpp"
#include "pg/exec.hpp"
#include "pg/watch.hpp"

namespace idemkafka {
namespace {

using Clock = std::chrono::steady_clock;
using detail::int_array;
using detail::outbox::decode_headers;
using detail::outbox::from_hex;
using detail::outbox::to_hex;
using std::chrono::milliseconds;

void say(const LogSink& log, LogLevel level, std::string line, detail::LogFields fields = {}) noexcept
{
    detail::emit(log, level, std::move(line), "relay", std::move(fields));
}

// What a failed record holds back: its topic and key (the records after it must
// wait), or for a record without a key just that row (no order to keep).
struct HoldKey {
    std::string topic;
    std::optional<std::string> key;
    std::int64_t row = 0;

    friend bool operator<(const HoldKey& a, const HoldKey& b)
    {
        return std::tie(a.topic, a.key, a.row) < std::tie(b.topic, b.key, b.row);
    }
};

struct Hold {
    int attempts = 0;
    Clock::time_point next_try{};
};

struct Row {
    std::int64_t id = 0;
    EventId event_id;
    std::string topic;
    std::optional<std::string> key;
    std::string payload;
    std::vector<Header> headers;
    std::string malformed; // why the row cannot be published, if it cannot

    HoldKey hold_key() const { return key ? HoldKey{topic, key, 0} : HoldKey{topic, std::nullopt, id}; }
};

milliseconds backoff_after(int attempts, const OutboxRelayOptions& o)
{
    return detail::Backoff{o.retry_backoff, o.retry_backoff_max}.after(attempts);
}

// First half of the relay's advisory lock key ("ikob"); the second is a hash of
// the qualified table name.
constexpr std::int32_t outbox_lock_class = 0x696b6f62;

std::int32_t lock_key(std::string_view qualified) noexcept
{
    return static_cast<std::int32_t>(detail::fnv1a(qualified));
}

// The bound of a cycle's transaction: how long it may stand idle, and wait
// for a row lock. A live relay is idle in it only while it waits for the
// broker (at most publish_timeout) and runs its hooks. A relay stopped there
// (SIGSTOP, a paused VM, a lost network) would keep the relay lock, and so
// the whole outbox, from every other relay for as long as it stays stopped;
// past twice the publish wait and 5 s more the server ends its session, and
// the rows it published unmarked go out again from the next active relay.
milliseconds cycle_bound(const OutboxRelayOptions& o)
{
    return 2 * o.publish_timeout + std::chrono::seconds(5);
}

std::string describe_key(const std::optional<std::string>& key)
{
    if (!key)
        return "no key";
    const bool printable = std::all_of(key->begin(), key->end(), [](char c) { return c >= 0x20 && c < 0x7F; });
    if (printable && key->size() <= 64)
        return fmt::format("key \"{}\"", *key);
    return fmt::format("key 0x{}", to_hex(std::string_view(*key).substr(0, 32)));
}

} // namespace

struct OutboxRelay::Impl {
    struct State {
        Redactor secrets; // of the connection string, masked in thrown messages
        detail::pg::Session conn;
        std::map<HoldKey, Hold> held;
        std::string lock_sql;
        std::string fetch_sql;
        std::string mark_sql;
        // Relay thread only.
        milliseconds backoff{0}; // after failed cycles in a row; 0 after a good one
        int failed_cycles = 0;
        bool was_active = false;
        bool purging = false;
        std::size_t purge_batches = 0;
        std::uint64_t purge_total = 0;
        Clock::time_point next_purge{};
    };

    struct Outcome {
        bool active = false;
        std::size_t fetched = 0;
        std::size_t published = 0;
        std::size_t failed = 0;
        bool all_failed = false; // records were sent and none was acknowledged
    };

    Impl(std::string conninfo, Outbox outbox, Publisher* publisher, OutboxRelayOptions options);
    void loop() noexcept;
    void cycle(Outcome& out);
    void cycle_unchecked(Outcome& out);

    // The steps of one cycle, in order.
    struct Verdict {
        std::vector<std::int64_t> mark;       // rows to mark sent
        std::vector<HoldKey> recovered;       // held keys whose row went out
        std::vector<std::size_t> failed_rows; // indexes of rows left unsent
        std::size_t acknowledged = 0;
    };
    std::vector<Row> fetch(pqxx::work& tx, Outcome& out);
    std::vector<std::string> publish(const std::vector<Row>& rows);
    Verdict judge(const std::vector<Row>& rows, const std::vector<std::string>& errors) const;
    void settle(const std::vector<Row>& rows, const std::vector<std::string>& errors, const Verdict& v,
                std::size_t marked, Outcome& out);
    void hold_failed(const std::vector<Row>& rows, const std::vector<std::size_t>& failed_rows, Outcome& out);
    void purge_step();

    std::string conninfo_;
    Outbox outbox_;
    OutboxRelayOptions options_;
    std::unique_ptr<Publisher> owned_publisher_;
    Publisher* publisher_;
    std::unique_ptr<State> state_; // connection and held keys, used under cycle_mutex_
    std::mutex control_mutex_;     // start() and stop()
    std::mutex cycle_mutex_;
    std::mutex mutex_; // stopping_, woken_
    std::condition_variable wake_;
    bool stopping_ = false;
    bool woken_ = false;
    std::atomic<std::uint64_t> published_{0}, failed_{0}, errors_{0}, cycles_{0}, standby_{0}, purged_{0},
        held_keys_{0};
    std::thread thread_;
};

OutboxRelay::Impl::Impl(std::string conninfo, Outbox outbox, Publisher* publisher, OutboxRelayOptions options)
    : conninfo_(std::move(conninfo)), outbox_(std::move(outbox)), options_(std::move(options)), publisher_(publisher),
      state_(std::make_unique<State>())
{
    options_.validate();
    state_->secrets = detail::secrets_of(conninfo_);
    options_.log = detail::with_context(options_.log ? options_.log : stderr_sink(), {}, state_->secrets);
    const std::string& t = outbox_.qualified_name();
    // The lock key is derived from the table, so relays of different outboxes
    // never wait for each other. It is computed here, not by hashtext(), so the
    // isolation level and the lock go in one round trip without parameters.
    state_->lock_sql =
        fmt::format("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; {}; "
                    "SELECT pg_try_advisory_xact_lock({}, {})",
                    detail::pg::bound_transaction(cycle_bound(options_)), outbox_lock_class, lock_key(t));
    state_->fetch_sql =
        fmt::format("SELECT id, event_id, topic, encode(key, 'hex'), encode(payload, 'hex'), encode(headers, 'hex') "
                    "FROM {} o WHERE sent_at IS NULL "
                    "AND NOT (key IS NOT NULL AND (topic, key) IN "
                    "(SELECT h.t, decode(h.k, 'hex') FROM unnest($2::text[], $3::text[]) AS h(t, k))) "
                    "AND NOT (id = ANY($4::bigint[])) "
                    "ORDER BY id LIMIT $1 FOR UPDATE",
                    t);
    state_->mark_sql =
        fmt::format("UPDATE {} SET sent_at = clock_timestamp() WHERE id = ANY($1::bigint[]) AND sent_at IS NULL", t);
}

OutboxRelay::OutboxRelay(std::string conninfo, Outbox outbox, PublisherConfig publisher, OutboxRelayOptions options)
    : impl_(std::make_unique<Impl>(std::move(conninfo), std::move(outbox), nullptr, std::move(options)))
{
    if (!publisher.log)
        publisher.log = impl_->options_.log;
    impl_->owned_publisher_ = std::make_unique<Publisher>(std::move(publisher));
    impl_->publisher_ = impl_->owned_publisher_.get();
}

OutboxRelay::OutboxRelay(std::string conninfo, Outbox outbox, Publisher& publisher, OutboxRelayOptions options)
    : impl_(std::make_unique<Impl>(std::move(conninfo), std::move(outbox), &publisher, std::move(options)))
{
}

OutboxRelay::~OutboxRelay()
{
    stop();
}

std::unique_ptr<OutboxRelay> OutboxRelay::for_consumer(const OutboxConfig& config, const std::string& conninfo,
                                                       const std::string& brokers,
                                                       const std::map<std::string, std::string>& consumer_kafka,
                                                       const LogSink& log)
{
    config.validate();
    OutboxRelayOptions options = config.relay_options;
    if (!options.log)
        options.log = log;
    PublisherConfig pc;
    pc.brokers = brokers;
    // The relay talks to the consumer's cluster, so it needs the same credentials.
    pc.kafka = detail::kafka::connection_settings(consumer_kafka);
    for (const auto& [k, v] : config.kafka)
        pc.kafka[k] = v;
    pc.log = options.log;
    return std::make_unique<OutboxRelay>(conninfo, config.outbox(), std::move(pc), std::move(options));
}

void OutboxRelay::start()
{
    Impl& i = *impl_;
    std::lock_guard<std::mutex> control(i.control_mutex_);
    if (i.thread_.joinable())
        return;
    {
        std::lock_guard<std::mutex> lock(i.mutex_);
        i.stopping_ = false;
    }
    i.thread_ = std::thread([&i] { i.loop(); });
}

void OutboxRelay::stop() noexcept
{
    Impl& i = *impl_;
    std::lock_guard<std::mutex> control(i.control_mutex_);
    {
        std::lock_guard<std::mutex> lock(i.mutex_);
        i.stopping_ = true;
    }
    i.wake_.notify_all();
    i.state_->conn.watch.arm(detail::pg::stop_grace); // a cycle blocked on a frozen server ends
    if (i.thread_.joinable() && i.thread_.get_id() != std::this_thread::get_id())
        i.thread_.join();
}

void OutboxRelay::wake() noexcept
{
    Impl& i = *impl_;
    {
        std::lock_guard<std::mutex> lock(i.mutex_);
        i.woken_ = true;
    }
    i.wake_.notify_all();
}

OutboxRelayStats OutboxRelay::stats() const noexcept
{
    const Impl& i = *impl_;
    OutboxRelayStats s;
    s.published = i.published_.load();
    s.failed = i.failed_.load();
    s.errors = i.errors_.load();
    s.cycles = i.cycles_.load();
    s.standby = i.standby_.load();
    s.purged = i.purged_.load();
    s.held_keys = i.held_keys_.load();
    return s;
}

const Outbox& OutboxRelay::outbox() const noexcept
{
    return impl_->outbox_;
}

namespace {

Row read_row(const pqxx::row& r)
{
    Row row;
    row.id = r[0].as<std::int64_t>();
    row.event_id = EventId::parse(std::string_view(r[1].c_str(), r[1].size()));
    row.topic = r[2].c_str();
    if (!r[3].is_null()) {
        row.key.emplace();
        if (!from_hex(std::string_view(r[3].c_str(), r[3].size()), *row.key))
            row.malformed = "key column is not valid hex";
    }
    if (!from_hex(std::string_view(r[4].c_str(), r[4].size()), row.payload))
        row.malformed = "payload column is not valid hex";
    if (!r[5].is_null()) {
        std::string raw;
        if (!from_hex(std::string_view(r[5].c_str(), r[5].size()), raw) || !decode_headers(raw, row.headers))
            row.malformed = "headers column is not in the outbox header format";
    }
    return row;
}

OutgoingRecord record_of(const Row& row)
{
    OutgoingRecord out;
    out.topic = row.topic;
    out.key = row.key;
    out.value = row.payload;
    out.headers.reserve(row.headers.size() + 1);
    for (const auto& h : row.headers)
        if (h.name != outbox_event_id_header)
            out.headers.push_back(h);
    out.headers.push_back(Header{outbox_event_id_header, row.event_id.to_string()});
    return out;
}

} // namespace

std::size_t OutboxRelay::run_once()
{
    std::lock_guard<std::mutex> lock(impl_->cycle_mutex_);
    Impl::Outcome outcome;
    impl_->cycle(outcome);
    return outcome.published;
}

void OutboxRelay::Impl::cycle(Outcome& out)
{
    State& st = *state_;
    try {
        cycle_unchecked(out);
    } catch (const pqxx::failure& e) {
        // Whatever state the session is in (broken, in doubt), a new one is
        // the safe start for the next cycle; unmarked rows are simply sent again.
        st.conn.disconnect();
        errors_.fetch_add(1);
        throw DatabaseError(
            st.secrets(fmt::format("outbox relay of {}: PostgreSQL: {}", outbox_.qualified_name(), e.what())));
    } catch (...) {
        errors_.fetch_add(1);
        throw;
    }
    if (out.active && options_.hooks.after_cycle) {
        try {
            options_.hooks.after_cycle(out.published, out.failed);
        } catch (...) {
        }
    }
}

void OutboxRelay::Impl::cycle_unchecked(Outcome& out)
{
    State& st = *state_;
    if (!st.conn.db)
        st.conn.connect(conninfo_);
    pqxx::work tx(*st.conn.db);
    // Read committed, so the rows read next reflect every cycle that committed
    // before this one got the lock, whatever the database's default level.
    if (!tx.exec(st.lock_sql)[0][0].as<bool>()) {
        standby_.fetch_add(1);
        return;
    }
    out.active = true;
    cycles_.fetch_add(1);

    const std::vector<Row> rows = fetch(tx, out);
    if (rows.empty()) {
        tx.commit();
        held_keys_.store(st.held.size());
        return;
    }
    const std::vector<std::string> errors = publish(rows);
    const Verdict v = judge(rows, errors);
    if (options_.hooks.after_publish)
        options_.hooks.after_publish(v.acknowledged);
    std::size_t marked = 0;
    if (!v.mark.empty())
        marked = static_cast<std::size_t>(detail::pg::exec_params(tx, st.mark_sql, int_array(v.mark)).affected_rows());
    tx.commit();
    settle(rows, errors, v, marked, out);
}

std::vector<Row> OutboxRelay::Impl::fetch(pqxx::work& tx, Outcome& out)
{
    State& st = *state_;
    // Keys waiting for their retry stay out of the query, so a stuck key never
    // fills the batch and the rest of the outbox goes on.
    const auto now = Clock::now();
    std::vector<std::string> held_topics, held_keys;
    std::vector<std::int64_t> held_rows;
    for (const auto& [k, h] : st.held) {
        if (h.next_try <= now)
            continue;
        if (k.key) {
            held_topics.push_back(k.topic);
            held_keys.push_back(to_hex(*k.key));
        } else {
            held_rows.push_back(k.row);
        }
    }
    const pqxx::result r =
        detail::pg::exec_params(tx, st.fetch_sql, static_cast<std::int64_t>(options_.batch_size),
                                detail::text_array(held_topics), detail::text_array(held_keys), int_array(held_rows));
    out.fetched = r.size();

    // A key whose retry is due sends only its first row: if that fails again,
    // its later rows have not gone out ahead of it.
    std::vector<Row> rows;
    rows.reserve(r.size());
    std::set<HoldKey> seen;
    for (const auto& fields : r) {
        Row row = read_row(fields);
        const HoldKey hk = row.hold_key();
        const bool first_of_key = seen.insert(hk).second;
        if (row.key && !first_of_key && st.held.count(hk))
            continue;
        rows.push_back(std::move(row));
    }
    // Every unsent row of a due key was read (the batch was not full) and none
    // is left: the key's hold is stale (its rows were marked or deleted by hand).
    if (static_cast<std::size_t>(r.size()) < options_.batch_size) {
        for (auto it = st.held.begin(); it != st.held.end();) {
            if (it->second.next_try <= now && !seen.count(it->first))
                it = st.held.erase(it);
            else
                ++it;
        }
    }
    return rows;
}

std::vector<std::string> OutboxRelay::Impl::publish(const std::vector<Row>& rows)
{
    std::vector<std::string> errors(rows.size());
    std::vector<OutgoingRecord> records;
    std::vector<std::size_t> record_row;
    records.reserve(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
        if (!rows[i].malformed.empty()) {
            errors[i] = rows[i].malformed;
            continue;
        }
        records.push_back(record_of(rows[i]));
        record_row.push_back(i);
    }
    if (!records.empty()) {
        auto results = publisher_->publish_all(records, options_.publish_timeout);
        for (std::size_t k = 0; k < results.size(); ++k)
            errors[record_row[k]] = std::move(results[k]);
    }
    return errors;
}

OutboxRelay::Impl::Verdict OutboxRelay::Impl::judge(const std::vector<Row>& rows,
                                                    const std::vector<std::string>& errors) const
{
    // Mark a row only if no earlier row of its key failed in this batch: the
    // ones after a failure went out too, but are sent again after it, so the
    // key's last record on the topic is its newest row.
    const State& st = *state_;
    Verdict v;
    std::set<HoldKey> blocked;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const bool ok = errors[i].empty();
        if (ok)
            ++v.acknowledged;
        const HoldKey hk = rows[i].hold_key();
        if (rows[i].key && blocked.count(hk))
            continue;
        if (ok) {
            v.mark.push_back(rows[i].id);
            if (st.held.count(hk))
                v.recovered.push_back(hk);
        } else {
            v.failed_rows.push_back(i);
            if (rows[i].key)
                blocked.insert(hk);
        }
    }
    return v;
}

void OutboxRelay::Impl::settle(const std::vector<Row>& rows, const std::vector<std::string>& errors, const Verdict& v,
                               std::size_t marked, Outcome& out)
{
    State& st = *state_;
    const std::size_t unacknowledged = rows.size() - v.acknowledged;
    published_.fetch_add(marked);
    failed_.fetch_add(unacknowledged);
    out.published = marked;
    out.failed = unacknowledged;
    // Nothing acknowledged and a failure that is not just a held key's retry:
    // most likely the broker, not a record.
    out.all_failed = v.acknowledged == 0 && std::any_of(v.failed_rows.begin(), v.failed_rows.end(), [&](std::size_t i) {
                         return !st.held.count(rows[i].hold_key());
                     });

    for (const auto& hk : v.recovered) {
        const auto it = st.held.find(hk);
        say(options_.log, LogLevel::info,
            fmt::format("outbox relay of {}: topic {} {} published again after {} failed attempt(s)",
                        outbox_.qualified_name(), hk.topic, describe_key(hk.key), it->second.attempts));
        st.held.erase(it);
    }
    hold_failed(rows, v.failed_rows, out);
    if (v.failed_rows.empty())
        return;
    const Row& first = rows[v.failed_rows.front()];
    const std::string& error = errors[v.failed_rows.front()];
    say(options_.log, LogLevel::error,
        fmt::format("outbox relay of {}: {} of {} record(s) not acknowledged, left unsent for a retry "
                    "({} published); first: row {} (event id {}, topic {}, {}): {}; {} key(s) held back",
                    outbox_.qualified_name(), unacknowledged, rows.size(), marked, first.id, first.event_id.to_string(),
                    first.topic, describe_key(first.key), error, st.held.size()),
        {{log_field::topic, first.topic},
         {log_field::event_id, first.event_id.to_string()},
         {log_field::error, error}});
}

void OutboxRelay::Impl::hold_failed(const std::vector<Row>& rows, const std::vector<std::size_t>& failed_rows,
                                    Outcome& out)
{
    // A failure of the whole batch (broker down) backs off the whole relay;
    // holding every key of the outbox one by one would only grow the hold list.
    // The backoff runs from now, not from the start of a cycle that may have
    // waited long for the broker.
    State& st = *state_;
    const auto failed_at = Clock::now();
    bool capped = false;
    for (std::size_t i : failed_rows) {
        const HoldKey hk = rows[i].hold_key();
        auto it = st.held.find(hk);
        if (it == st.held.end()) {
            if (out.all_failed)
                continue;
            if (st.held.size() >= options_.max_held_keys) {
                capped = true;
                continue;
            }
            it = st.held.emplace(hk, Hold{}).first;
        }
        ++it->second.attempts;
        it->second.next_try = failed_at + backoff_after(it->second.attempts, options_);
    }
    if (capped)
        out.all_failed = true;
    held_keys_.store(st.held.size());
}

void OutboxRelay::Impl::purge_step()
{
    State& st = *state_;
    if (options_.retention.count() == 0)
        return;
    const auto now = Clock::now();
    if (now < st.next_purge)
        return;
    if (!st.purging) {
        st.purging = true;
        st.purge_batches = 0;
        st.purge_total = 0;
    }
    // One batch per call, between cycles: a long purge never delays publishing.
    const OutboxPurgeLimits one{options_.purge_limits.batch, 1, milliseconds(0)};
    std::uint64_t n = 0;
    try {
        std::lock_guard<std::mutex> lock(cycle_mutex_);
        try {
            if (!st.conn.db)
                st.conn.connect(conninfo_);
            n = outbox_.purge_sent(*st.conn.db, options_.retention, one);
        } catch (...) {
            st.conn.disconnect();
            throw;
        }
    } catch (const std::exception& e) {
        st.purging = false;
        st.next_purge = now + options_.purge_interval;
        say(options_.log, LogLevel::warning,
            fmt::format("outbox relay of {}: purge of sent rows failed, next attempt in {} ms: {}",
                        outbox_.qualified_name(), options_.purge_interval.count(), e.what()),
            detail::error_field(e.what()));
        return;
    }
    purged_.fetch_add(n);
    st.purge_total += n;
    ++st.purge_batches;
    if (n < one.batch || st.purge_batches >= options_.purge_limits.max_batches) {
        st.purging = false;
        st.next_purge = now + options_.purge_interval;
        if (st.purge_total > 0)
            say(options_.log, LogLevel::info,
                fmt::format("outbox relay of {}: purged {} sent row(s) older than {} ms{}", outbox_.qualified_name(),
                            st.purge_total, options_.retention.count(),
                            n < one.batch ? "" : "; more remain for the next purge"));
    } else {
        st.next_purge = now + options_.purge_limits.pause;
    }
}

void OutboxRelay::Impl::loop() noexcept
{
    State& st = *state_;
    auto next_backoff = [this, &st] {
        st.failed_cycles = std::min(st.failed_cycles + 1, 64); // past the cap long before: no overflow
        return detail::Backoff{options_.retry_backoff, options_.retry_backoff_max}.after(st.failed_cycles);
    };
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
        woken_ = false;
        lock.unlock();
        milliseconds wait = options_.poll_interval;
        Outcome out;
        try {
            {
                std::lock_guard<std::mutex> cycle_lock(cycle_mutex_);
                cycle(out);
            }
            if (out.all_failed) {
                st.backoff = next_backoff();
                wait = st.backoff;
            } else {
                st.backoff = milliseconds(0);
                st.failed_cycles = 0;
                if (out.fetched >= options_.batch_size)
                    wait = milliseconds(0); // more rows are waiting
            }
            st.was_active = out.active;
        } catch (const std::exception& e) {
            st.backoff = next_backoff();
            wait = st.backoff;
            say(options_.log, LogLevel::error,
                fmt::format("outbox relay of {}: cycle failed, nothing marked sent; retried in {} ms: {}",
                            outbox_.qualified_name(), wait.count(), e.what()),
                detail::error_field(e.what()));
        } catch (...) {
            st.backoff = next_backoff();
            wait = st.backoff;
            say(options_.log, LogLevel::error,
                fmt::format("outbox relay of {}: cycle failed (non-standard exception), nothing marked sent; "
                            "retried in {} ms",
                            outbox_.qualified_name(), wait.count()));
        }
        // Only the active relay purges, so standing-by relays do not repeat its work.
        if (st.was_active)
            purge_step();
        lock.lock();
        if (wait.count() > 0 && !stopping_)
            wake_.wait_for(lock, wait, [&] { return stopping_ || (woken_ && st.backoff.count() == 0); });
    }
}

} // namespace idemkafka
