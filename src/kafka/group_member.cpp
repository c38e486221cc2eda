#include "kafka/group_member.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#include <fmt/format.h>

#include "idemkafka/error.hpp"
#include "kafka/record_of.hpp"

namespace idemkafka::detail::kafka {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::size_t bytes_of(const rd_kafka_message_t& m)
{
    return m.len + m.key_len;
}

PartitionListPtr list_of(const std::vector<std::pair<TopicPartition, std::int64_t>>& offsets)
{
    auto list = make_list(static_cast<int>(offsets.size()));
    for (const auto& [tp, offset] : offsets)
        rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition)->offset = offset;
    return list;
}

} // namespace

// librdkafka's opaque is the Relay's ClientOwner base (see make_client). The
// callbacks other than the log's are served by the thread that polls, while
// the GroupMember lives.
GroupMember& GroupMember::of(void* opaque)
{
    return *static_cast<Relay*>(static_cast<ClientOwner*>(opaque))->consumer;
}

namespace {

// The client's properties before the ones the consumer forces: its fetch
// settings within the prefetch caps' share of librdkafka's queue, then the
// user's kafka map over them.
std::map<std::string, std::string> client_properties(const ConsumerConfig& cfg, std::size_t queue_records,
                                                     std::size_t queue_bytes)
{
    // Every queued record keeps its whole fetch response alive, so the
    // responses in memory are about (queued records / records per response)
    // x fetch.max.bytes: small responses keep that near the queue itself, and
    // measured no slower than larger ones. librdkafka wants fetch.max.bytes >=
    // message.max.bytes (1,000,000).
    const std::size_t fetch_bytes = std::size_t{1} << 20;
    std::map<std::string, std::string> props = {
        {"isolation.level", "read_committed"},
        {"auto.offset.reset", "earliest"},
        {"queued.max.messages.kbytes", std::to_string(std::max<std::size_t>(1, queue_bytes / 1024))},
        {"queued.min.messages", std::to_string(queue_records)},
        {"fetch.max.bytes", std::to_string(fetch_bytes)},
        // A fetch response fills partition by partition: with 1 MiB per
        // partition one partition takes it whole, and the queue holds runs
        // of one partition longer than the round-robin can hold. A sixteenth
        // spreads a response over up to 16 partitions (each still gives at
        // least one whole producer batch, however large).
        {"max.partition.fetch.bytes", std::to_string(fetch_bytes / 16)},
    };
    // Once a prefetch cap is reached, librdkafka before 2.1 looks at the
    // partition again only when its broker thread wakes (up to a second
    // later; FetchWakeup wakes it sooner); 2.1 made that delay a setting,
    // which we shorten.
    if (rd_kafka_version() >= 0x020100ff)
        props["fetch.queue.backoff.ms"] = "20";
    for (const auto& [k, v] : cfg.kafka)
        props[k] = v;
    if (!cfg.kafka.count("fetch.max.bytes") && cfg.kafka.count("message.max.bytes")) {
        // A larger message.max.bytes of the user's must still fit a fetch.
        try {
            const auto max_message = std::stoull(cfg.kafka.at("message.max.bytes"));
            if (max_message > fetch_bytes)
                props["fetch.max.bytes"] = std::to_string(max_message);
        } catch (const std::exception&) {
            // not a number: librdkafka's own error names the property
        }
    }
    return props;
}

} // namespace

GroupMember::GroupMember(const ConsumerConfig& cfg, GroupEvents& events, Metrics& metrics, LogSink sink,
                         const Redactor& secrets)
    : events_(events), metrics_(metrics), secrets_(secrets), log_(std::move(sink)),
      shutdown_timeout_(cfg.shutdown_timeout), caps_(cfg.max_prefetch_records, cfg.max_prefetch_bytes)
{
    relay_->log = log_;
    relay_->consumer = this;
    // The round-robin (see poll()) holds up to half of each prefetch cap,
    // librdkafka's queue the other half: together they stay within the caps.
    auto props = client_properties(cfg, caps_.queue_records(), caps_.queue_bytes());
    // What the member itself reads of the user's settings: the reset policy,
    // max.poll.interval.ms, session.timeout.ms and the group protocol.
    settings_ = GroupSettings(props);
    commit_hold_.configure(settings_.session_timeout(), settings_.consumer_protocol());
    if (const auto warning = client_bug_warning(props, rd_kafka_version()); !warning.empty())
        say(log_, LogLevel::warning, {}, "{}", warning);
    props["bootstrap.servers"] = cfg.brokers;
    props["group.id"] = cfg.group_id;
    props["enable.auto.commit"] = "false";
    props["enable.auto.offset.store"] = "false";
    props["enable.partition.eof"] = "false";
    auto si = props.find("statistics.interval.ms");
    if (si != props.end() && std::strtol(si->second.c_str(), nullptr, 10) > 0)
        stats_.enable();
    rk_ = make_client(
        RD_KAFKA_CONSUMER, props, *relay_,
        [this](rd_kafka_conf_t* conf) {
            rd_kafka_conf_set_rebalance_cb(conf, rebalance_cb);
            rd_kafka_conf_set_offset_commit_cb(conf, commit_cb);
            rd_kafka_conf_set_error_cb(conf, error_cb);
            if (stats_.enabled())
                rd_kafka_conf_set_stats_cb(conf, stats_cb);
        },
        secrets);
    rd_kafka_poll_set_consumer(rk_.get());
    consumer_queue_.reset(rd_kafka_queue_get_consumer(rk_.get()));
    fetch_wakeup_ = std::make_unique<FetchWakeup>(rk_.get());
    if (rd_kafka_version() < 0x020100ff && consumer_queue_)
        wake_pacer_.emplace(
            std::max<std::size_t>(1, std::strtoull(props["queued.min.messages"].c_str(), nullptr, 10) / 2),
            std::strtoull(props["queued.max.messages.kbytes"].c_str(), nullptr, 10) * 512);
    subscribe(cfg);
}

void GroupMember::subscribe(const ConsumerConfig& cfg)
{
    auto topics = make_list(static_cast<int>(cfg.topics.size()));
    for (const auto& t : cfg.topics)
        rd_kafka_topic_partition_list_add(topics.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
    if (auto e = rd_kafka_subscribe(rk_.get(), topics.get()))
        throw KafkaError(fmt::format("subscribe failed: {}", rd_kafka_err2str(e)));
    say(log_, LogLevel::info, {}, "consumer group {} subscribed to {} topic(s)", cfg.group_id, cfg.topics.size());
}

GroupMember::~GroupMember()
{
    forget_queues();       // messages go before their handle
    fetch_wakeup_.reset(); // uses the handle
    consumer_queue_.reset();
    if (rk_) // not closed: the handle must not try the close on its way out
        destroy(RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE, shutdown_timeout_);
}

void GroupMember::destroy(int flags, milliseconds bound) noexcept
{
    rd_kafka_t* rk = rk_.release();
    std::thread t;
    try {
        auto done = std::make_shared<std::promise<void>>();
        auto destroyed = done->get_future();
        t = std::thread([rk, flags, done, relay = relay_] {
            rd_kafka_destroy_flags(rk, flags);
            done->set_value();
        });
        if (destroyed.wait_for(bound) == std::future_status::ready) {
            t.join();
            return;
        }
        say(log_, LogLevel::warning, {},
            "the Kafka client's destruction did not finish within {} ms (what shutdown_timeout left, at least a "
            "second): librdkafka holds the client for an offset commit waiting for the group coordinator (up to "
            "session.timeout.ms); it goes on in the background, and the client's log lines end here",
            bound.count());
        relay_->silence();
        t.detach();
    } catch (...) {
        if (t.joinable())
            t.join();
        else // no thread to be had: destroyed here, however long it takes
            rd_kafka_destroy_flags(rk, flags);
    }
}

// ---- callbacks --------------------------------------------------------------

void GroupMember::rebalance_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                               void* opaque)
{
    of(opaque).on_rebalance(err, parts);
}

void GroupMember::commit_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                            void* opaque)
{
    of(opaque).on_commit(err, offsets);
}

void GroupMember::error_cb(rd_kafka_t*, int err, const char* reason, void* opaque)
{
    of(opaque).on_error(err, reason);
}

int GroupMember::stats_cb(rd_kafka_t*, char* json, size_t len, void* opaque)
{
    of(opaque).on_stats(std::string_view(json, len));
    return 0; // librdkafka frees the text
}

void GroupMember::on_error(int err, const char* reason)
{
    metrics_.kafka_errors.add();
    const auto code = static_cast<rd_kafka_resp_err_t>(err);
    const bool fatal = code == RD_KAFKA_RESP_ERR__FATAL;
    say(log_, fatal ? LogLevel::error : LogLevel::warning,
        {{log_field::component, "librdkafka"}, {"code", rd_kafka_err2name(code)}, {log_field::error, reason}},
        "kafka: {}: {}", rd_kafka_err2name(code), reason);
}

void GroupMember::on_rebalance(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list)
{
    metrics_.rebalances.add();
    settings_.observe_protocol(rd_kafka_rebalance_protocol(rk_.get()));
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS)
        on_assign(list);
    else
        on_revoke(list);
}

void GroupMember::on_assign(rd_kafka_topic_partition_list_t* list)
{
    if (commit_hold_.assigned(Clock::now()))
        say(log_, LogLevel::debug, {}, "rebalance over: offset commits go on");
    std::vector<std::pair<TopicPartition, std::int64_t>> start;
    start.reserve(static_cast<std::size_t>(list->cnt));
    for (int i = 0; i < list->cnt; ++i)
        start.push_back({{list->elems[i].topic, list->elems[i].partition}, RD_KAFKA_OFFSET_INVALID});
    const char* mode = settings_.cooperative() ? "cooperative" : "eager";
    say(log_, LogLevel::info, {}, "assigned {} partition(s) ({})", list->cnt,
        settings_.consumer_protocol() ? "consumer protocol" : mode);
    const bool paused = events_.assigned(start);
    for (int i = 0; i < list->cnt; ++i)
        if (start[static_cast<std::size_t>(i)].second != RD_KAFKA_OFFSET_INVALID)
            list->elems[i].offset = start[static_cast<std::size_t>(i)].second;
    if (settings_.cooperative()) {
        ErrorPtr e(rd_kafka_incremental_assign(rk_.get(), list));
        if (e)
            say(log_, LogLevel::error, error_field(rd_kafka_error_string(e.get())), "incremental assign failed: {}",
                rd_kafka_error_string(e.get()));
    } else if (auto e = rd_kafka_assign(rk_.get(), list)) {
        say(log_, LogLevel::error, error_field(rd_kafka_err2str(e)), "assign failed: {}", rd_kafka_err2str(e));
    }
    // librdkafka keeps an application pause across revoke and assign: a
    // partition paused for a retry backoff before an eager rebalance
    // would stay paused for good, as its new state knows nothing of it.
    if (paused)
        rd_kafka_pause_partitions(rk_.get(), list);
    else
        resume(list);
    for (int i = 0; i < list->cnt; ++i) {
        set_paused(list->elems[i].topic, list->elems[i].partition, paused);
        if (auto* l = find_queue(list->elems[i].topic, list->elems[i].partition))
            l->full = false; // resumed (or paused) above with the rest
    }
}

void GroupMember::on_revoke(rd_kafka_topic_partition_list_t* list)
{
    const bool lost = rd_kafka_assignment_lost(rk_.get());
    commit_hold_.revoked(settings_.cooperative(), lost, Clock::now());
    std::set<TopicPartition> revoked;
    for (int i = 0; i < list->cnt; ++i)
        revoked.insert({list->elems[i].topic, list->elems[i].partition});
    if (lost)
        say(log_, LogLevel::warning, {}, "assignment of {} partition(s) lost; committing nothing for them", list->cnt);
    events_.revoked(revoked, lost);
    drop_queues(revoked);
    if (!lost)
        say(log_, LogLevel::info, {}, "revoked {} partition(s)", list->cnt);
    if (settings_.cooperative()) {
        ErrorPtr e(rd_kafka_incremental_unassign(rk_.get(), list));
        if (e)
            say(log_, LogLevel::error, error_field(rd_kafka_error_string(e.get())), "incremental unassign failed: {}",
                rd_kafka_error_string(e.get()));
    } else {
        rd_kafka_assign(rk_.get(), nullptr);
    }
}

void GroupMember::drop_queues(const std::set<TopicPartition>& revoked)
{
    // Held records of revoked partitions go: their offsets were never
    // committed, so the next owner (or this member, reassigned) reads them.
    const auto before = queues_.size();
    for (auto& l : queues_)
        if (revoked.count({l.topic, l.partition}))
            drop_held(l);
    queues_.erase(std::remove_if(queues_.begin(), queues_.end(),
                                 [&](const Queue& l) {
                                     return revoked.count({l.topic, l.partition}) > 0;
                                 }),
                  queues_.end());
    if (queues_.size() != before)
        next_queue_ = last_queue_ = 0;
}

namespace {

// A commit refused because the group is rebalancing (see commits_held()).
bool rebalancing(rd_kafka_resp_err_t err) noexcept
{
    return err == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS || err == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION;
}

} // namespace

void GroupMember::hold_if_refused(rd_kafka_resp_err_t err)
{
    if (rebalancing(err) && commit_hold_.hold(Clock::now()))
        say(log_, LogLevel::info, {},
            "offset commit refused ({}): the group is rebalancing; offset commits wait for the end of its "
            "rebalance, at most {} ms",
            rd_kafka_err2name(err), commit_hold_.session_timeout().count());
}

bool GroupMember::commits_held() const noexcept
{
    return commit_hold_.held(Clock::now());
}

void GroupMember::on_commit(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list)
{
    commit_hold_.async_answered();
    if (err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return;
    hold_if_refused(err);
    bool failed = err != RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int i = 0; list && i < list->cnt; ++i) {
        const auto& p = list->elems[i];
        if (!p.err && !err)
            continue;
        failed = true;
        hold_if_refused(p.err);
        if (p.err)
            say(log_, LogLevel::warning,
                error_field(rd_kafka_err2str(p.err), coordinates(p.topic, p.partition, p.offset)),
                "offset commit failed for {}: {}", coords(p.topic, p.partition, p.offset), rd_kafka_err2str(p.err));
        events_.commit_failed({p.topic, p.partition}, p.offset);
    }
    if (failed) {
        metrics_.offset_commit_failures.add();
        if (err)
            say(log_, LogLevel::warning, error_field(rd_kafka_err2str(err)),
                "offset commit failed: {} (records already committed in PostgreSQL are deduplicated on redelivery; "
                "the commit is retried)",
                rd_kafka_err2str(err));
    } else {
        metrics_.offset_commits.add();
    }
}

// Statistics are served by the thread that polls the client (ours, through
// rd_kafka_consumer_poll); LatestStats would serve them from librdkafka's own
// threads as safely.
void GroupMember::on_stats(std::string_view json) noexcept
{
    stats_.update(json, Clock::now());
}

// ---- polling ------------------------------------------------------------------

// What librdkafka has ready goes into the queues first (while they are within
// their share of the prefetch caps; each call also serves the callbacks), then
// the next queue's oldest record goes out. Only when no queue has one to give
// does the poll wait: held records of paused partitions never keep it from
// serving a rebalance. What that wait brings is held even past the caps'
// share; a record that cannot go out then (its partition deferred) pauses
// its partition's fetch, or every poll would hold one more for good.
MessagePtr GroupMember::poll(milliseconds timeout)
{
    while (errors_.empty() && caps_.room()) {
        MessagePtr m(rd_kafka_consumer_poll(rk_.get(), 0));
        pulled(m.get());
        if (!m)
            break;
        hold(std::move(m));
    }
    if (!errors_.empty()) {
        auto m = std::move(errors_.front());
        errors_.pop_front();
        return m;
    }
    if (auto m = next_held())
        return m;
    MessagePtr m(rd_kafka_consumer_poll(rk_.get(), static_cast<int>(timeout.count())));
    pulled(m.get());
    if (!m || m->err)
        return m;
    Queue* l = hold(std::move(m));
    if (l && l->deferred && !l->paused && !l->full && !caps_.room())
        pause_full(*l);
    return next_held();
}

// What a poll of librdkafka's queue gave (null: the queue was empty), for the
// WakePacer's runs.
void GroupMember::pulled(const rd_kafka_message_t* m) noexcept
{
    if (!wake_pacer_)
        return;
    if (m)
        wake_pacer_->pulled(bytes_of(*m));
    else
        wake_pacer_->emptied();
}

GroupMember::Queue& GroupMember::queue_of(std::string_view topic, std::int32_t partition)
{
    const auto is = [&](const Queue& l) { return l.partition == partition && l.topic == topic; };
    if (last_queue_ < queues_.size() && is(queues_[last_queue_]))
        return queues_[last_queue_];
    for (std::size_t i = 0; i < queues_.size(); ++i)
        if (is(queues_[i])) {
            last_queue_ = i;
            return queues_[i];
        }
    queues_.push_back(Queue{std::string(topic), partition, false, false, false, 0, {}});
    last_queue_ = queues_.size() - 1;
    return queues_.back();
}

GroupMember::Queue* GroupMember::find_queue(std::string_view topic, std::int32_t partition)
{
    for (auto& l : queues_)
        if (l.partition == partition && l.topic == topic)
            return &l;
    return nullptr;
}

GroupMember::Queue* GroupMember::hold(MessagePtr m)
{
    if (m->err || !m->rkt) {
        errors_.push_back(std::move(m));
        return nullptr;
    }
    caps_.add(bytes_of(*m));
    auto& l = queue_of(rd_kafka_topic_name(m->rkt), m->partition);
    l.held.push_back(std::move(m));
    count_held();
    return &l;
}

void GroupMember::count_held() noexcept
{
    metrics_.prefetched_records.set(static_cast<std::int64_t>(caps_.records()));
    metrics_.prefetched_bytes.set(static_cast<std::int64_t>(caps_.bytes()));
}

// librdkafka's pause drops what its queue holds of the partition (a version
// barrier: nothing fetched before it comes out of a poll) and fetches again,
// on resume, after the last record it handed out: the held ones, which go
// out first. No record is lost or reordered.
void GroupMember::pause_full(Queue& l)
{
    l.full = true;
    l.resume_at = l.held.size() / 2;
    auto list = make_list(1);
    rd_kafka_topic_partition_list_add(list.get(), l.topic.c_str(), l.partition);
    rd_kafka_pause_partitions(rk_.get(), list.get());
    metrics_.prefetch_pauses.add();
    log_full_pause(l);
}

// Once half of what the partition held has gone out (see poll()): its fetch
// resumes while the rest still goes out, so that a fetch that waits behind
// another partition's (up to fetch.wait.max.ms) leaves it idle less often.
// An owner's pause outlives this one: its resume comes from the owner.
void GroupMember::resume_full(Queue& l)
{
    l.full = false;
    if (l.paused)
        return;
    auto list = make_list(1);
    rd_kafka_topic_partition_list_add(list.get(), l.topic.c_str(), l.partition);
    resume(list.get());
}

// librdkafka looks at a resumed partition when its broker's thread wakes: on
// a response, a request to send, or after up to a second (socket.blocking.max.ms,
// whatever the version). With every other partition of that broker paused or
// at its prefetch cap no fetch is under way, and the partition would wait
// for that second; FetchWakeup's request wakes the thread at once.
void GroupMember::resume(rd_kafka_topic_partition_list_t* list)
{
    if (list->cnt == 0)
        return;
    rd_kafka_resume_partitions(rk_.get(), list);
    if (fetch_wakeup_) // gone once the member closes
        fetch_wakeup_->wake();
}

// At most a line every 10 s; it counts the pauses it did not log.
void GroupMember::log_full_pause(const Queue& l)
{
    const auto others = caps_.pause_to_log(Clock::now());
    if (!others)
        return;
    say(log_, LogLevel::info, {{log_field::topic, l.topic}, {log_field::partition, std::to_string(l.partition)}},
        "fetching {}/{} paused: its records wait for its earlier ones to finish, and the {} record(s) ({} bytes) "
        "held fill the consumer's half of max_prefetch_records ({}) or max_prefetch_bytes ({}); it resumes once "
        "half of its {} have gone to processing (prefetch_pauses counts this){}",
        l.topic, l.partition, caps_.records(), caps_.bytes(), caps_.max_records(), caps_.max_bytes(), l.held.size(),
        *others > 0 ? fmt::format("; {} other pause(s) since the last such line", *others) : std::string());
}

MessagePtr GroupMember::next_held()
{
    for (std::size_t n = 0; n < queues_.size(); ++n) {
        const auto i = (next_queue_ + n) % queues_.size();
        auto& l = queues_[i];
        if (l.paused || l.deferred || l.held.empty())
            continue;
        next_queue_ = (i + 1) % queues_.size();
        MessagePtr m = std::move(l.held.front());
        l.held.pop_front();
        caps_.remove(bytes_of(*m));
        count_held();
        if (l.full && l.held.size() <= l.resume_at)
            resume_full(l);
        return m;
    }
    return nullptr;
}

void GroupMember::drop_held(Queue& l)
{
    for (const auto& m : l.held) {
        caps_.remove(bytes_of(*m));
    }
    l.held.clear();
    count_held();
}

// librdkafka's pause drops what its queue holds of the partition and resumes
// fetching after the last record it handed out, which may be held here: held
// records of a paused partition wait for its resume, and go out first then.
// Clearing a flag creates no queue: a partition with none has nothing held
// and no flag set, and may not be assigned any more (a unit of a revoked
// partition merged after the revoke), so its queue would stay for good.
void GroupMember::set_paused(std::string_view topic, std::int32_t partition, bool paused)
{
    if (!paused) {
        if (auto* l = find_queue(topic, partition))
            l->paused = false;
        return;
    }
    queue_of(topic, partition).paused = true;
}

bool GroupMember::held_back(const TopicPartition& tp)
{
    // A partition with no queue has nothing held and no flag set.
    const auto* q = find_queue(tp.topic, tp.partition);
    return q && (q->paused || q->deferred || q->full);
}

void GroupMember::defer(const TopicPartition& tp, bool defer)
{
    if (!defer) {
        if (auto* l = find_queue(tp.topic, tp.partition))
            l->deferred = false;
        return;
    }
    queue_of(tp.topic, tp.partition).deferred = true;
}

void GroupMember::forget_queues()
{
    queues_.clear();
    errors_.clear();
    caps_.clear();
    next_queue_ = last_queue_ = 0;
    count_held();
}

void GroupMember::consumer_error(const rd_kafka_message_t& m)
{
    metrics_.kafka_errors.add();
    const char* topic = m.rkt ? rd_kafka_topic_name(m.rkt) : "";
    say(log_, LogLevel::warning,
        error_field(rd_kafka_message_errstr(&m), m.rkt ? coordinates(topic, m.partition, m.offset) : LogFields{}),
        "kafka consumer error{}{}: {}", m.rkt ? " on " : "",
        m.rkt ? coords(topic, m.partition, m.offset) : std::string(), rd_kafka_message_errstr(&m));
    char reason[512];
    if (rd_kafka_fatal_error(rk_.get(), reason, sizeof reason))
        throw KafkaError(secrets_(fmt::format("fatal Kafka error: {}", reason)));
}

void GroupMember::wake_poll() noexcept
{
    if (consumer_queue_)
        rd_kafka_queue_yield(consumer_queue_.get());
}

void GroupMember::read(const rd_kafka_message_t& m, Record& record)
{
    record = record_of(m);
}

// Called around filling a batch: see WakePacer.
void GroupMember::check_prefetch(bool before_batch, std::size_t batch_records, std::size_t batch_bytes)
{
    if (!wake_pacer_ || !fetch_wakeup_)
        return;
    const auto queued = static_cast<std::size_t>(rd_kafka_queue_length(consumer_queue_.get()));
    if (wake_pacer_->check(before_batch, queued, batch_records, batch_bytes, Clock::now()))
        fetch_wakeup_->wake();
}

// ---- positions --------------------------------------------------------------

GroupMember::SeekResult GroupMember::seek(const TopicPartition& tp, std::int64_t offset)
{
    // Whatever the outcome: records held now were fetched before the seek
    // (after a failed one the seek is sent again).
    if (auto* l = find_queue(tp.topic, tp.partition))
        drop_held(*l);
    auto list = make_list(1);
    rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition)->offset = offset;
    ErrorPtr e(rd_kafka_seek_partitions(rk_.get(), list.get(), 5000));
    // Nothing is held of it any more: a fetch paused for the caps resumes,
    // from the seek's position (as after any seek, a failed one is sent again).
    if (auto* l = find_queue(tp.topic, tp.partition); l && l->full)
        resume_full(*l);
    if (e && rd_kafka_error_code(e.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT) {
        // The call only stopped waiting for the reply: the seek is queued and
        // its version barrier is set, so nothing fetched before it is
        // delivered any more and it takes effect when librdkafka's thread gets
        // to it (before 2.1 a 5000 ms timeout waited 5 ms, so under load this
        // is common). Calling again would only restart the fetch, and a
        // partition paused for a retry backoff, which resumes once the seek
        // is done, would stay paused while calls time out.
        say(log_, LogLevel::debug, coordinates(tp.topic, tp.partition, offset),
            "seek to {} queued; its call timed out waiting for the reply", coords(tp.topic, tp.partition, offset));
        return SeekResult::queued;
    }
    if (e || list->elems[0].err) {
        const char* why = e ? rd_kafka_error_string(e.get()) : rd_kafka_err2str(list->elems[0].err);
        say(log_, LogLevel::warning, error_field(why, coordinates(tp.topic, tp.partition, offset)),
            "seek to {} failed, will retry: {}", coords(tp.topic, tp.partition, offset), why);
        return SeekResult::failed;
    }
    return SeekResult::done;
}

void GroupMember::pause(const TopicPartition& tp, bool pause)
{
    if (auto* l = find_queue(tp.topic, tp.partition); !pause && l && l->full) {
        l->paused = false; // its fetch resumes once half its held records went out
        return;
    }
    auto list = make_list(1);
    rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition);
    if (pause)
        rd_kafka_pause_partitions(rk_.get(), list.get());
    else
        resume(list.get());
    set_paused(tp.topic, tp.partition, pause);
}

void GroupMember::pause_assignment(bool pause, const std::set<TopicPartition>& keep_paused)
{
    rd_kafka_topic_partition_list_t* raw = nullptr;
    if (rd_kafka_assignment(rk_.get(), &raw) != RD_KAFKA_RESP_ERR_NO_ERROR || !raw)
        return;
    PartitionListPtr list(raw);
    if (pause) {
        rd_kafka_pause_partitions(rk_.get(), list.get());
        for (int i = 0; i < list->cnt; ++i)
            set_paused(list->elems[i].topic, list->elems[i].partition, true);
        return;
    }
    auto to_resume = make_list(list->cnt);
    for (int i = 0; i < list->cnt; ++i) {
        const auto& p = list->elems[i];
        if (keep_paused.count({p.topic, p.partition}))
            continue;
        if (auto* l = find_queue(p.topic, p.partition); l && l->full)
            l->paused = false; // its fetch resumes once half its held records went out
        else
            rd_kafka_topic_partition_list_add(to_resume.get(), p.topic, p.partition);
    }
    resume(to_resume.get());
    for (int i = 0; i < to_resume->cnt; ++i)
        set_paused(to_resume->elems[i].topic, to_resume->elems[i].partition, false);
}

void GroupMember::commit(const std::vector<OffsetCommit>& offsets, bool async, milliseconds bound)
{
    if (offsets.empty())
        return;
    auto list = make_list(static_cast<int>(offsets.size()));
    for (const auto& c : offsets) {
        auto* p = rd_kafka_topic_partition_list_add(list.get(), c.tp.topic.c_str(), c.tp.partition);
        p->offset = c.offset;
        if (!c.metadata.empty()) {
            // librdkafka frees it with the list.
            p->metadata = std::malloc(c.metadata.size());
            if (p->metadata) {
                std::memcpy(p->metadata, c.metadata.data(), c.metadata.size());
                p->metadata_size = c.metadata.size();
            }
        }
    }
    if (async)
        commit_hold_.async_sent(Clock::now());
    const auto err = async ? rd_kafka_commit(rk_.get(), list.get(), 1) : commit_and_wait(list.get(), bound);
    if (async && err)
        commit_hold_.async_answered(); // not sent: no answer comes
    if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
        hold_if_refused(err);
        metrics_.offset_commit_failures.add();
        say(log_, LogLevel::warning, error_field(rd_kafka_err2str(err)), "offset commit failed: {}",
            rd_kafka_err2str(err));
        for (const auto& c : offsets)
            events_.commit_failed(c.tp, c.offset);
    }
}

// A synchronous commit, with a bound of our own. While the coordinator is
// unreachable librdkafka holds a commit for session.timeout.ms as the client
// knows it; under group.protocol=consumer that setting is refused and its
// 45 s default applies, so a revoke or a stop would hang that long for a
// commit that is only an optimisation (PostgreSQL holds the effects; a
// redelivery is deduplicated). Its result still reaches on_commit().
rd_kafka_resp_err_t GroupMember::commit_and_wait(rd_kafka_topic_partition_list_t* list, milliseconds bound)
{
    QueuePtr q(rd_kafka_queue_new(rk_.get()));
    if (const auto err = rd_kafka_commit_queue(rk_.get(), list, q.get(), nullptr, nullptr))
        return err;
    const auto until = Clock::now() + bound;
    for (;;) {
        const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
        if (left.count() <= 0) {
            say(log_, LogLevel::warning, {},
                "offset commit of {} partition(s) not confirmed within {} ms (is the group coordinator reachable?); "
                "going on: records already committed in PostgreSQL are deduplicated on redelivery",
                list->cnt, bound.count());
            return RD_KAFKA_RESP_ERR_NO_ERROR; // still pending: not to be sent again yet
        }
        EventPtr ev(rd_kafka_queue_poll(q.get(), static_cast<int>(left.count())));
        if (ev && rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_OFFSET_COMMIT)
            return rd_kafka_event_error(ev.get());
    }
}

bool GroupMember::committed(std::vector<std::pair<TopicPartition, std::int64_t>>& tps, milliseconds timeout)
{
    auto list = list_of(tps);
    if (rd_kafka_committed(rk_.get(), list.get(), static_cast<int>(timeout.count())) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return false;
    for (int i = 0; i < list->cnt; ++i)
        tps[static_cast<std::size_t>(i)].second = list->elems[i].err ? offset_unknown : list->elems[i].offset;
    return true;
}

bool GroupMember::committed(std::vector<OffsetCommit>& tps, milliseconds timeout)
{
    auto list = make_list(static_cast<int>(tps.size()));
    for (const auto& c : tps)
        rd_kafka_topic_partition_list_add(list.get(), c.tp.topic.c_str(), c.tp.partition)->offset = offset_invalid;
    if (rd_kafka_committed(rk_.get(), list.get(), static_cast<int>(timeout.count())) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return false;
    for (int i = 0; i < list->cnt; ++i) {
        const auto& p = list->elems[i];
        auto& c = tps[static_cast<std::size_t>(i)];
        c.offset = p.err ? offset_unknown : p.offset;
        c.metadata =
            p.metadata && !p.err ? std::string(static_cast<const char*>(p.metadata), p.metadata_size) : std::string();
    }
    return true;
}

std::pair<std::int64_t, std::int64_t> GroupMember::watermarks(const TopicPartition& tp)
{
    std::int64_t lo = -1, hi = -1;
    rd_kafka_get_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &lo, &hi);
    return {lo, hi};
}

std::optional<std::pair<std::int64_t, std::int64_t>> GroupMember::query_watermarks(const TopicPartition& tp,
                                                                                   milliseconds timeout)
{
    std::int64_t lo = -1, hi = -1;
    if (rd_kafka_query_watermark_offsets(rk_.get(), tp.topic.c_str(), tp.partition, &lo, &hi,
                                         static_cast<int>(timeout.count())) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return std::nullopt;
    return std::make_pair(lo, hi);
}

std::map<TopicPartition, StatsEntry> GroupMember::statistics()
{
    return stats_.snapshot();
}

// Leaves the group and destroys the handle within `bound`.
// rd_kafka_consumer_close() waits for pending offset commits and for the group
// leave as long as the coordinator cannot be reached (two minutes and more,
// under either group protocol). Past the bound the handle goes without the
// close: the broker drops the member after its session timeout, as after a
// crash, and the new owners' redeliveries are deduplicated.
void GroupMember::close(milliseconds bound)
{
    if (!rk_)
        return;
    fetch_wakeup_.reset();   // uses the handle
    consumer_queue_.reset(); // before the close
    forget_queues();         // held records are not processed: not committed, they come again
    QueuePtr q(rd_kafka_queue_new(rk_.get()));
    ErrorPtr e(rd_kafka_consumer_close_queue(rk_.get(), q.get()));
    bool closed = !e;
    if (e)
        say(log_, LogLevel::warning, error_field(rd_kafka_error_string(e.get())), "consumer close: {}",
            rd_kafka_error_string(e.get()));
    const auto until = Clock::now() + bound;
    while (closed && !rd_kafka_consumer_closed(rk_.get())) {
        const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
        if (left.count() <= 0) {
            say(log_, LogLevel::warning, {},
                "leaving the consumer group did not finish within shutdown_timeout ({} ms; is the group coordinator "
                "reachable?); closing without it: the broker drops this member after its session timeout",
                bound.count());
            closed = false;
            break;
        }
        // The close's own events: the last revoke (served by on_rebalance, as
        // rd_kafka_consumer_close() would call the callback) and the results
        // of commits still pending.
        EventPtr ev(rd_kafka_queue_poll(q.get(), static_cast<int>(std::min<long long>(left.count(), 100))));
        if (!ev)
            continue;
        if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_REBALANCE)
            on_rebalance(rd_kafka_event_error(ev.get()), rd_kafka_event_topic_partition_list(ev.get()));
        else if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_OFFSET_COMMIT)
            on_commit(rd_kafka_event_error(ev.get()), rd_kafka_event_topic_partition_list(ev.get()));
        else if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_ERROR)
            on_error(rd_kafka_event_error(ev.get()), rd_kafka_event_error_string(ev.get()));
    }
    q.reset();
    // Without a close the handle must not try it again on its way out.
    destroy(closed ? 0 : RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE,
            std::max(milliseconds(1000), std::chrono::duration_cast<milliseconds>(until - Clock::now())));
}

} // namespace idemkafka::detail::kafka
