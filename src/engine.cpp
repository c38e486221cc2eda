#include "idemkafka/detail/engine.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "claim_age.hpp"
#include "idemkafka/dead_letter.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/offset_store.hpp"
#include "idemkafka/schema.hpp"
#include "idemkafka/outbox.hpp"
#include "idemkafka/publisher.hpp"
#include "idemkafka/redact.hpp"
#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"
#include "kafka/client.hpp"
#include "kafka/fetch_wakeup.hpp"
#include "kafka/stats.hpp"
#include "lane_pool.hpp"
#include "log_context.hpp"
#include "pg/exec.hpp"
#include "pg/tx_guard.hpp"

namespace idemkafka::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr const char* claim_statement = "idemkafka_claim";
constexpr milliseconds idle_poll{100};
constexpr milliseconds db_backoff_min{100};
constexpr milliseconds db_backoff_max{5000};

struct TopicPartition {
    std::string topic;
    std::int32_t partition;
    friend bool operator<(const TopicPartition& a, const TopicPartition& b)
    {
        return a.partition != b.partition ? a.partition < b.partition : a.topic < b.topic;
    }
};

std::string coords(std::string_view topic, std::int32_t partition, std::int64_t offset)
{
    return fmt::format("{}/{}@{}", topic, partition, offset);
}

milliseconds backoff_for(int failures, milliseconds base, milliseconds cap)
{
    auto d = base;
    for (int i = 1; i < failures && d < cap; ++i)
        d *= 2;
    return std::min(d, cap);
}

// Thrown inside the batch transaction to abandon it on a forced stop.
struct Abandon {};
// Thrown inside the batch transaction when the offset table refused our epoch.
struct Fenced {};

} // namespace

struct Engine::Impl {
    enum class State { pending, poison, done };  // poison: to be dead-lettered

    struct PartitionState {
        std::int64_t processed_next = -1;  // next offset after the last processed record
        std::int64_t committed_next = -1;  // last next-offset handed to an offset commit
        std::int64_t resume_from = -1;     // after a rewind, drop records until this offset
        std::int64_t start_offset = -1;    // committed offset at assignment (for the lag gauge)
        bool start_known = false;
        Clock::time_point assigned_at = Clock::now(); // statistics from before are of an earlier owner
        std::size_t lane = 0;             // worker that runs this partition's transactions
        std::int64_t epoch = 0;           // offsets_in_database: our ownership epoch
        bool position_verified = true;    // offsets_in_database: stored position applied
        bool needs_seek = false;
        bool retry_paused = false;
        int fenced = 0;                   // offsets_in_database: position writes refused in a row
        bool retake = false;              // take the partition over again when the pause ends
        Clock::time_point resume_at{};
        std::map<std::int64_t, int> failures;  // handler failures by offset
        // Dead letters of this assignment: acknowledged ones are not written
        // again when the partition is rewound behind them; refused ones are
        // tried again, with a growing backoff, before anything else is done
        // with their records (the handler does not run again).
        std::set<std::int64_t> dead_lettered;
        struct DeadLetterDue {
            DeadLetterReason reason;
            std::string error;
            int attempts;
            int refusals;
        };
        std::map<std::int64_t, DeadLetterDue> dead_letter_due;
    };

    struct Item {
        kafka::MessagePtr msg;
        Record record;
        EventId id;
        State state = State::pending;
        PartitionState* part = nullptr;
        DeadLetterReason reason = DeadLetterReason::decode_error;
        std::string error;
        bool key_window_open = true;
        bool reconcile = false;   // beyond the dedup horizon: the reconcile hook decides
        bool retry_later = false; // held for another try before any transaction
        std::size_t slot = 0;     // of the decoded event in its Stage bank
        int attempts = -1;        // for the dead letter; -1: from the failure count
        int retry_failures = 0;   // with retry_later: failures so far, for the backoff
    };

    // Where a partition must stop in this batch: records from `offset` on are
    // not committed and come again after a rewind (and a backoff for
    // `failures` > 0).
    struct Hold {
        std::int64_t offset;
        int failures;
    };
    using Holds = std::map<PartitionState*, Hold>;

    static void add_hold(Holds& holds, PartitionState* ps, std::int64_t offset, int failures)
    {
        auto [it, fresh] = holds.emplace(ps, Hold{offset, failures});
        if (!fresh) {
            it->second.offset = std::min(it->second.offset, offset);
            it->second.failures = std::max(it->second.failures, failures);
        }
    }

    static bool held(const Holds& holds, const Item& it)
    {
        auto h = holds.find(it.part);
        return h != holds.end() && it.record.offset >= h->second.offset;
    }

    // A worker: one PostgreSQL connection and, per batch, its share of the records.
    struct Lane {
        std::unique_ptr<pqxx::connection> db;
        std::vector<std::size_t> items; // indices into `running`, in batch order
        Holds holds;
        BatchInfo info;
        bool failed = false;            // nothing of this lane's final transaction committed
        bool lost_connection = false;
        bool abandoned = false;
        bool fenced = false;            // the offset table refused our epoch: we lost a partition
        bool one_by_one = false;        // batch handler: one call per record (after a failed batch call)
        std::vector<std::size_t> call_items; // batch handler: the records of the call
        std::vector<std::size_t> call_slots; // and their Stage slots
        std::vector<Context> call_contexts;
        std::exception_ptr error;       // an unexpected exception, rethrown on the poll thread
    };

    ConsumerConfig cfg;
    Stage& stage;
    Redactor secrets; // of the configuration: masked in every log record and thrown message
    LogSink log;
    Metrics metrics;
    ProcessedEventStore store;
    std::atomic<int> stop_requests{0};
    static_assert(std::atomic<int>::is_always_lock_free, "stop() must be async-signal-safe");

    kafka::HandlePtr rk;
    // librdkafka before 2.1 only: wakes the fetchers once the prefetch queue
    // is down to half its caps after it had filled (see FetchWakeup).
    std::unique_ptr<kafka::FetchWakeup> fetch_wakeup;
    std::size_t wake_below_records = 0;
    std::size_t wake_below_bytes = 0;
    std::size_t fill_bytes = 0;   // payload and key bytes taken by the last fill_batch()
    std::size_t record_bytes = 0; // their mean per record, to estimate the queue's bytes
    bool wake_armed = false;
    Clock::time_point next_wake{};
    bool cooperative = false;
    // group.protocol=consumer (KIP-848): the broker assigns, and every
    // rebalance is incremental, whatever rd_kafka_rebalance_protocol() says
    // before the first subscription or while the consumer closes.
    bool consumer_protocol = false;
    std::map<TopicPartition, PartitionState> parts;
    // The batch being polled and decoded, and the one the workers process
    // (pipeline: both at once). The poll thread touches `running` and the
    // lanes only after finish_running(). `running` is empty when no batch is
    // in the workers' hands.
    std::vector<Item> batch;
    std::vector<Item> running;
    bool pipelined = false; // ConsumerConfig::pipeline, when it applies
    std::atomic<bool> running_done{false};
    std::atomic<bool> polling{false}; // the poll thread is in (or about to enter) a poll
    std::size_t fill_bank = 0; // Stage bank `batch` decodes into
    std::size_t run_bank = 0;  // Stage bank of `running`
    kafka::QueuePtr consumer_queue; // to wake a poll when the running batch is done
    std::exception_ptr deferred_error; // thrown in a rebalance callback, rethrown after the poll

    std::string dlq_topic = cfg.effective_dead_letter_topic();
    bool reset_to_latest = false; // auto.offset.reset, for the lag of a partition without commits
    std::mutex dlq_mu;
    std::unique_ptr<Publisher> dlq; // created on the first dead letter

    std::optional<OffsetStore> offset_store; // offsets_in_database
    RetentionMode layout = cfg.retention.mode; // of the claims table as found at start-up
    std::optional<HorizonGuard> guard;
    std::unique_ptr<MaintenanceRunner> maintenance;
    std::unique_ptr<OutboxRelay> outbox_relay;
    std::vector<Lane> lanes;
    std::unique_ptr<LanePool> pool;
    std::mutex failures_mu; // PartitionState::failures, shared by lanes in per-key mode
    std::mutex fenced_mu;
    std::vector<TopicPartition> fenced_parts; // refused position writes, not handled yet
    std::size_t next_lane = 0;
    Clock::time_point batch_deadline{}; // time budget of the current batch
    milliseconds batch_budget{120000};
    Clock::time_point db_retry_at{};
    Clock::time_point next_commit_at{};                // commit_interval: earliest next offset commit
    std::optional<Clock::time_point> uncommitted_since; // first PostgreSQL commit not yet sent to Kafka
    milliseconds db_backoff = db_backoff_min;
    bool db_pause = false;

    // Per-partition figures of the latest librdkafka statistics event.
    struct StatsEntry {
        kafka::PartitionStats stats;
        Clock::time_point at;
    };
    bool stats_enabled = false; // statistics.interval.ms > 0
    std::mutex stats_mu;
    std::map<TopicPartition, StatsEntry> stats;
    std::unique_ptr<ClaimAgeMonitor> claim_age;

    Impl(ConsumerConfig c, Stage& s)
        : cfg(std::move(c)), stage(s), secrets(secrets_of(cfg.postgres, {&cfg.kafka, &cfg.dead_letter_kafka,
                                                                         cfg.outbox ? &cfg.outbox->kafka : nullptr})),
          log(with_context(cfg.log ? cfg.log : stderr_sink(), {{log_field::group, cfg.group_id}}, secrets)),
          store(cfg.schema, cfg.table)
    {
        if (cfg.offsets_in_database)
            offset_store.emplace(cfg.schema, cfg.offsets_table);
    }

    template <class... Args>
    void say(LogLevel level, fmt::format_string<Args...> f, Args&&... args) noexcept
    {
        say(level, LogFields{}, f, std::forward<Args>(args)...);
    }

    // With the fields known at the call site; component "consumer" unless they name one.
    template <class... Args>
    void say(LogLevel level, LogFields fields, fmt::format_string<Args...> f, Args&&... args) noexcept
    {
        try {
            emit(log, level, fmt::format(f, std::forward<Args>(args)...), "consumer", std::move(fields));
        } catch (...) {
        }
    }

    static LogFields error_field(std::string_view error, LogFields fields = {})
    {
        fields.push_back({log_field::error, std::string(error)});
        return fields;
    }

    // A line about one record: its coordinates, event id and error.
    static LogFields about(const Item& it, std::string_view error = {})
    {
        auto fields = coordinates(it.record.topic, it.record.partition, it.record.offset);
        if (!it.id.is_nil())
            fields.push_back({log_field::event_id, it.id.to_string()});
        return error.empty() ? fields : error_field(error, std::move(fields));
    }

    std::atomic<Clock::rep> stop_seen{0};
    Clock::time_point next_lag_update{};
    bool no_commit = false;  // set when run() leaves by an exception: commit nothing more

    // A second stop(), or a first one older than shutdown_timeout, abandons
    // the current transaction.
    bool forced() noexcept
    {
        const int stops = stop_requests.load();
        if (stops >= 2)
            return true;
        if (stops == 0)
            return false;
        const auto now = Clock::now().time_since_epoch().count();
        Clock::rep seen = 0;
        stop_seen.compare_exchange_strong(seen, now);
        seen = stop_seen.load();
        return Clock::duration(now - seen) >= cfg.shutdown_timeout;
    }

    ~Impl()
    {
        // run() left by an exception, maybe with a batch in the workers' hands:
        // let it end, and take nothing of it (committing nothing is always safe).
        if (pool)
            pool->wait();
        batch.clear();
        running.clear();
        fetch_wakeup.reset();
        consumer_queue.reset();
        if (rk) {
            // run() left by an exception: leave the group without committing
            // anything, as a crash would (but without the session timeout).
            no_commit = true;
            close_consumer();
        }
    }

    // ---- PostgreSQL -------------------------------------------------------

    // One connection per lane; the schema is created once, by the first.
    void connect_lane(Lane& lane, bool first)
    {
        lane.db = std::make_unique<pqxx::connection>(cfg.postgres);
        // The one schema definition (idemkafka/schema.hpp): created here, or,
        // when a DBA manages it, checked so that a missing table fails now.
        if (first && cfg.create_schema)
            layout = migrate_schema(*lane.db, SchemaSpec::of(cfg), Maintenance::Existing::keep, log).claims.mode;
        else if (first)
            layout = require_schema(*lane.db, SchemaSpec::of(cfg)).front().mode;
        if (first && !guard) {
            // The guard follows the table's real layout: a plain table kept from
            // before has no reason to refuse non-v7 ids.
            auto g = cfg.retention;
            g.mode = layout;
            guard.emplace(g);
        }
        lane.db->prepare(claim_statement, store.claim_sql());
        pg::set_session(*lane.db, "lock_timeout", std::to_string(cfg.lock_timeout.count())); // ms
        pg::guard_session(*lane.db);
    }

    // Returns true when PostgreSQL can take transactions now; otherwise the
    // assignment stays paused until the backoff has passed (and, after a lost
    // connection, a reconnect succeeded).
    bool ensure_db()
    {
        if (Clock::now() < db_retry_at)
            return false;
        for (std::size_t i = 0; i < lanes.size(); ++i) {
            auto& lane = lanes[i];
            if (lane.db)
                continue;
            try {
                connect_lane(lane, false);
                metrics.db_reconnects.add();
                say(LogLevel::info, "reconnected to PostgreSQL (worker {})", i);
            } catch (const std::exception& e) {
                lane.db.reset();
                say(LogLevel::warning, error_field(e.what()), "PostgreSQL reconnect failed, next attempt in {} ms: {}",
                    db_backoff.count(), e.what());
                db_hold();
                return false;
            }
        }
        if (offset_store) {
            verify_positions();
            for (const auto& [tp, ps] : parts)
                if (!ps.position_verified) {
                    db_hold();
                    return false;
                }
        }
        db_backoff = db_backoff_min;
        if (db_pause)
            set_db_pause(false);
        return true;
    }

    // Pauses the whole assignment for the current backoff, then doubles it.
    void db_hold()
    {
        db_retry_at = Clock::now() + db_backoff;
        db_backoff = std::min(db_backoff * 2, db_backoff_max);
        if (!db_pause)
            set_db_pause(true);
    }

    // ---- Kafka ------------------------------------------------------------

    static void rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                             void* opaque)
    {
        static_cast<Impl*>(opaque)->on_rebalance(rk, err, parts);
    }

    static void commit_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                          void* opaque)
    {
        static_cast<Impl*>(opaque)->on_commit(err, offsets);
    }

    static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque)
    {
        auto* self = static_cast<Impl*>(opaque);
        self->metrics.kafka_errors.add();
        const auto code = static_cast<rd_kafka_resp_err_t>(err);
        const bool fatal = code == RD_KAFKA_RESP_ERR__FATAL;
        self->say(fatal ? LogLevel::error : LogLevel::warning,
                  {{log_field::component, "librdkafka"}, {"code", rd_kafka_err2name(code)}, {log_field::error, reason}},
                  "kafka: {}: {}", rd_kafka_err2name(code), reason);
        (void)rk;
    }

    static void log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf)
    {
        auto* self = static_cast<Impl*>(rd_kafka_opaque(rk));
        const LogLevel l = level <= 3 ? LogLevel::error : level == 4 ? LogLevel::warning
                                                     : level <= 6     ? LogLevel::info
                                                                      : LogLevel::debug;
        self->say(l, {{log_field::component, "librdkafka"}, {"facility", fac}}, "rdkafka {}: {}", fac, buf);
    }

    void create_consumer()
    {
        // Every queued record keeps its whole fetch response alive, so the
        // responses in memory are about (queued records / records per
        // response) x fetch.max.bytes: small responses keep that near the
        // queue itself, and measured no slower than larger ones. librdkafka
        // wants fetch.max.bytes >= message.max.bytes (1,000,000).
        const std::size_t fetch_bytes = 1024 * 1024;
        std::map<std::string, std::string> props = {
            {"isolation.level", "read_committed"},
            {"auto.offset.reset", "earliest"},
            {"queued.max.messages.kbytes", std::to_string(std::max<std::size_t>(1, cfg.max_prefetch_bytes / 1024))},
            {"queued.min.messages", std::to_string(cfg.max_prefetch_records)},
            {"fetch.max.bytes", std::to_string(fetch_bytes)},
            {"max.partition.fetch.bytes", std::to_string(fetch_bytes)},
        };
        // Once a prefetch cap is reached, librdkafka before 2.1 looks at the
        // partition again only when its broker thread wakes (up to a second
        // later; FetchWakeup wakes it sooner); 2.1 made that delay a
        // setting, which we shorten.
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
        reset_to_latest = props["auto.offset.reset"] == "latest" || props["auto.offset.reset"] == "largest" ||
                          props["auto.offset.reset"] == "end";
        if (cfg.max_batch_duration.count() > 0) {
            batch_budget = cfg.max_batch_duration;
        } else {
            // 40% of max.poll.interval.ms: a batch ends well before the group
            // would drop this member for not polling.
            long interval = 300000;
            auto mp = props.find("max.poll.interval.ms");
            if (mp != props.end())
                interval = std::strtol(mp->second.c_str(), nullptr, 10);
            batch_budget = milliseconds(std::max(100L, interval * 2 / 5));
        }
        {
            auto gp = props.find("group.protocol");
            std::string protocol = gp == props.end() ? "" : gp->second;
            for (auto& c : protocol)
                c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            consumer_protocol = protocol.find("consumer") != std::string::npos; // validate() allows only the two
            cooperative = consumer_protocol;
        }
        props["bootstrap.servers"] = cfg.brokers;
        props["group.id"] = cfg.group_id;
        props["enable.auto.commit"] = "false";
        props["enable.auto.offset.store"] = "false";
        props["enable.partition.eof"] = "false";
        auto conf = kafka::make_conf(props);
        rd_kafka_conf_set_opaque(conf.get(), this);
        rd_kafka_conf_set_rebalance_cb(conf.get(), rebalance_cb);
        rd_kafka_conf_set_offset_commit_cb(conf.get(), commit_cb);
        rd_kafka_conf_set_error_cb(conf.get(), error_cb);
        rd_kafka_conf_set_log_cb(conf.get(), log_cb);
        auto si = props.find("statistics.interval.ms");
        stats_enabled = si != props.end() && std::strtol(si->second.c_str(), nullptr, 10) > 0;
        if (stats_enabled)
            rd_kafka_conf_set_stats_cb(conf.get(), stats_cb);

        char err[512];
        rk.reset(rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), err, sizeof err));
        if (!rk)
            throw KafkaError(secrets(fmt::format("cannot create Kafka consumer: {}", err)));
        conf.release(); // owned by rk now
        rd_kafka_poll_set_consumer(rk.get());
        consumer_queue.reset(rd_kafka_queue_get_consumer(rk.get()));
        if (rd_kafka_version() < 0x020100ff && consumer_queue) {
            wake_below_records =
                std::max<std::size_t>(1, std::strtoull(props["queued.min.messages"].c_str(), nullptr, 10) / 2);
            wake_below_bytes = std::strtoull(props["queued.max.messages.kbytes"].c_str(), nullptr, 10) * 512;
            fetch_wakeup = std::make_unique<kafka::FetchWakeup>(rk.get());
        }

        auto topics = kafka::make_list(static_cast<int>(cfg.topics.size()));
        for (const auto& t : cfg.topics)
            rd_kafka_topic_partition_list_add(topics.get(), t.c_str(), RD_KAFKA_PARTITION_UA);
        if (auto e = rd_kafka_subscribe(rk.get(), topics.get()))
            throw KafkaError(fmt::format("subscribe failed: {}", rd_kafka_err2str(e)));
        say(LogLevel::info, "consumer group {} subscribed to {} topic(s)", cfg.group_id, cfg.topics.size());
    }

    void on_rebalance(rd_kafka_t* handle, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list)
    {
        metrics.rebalances.add();
        // The running batch first: its positions belong to what is revoked, and
        // its connections are free for the stored positions of what is assigned.
        finish_running_in_callback();
        // NULL while the protocol is unknown, as in the revoke that
        // rd_kafka_consumer_close() serves: the last known one still holds.
        if (consumer_protocol)
            cooperative = true;
        else if (const char* protocol = rd_kafka_rebalance_protocol(handle))
            cooperative = std::strcmp(protocol, "COOPERATIVE") == 0;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
            for (int i = 0; i < list->cnt; ++i) {
                PartitionState ps;
                ps.lane = next_lane++; // round robin spreads partitions over the workers
                parts[{list->elems[i].topic, list->elems[i].partition}] = std::move(ps);
            }
            const char* mode = cooperative ? "cooperative" : "eager";
            say(LogLevel::info, "assigned {} partition(s) ({})", list->cnt,
                consumer_protocol ? "consumer protocol" : mode);
            if (offset_store)
                start_from_database(handle, list);
            if (cooperative) {
                kafka::ErrorPtr e(rd_kafka_incremental_assign(handle, list));
                if (e)
                    say(LogLevel::error, error_field(rd_kafka_error_string(e.get())), "incremental assign failed: {}",
                        rd_kafka_error_string(e.get()));
            } else if (auto e = rd_kafka_assign(handle, list)) {
                say(LogLevel::error, error_field(rd_kafka_err2str(e)), "assign failed: {}", rd_kafka_err2str(e));
            }
            // librdkafka keeps an application pause across revoke and assign:
            // a partition paused for a retry backoff before an eager rebalance
            // would stay paused for good, as its new state knows nothing of it.
            if (db_pause)
                rd_kafka_pause_partitions(handle, list);
            else
                rd_kafka_resume_partitions(handle, list);
            return;
        }

        const bool lost = rd_kafka_assignment_lost(handle);
        std::set<TopicPartition> revoked;
        for (int i = 0; i < list->cnt; ++i)
            revoked.insert({list->elems[i].topic, list->elems[i].partition});
        // Records polled for revoked partitions but not processed yet are
        // dropped: their offsets were never committed, so the new owner reads them.
        batch.erase(std::remove_if(batch.begin(), batch.end(),
                                   [&](const Item& it) {
                                       return revoked.count({std::string(it.record.topic), it.record.partition}) > 0;
                                   }),
                    batch.end());
        count_in_flight();
        if (lost) {
            say(LogLevel::warning, "assignment of {} partition(s) lost; committing nothing for them", list->cnt);
        } else {
            if (!no_commit)
                commit_positions(&revoked, false);
            say(LogLevel::info, "revoked {} partition(s)", list->cnt);
        }
        for (const auto& tp : revoked)
            parts.erase(tp);
        if (cooperative) {
            kafka::ErrorPtr e(rd_kafka_incremental_unassign(handle, list));
            if (e)
                say(LogLevel::error, error_field(rd_kafka_error_string(e.get())), "incremental unassign failed: {}",
                    rd_kafka_error_string(e.get()));
        } else {
            rd_kafka_assign(handle, nullptr);
        }
    }

    // offsets_in_database: takes the partitions over in the offset table (new
    // epoch, fencing the previous owner) and starts each at max(stored
    // position, Kafka committed offset) by setting the offsets in the
    // assignment itself. Without PostgreSQL the partitions stay unverified and
    // paused until a reconnect verifies them (see verify_positions).
    void start_from_database(rd_kafka_t* handle, rd_kafka_topic_partition_list_t* list)
    {
        std::map<TopicPartition, std::int64_t> target;
        if (!acquire_positions(handle, list, target)) {
            for (int i = 0; i < list->cnt; ++i)
                if (auto* ps = state_of(list->elems[i].topic, list->elems[i].partition))
                    ps->position_verified = false;
            if (!db_pause)
                db_hold();
            return;
        }
        for (int i = 0; i < list->cnt; ++i) {
            auto t = target.find({list->elems[i].topic, list->elems[i].partition});
            if (t != target.end())
                list->elems[i].offset = t->second;
        }
    }

    // Fills `target` with the start offsets that the database raises above
    // Kafka's committed offsets. Returns false when PostgreSQL is unavailable.
    bool acquire_positions(rd_kafka_t* handle, const rd_kafka_topic_partition_list_t* list,
                           std::map<TopicPartition, std::int64_t>& target)
    {
        auto& lane = lanes.front();
        if (!lane.db)
            return false;
        std::vector<std::pair<std::string, std::int32_t>> wanted;
        for (int i = 0; i < list->cnt; ++i)
            wanted.emplace_back(list->elems[i].topic, list->elems[i].partition);
        std::vector<OffsetStore::Stored> stored;
        try {
            pqxx::work tx(*lane.db);
            pg::open_for_writes(tx);
            stored = offset_store->acquire(tx, cfg.group_id, wanted);
            tx.commit();
        } catch (const std::exception& e) {
            say(LogLevel::warning, error_field(e.what()),
                "cannot read stored positions, partitions wait for PostgreSQL: {}", e.what());
            if (!lane.db->is_open())
                lane.db.reset();
            return false;
        }
        kafka::PartitionListPtr committed(rd_kafka_topic_partition_list_copy(list));
        const bool kafka_known = rd_kafka_committed(handle, committed.get(), 10000) == RD_KAFKA_RESP_ERR_NO_ERROR;
        for (const auto& st : stored) {
            if (auto* ps = state_of(st.topic, st.partition)) {
                ps->epoch = st.epoch;
                ps->position_verified = true;
            }
            if (!st.next_offset)
                continue;
            std::int64_t kafka_offset = RD_KAFKA_OFFSET_INVALID;
            if (kafka_known)
                if (auto* c = rd_kafka_topic_partition_list_find(committed.get(), st.topic.c_str(), st.partition))
                    kafka_offset = c->err ? RD_KAFKA_OFFSET_INVALID : c->offset;
            if (*st.next_offset > kafka_offset) {
                target[{st.topic, st.partition}] = *st.next_offset;
                if (auto* ps = state_of(st.topic, st.partition)) {
                    ps->start_offset = *st.next_offset; // for the lag gauge
                    ps->start_known = true;
                }
                say(LogLevel::info, coordinates(st.topic, st.partition, *st.next_offset),
                    "{}/{} starts at stored position {} (Kafka committed {})", st.topic, st.partition, *st.next_offset,
                    kafka_offset);
            }
        }
        return true;
    }

    // After PostgreSQL comes back: partitions assigned while it was away take
    // their stored positions now (a seek), before they are resumed.
    void verify_positions()
    {
        auto list = kafka::make_list(static_cast<int>(parts.size()));
        for (auto& [tp, ps] : parts)
            if (!ps.position_verified)
                rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition);
        if (list->cnt == 0)
            return;
        std::map<TopicPartition, std::int64_t> target;
        if (!acquire_positions(rk.get(), list.get(), target))
            return;
        for (const auto& [tp, offset] : target)
            if (auto* ps = state_of(tp.topic, tp.partition))
                if (ps->processed_next < offset)
                    rewind(*ps, tp.topic, tp.partition, offset);
    }

    void on_commit(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list)
    {
        if (err == RD_KAFKA_RESP_ERR__NO_OFFSET)
            return;
        bool failed = err != RD_KAFKA_RESP_ERR_NO_ERROR;
        for (int i = 0; list && i < list->cnt; ++i) {
            const auto& p = list->elems[i];
            if (!p.err && !err)
                continue;
            failed = true;
            if (p.err)
                say(LogLevel::warning,
                    error_field(rd_kafka_err2str(p.err), coordinates(p.topic, p.partition, p.offset)),
                    "offset commit failed for {}: {}", coords(p.topic, p.partition, p.offset), rd_kafka_err2str(p.err));
            forget_commit(p.topic, p.partition, p.offset);
        }
        if (failed) {
            metrics.offset_commit_failures.add();
            if (err)
                say(LogLevel::warning, error_field(rd_kafka_err2str(err)),
                    "offset commit failed: {} (records already committed in PostgreSQL are "
                    "deduplicated on redelivery; the commit is retried)",
                    rd_kafka_err2str(err));
        } else {
            metrics.offset_commits.add();
        }
    }

    // A commit that failed is sent again by the next commit_positions().
    void forget_commit(const char* topic, std::int32_t partition, std::int64_t offset)
    {
        auto* ps = state_of(topic, partition);
        if (ps && ps->committed_next == offset)
            ps->committed_next = -1;
    }

    // Commits processed positions (all partitions, or `only`) that moved since
    // the last commit. Explicit offsets, never the consumer's whole position.
    void commit_positions(const std::set<TopicPartition>* only, bool async)
    {
        auto list = kafka::make_list(static_cast<int>(parts.size()));
        for (auto& [tp, ps] : parts) {
            if (only && !only->count(tp))
                continue;
            if (ps.processed_next < 0 || ps.processed_next == ps.committed_next)
                continue;
            rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition)->offset = ps.processed_next;
            ps.committed_next = ps.processed_next;
        }
        if (list->cnt == 0)
            return;
        const auto err =
            async ? rd_kafka_commit(rk.get(), list.get(), 1) : commit_and_wait(list.get(), only != nullptr);
        if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            metrics.offset_commit_failures.add();
            say(LogLevel::warning, error_field(rd_kafka_err2str(err)), "offset commit failed: {}",
                rd_kafka_err2str(err));
            for (int i = 0; i < list->cnt; ++i)
                forget_commit(list->elems[i].topic, list->elems[i].partition, list->elems[i].offset);
        }
    }

    // A synchronous commit, with a bound of our own. While the coordinator is
    // unreachable librdkafka holds a commit for session.timeout.ms as the
    // client knows it; under group.protocol=consumer that setting is refused
    // and its 45 s default applies, so a revoke or a stop would hang that long
    // for a commit that is only an optimisation (PostgreSQL holds the effects;
    // a redelivery is deduplicated). Its result still reaches on_commit().
    // At most 10 s, and at a stop no longer than shutdown_timeout either.
    rd_kafka_resp_err_t commit_and_wait(rd_kafka_topic_partition_list_t* list, bool revoke)
    {
        const milliseconds bound = revoke ? milliseconds(10000) : std::min(milliseconds(10000), cfg.shutdown_timeout);
        kafka::QueuePtr q(rd_kafka_queue_new(rk.get()));
        if (const auto err = rd_kafka_commit_queue(rk.get(), list, q.get(), nullptr, nullptr))
            return err;
        const auto until = Clock::now() + bound;
        for (;;) {
            const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
            if (left.count() <= 0) {
                say(LogLevel::warning,
                    "offset commit of {} partition(s) not confirmed within {} ms (is the group coordinator "
                    "reachable?); going on: records already committed in PostgreSQL are deduplicated on redelivery",
                    list->cnt, bound.count());
                return RD_KAFKA_RESP_ERR_NO_ERROR; // still pending: not to be sent again yet
            }
            kafka::EventPtr ev(rd_kafka_queue_poll(q.get(), static_cast<int>(left.count())));
            if (ev && rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_OFFSET_COMMIT)
                return rd_kafka_event_error(ev.get());
        }
    }

    // Leaves the group and destroys the handle, within shutdown_timeout.
    // rd_kafka_consumer_close() waits for pending offset commits and for the
    // group leave as long as the coordinator cannot be reached (two minutes
    // and more, under either group protocol). Past the bound the handle goes
    // without the close: the broker drops the member after its session
    // timeout, as after a crash, and the new owners' redeliveries are
    // deduplicated.
    void close_consumer()
    {
        kafka::QueuePtr q(rd_kafka_queue_new(rk.get()));
        kafka::ErrorPtr e(rd_kafka_consumer_close_queue(rk.get(), q.get()));
        bool closed = !e;
        if (e)
            say(LogLevel::warning, error_field(rd_kafka_error_string(e.get())), "consumer close: {}",
                rd_kafka_error_string(e.get()));
        const auto until = Clock::now() + cfg.shutdown_timeout;
        while (closed && !rd_kafka_consumer_closed(rk.get())) {
            const auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
            if (left.count() <= 0) {
                say(LogLevel::warning,
                    "leaving the consumer group did not finish within shutdown_timeout ({} ms; is the group "
                    "coordinator reachable?); closing without it: the broker drops this member after its session "
                    "timeout",
                    cfg.shutdown_timeout.count());
                closed = false;
                break;
            }
            // The close's own events: the last revoke (served by on_rebalance,
            // as rd_kafka_consumer_close() would call the callback) and the
            // results of commits still pending.
            kafka::EventPtr ev(rd_kafka_queue_poll(q.get(), static_cast<int>(std::min<long long>(left.count(), 100))));
            if (!ev)
                continue;
            if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_REBALANCE)
                on_rebalance(rk.get(), rd_kafka_event_error(ev.get()), rd_kafka_event_topic_partition_list(ev.get()));
            else if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_OFFSET_COMMIT)
                on_commit(rd_kafka_event_error(ev.get()), rd_kafka_event_topic_partition_list(ev.get()));
            else if (rd_kafka_event_type(ev.get()) == RD_KAFKA_EVENT_ERROR)
                error_cb(rk.get(), rd_kafka_event_error(ev.get()), rd_kafka_event_error_string(ev.get()), this);
        }
        q.reset();
        if (closed) {
            rk.reset();
        } else {
            // The handle must not try the close again on its way out.
            rd_kafka_destroy_flags(rk.release(), RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
        }
    }

    PartitionState* state_of(std::string_view topic, std::int32_t partition)
    {
        auto it = parts.find({std::string(topic), partition});
        return it == parts.end() ? nullptr : &it->second;
    }

    // Moves the fetch position of a partition back to `offset`, so the records
    // from there on are delivered again; anything fetched beyond it is dropped.
    void rewind(PartitionState& ps, const std::string& topic, std::int32_t partition, std::int64_t offset)
    {
        ps.resume_from = offset;
        ps.needs_seek = true;
        seek(ps, topic, partition);
    }

    void seek(PartitionState& ps, const std::string& topic, std::int32_t partition)
    {
        auto list = kafka::make_list(1);
        rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), partition)->offset = ps.resume_from;
        kafka::ErrorPtr e(rd_kafka_seek_partitions(rk.get(), list.get(), 5000));
        if (e && rd_kafka_error_code(e.get()) == RD_KAFKA_RESP_ERR__TIMED_OUT) {
            // The call only stopped waiting for the reply: the seek is queued
            // and its version barrier is set, so nothing fetched before it is
            // delivered any more and it takes effect when librdkafka's thread
            // gets to it (before 2.1 a 5000 ms timeout waited 5 ms, so under
            // load this is common). Calling again would only restart the
            // fetch, and a partition paused for a retry backoff, which resumes
            // once the seek is done, would stay paused while calls time out.
            say(LogLevel::debug, coordinates(topic, partition, ps.resume_from),
                "seek to {} queued; its call timed out waiting for the reply", coords(topic, partition, ps.resume_from));
            ps.needs_seek = false;
            return;
        }
        if (e || list->elems[0].err) {
            const char* why = e ? rd_kafka_error_string(e.get()) : rd_kafka_err2str(list->elems[0].err);
            say(LogLevel::warning, error_field(why, coordinates(topic, partition, ps.resume_from)),
                "seek to {} failed, will retry: {}", coords(topic, partition, ps.resume_from), why);
            return;
        }
        ps.needs_seek = false;
    }

    void pause_one(const std::string& topic, std::int32_t partition, bool pause)
    {
        auto list = kafka::make_list(1);
        rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), partition);
        if (pause)
            rd_kafka_pause_partitions(rk.get(), list.get());
        else
            rd_kafka_resume_partitions(rk.get(), list.get());
    }

    void set_db_pause(bool pause)
    {
        db_pause = pause;
        rd_kafka_topic_partition_list_t* raw = nullptr;
        if (rd_kafka_assignment(rk.get(), &raw) != RD_KAFKA_RESP_ERR_NO_ERROR || !raw)
            return;
        kafka::PartitionListPtr list(raw);
        if (pause) {
            rd_kafka_pause_partitions(rk.get(), list.get());
            return;
        }
        // Partitions waiting out a retry backoff stay paused.
        auto resume = kafka::make_list(list->cnt);
        for (int i = 0; i < list->cnt; ++i) {
            auto* ps = state_of(list->elems[i].topic, list->elems[i].partition);
            if (!ps || !ps->retry_paused)
                rd_kafka_topic_partition_list_add(resume.get(), list->elems[i].topic, list->elems[i].partition);
        }
        rd_kafka_resume_partitions(rk.get(), resume.get());
    }

    static int stats_cb(rd_kafka_t*, char* json, size_t len, void* opaque)
    {
        static_cast<Impl*>(opaque)->on_stats(std::string_view(json, len));
        return 0; // librdkafka frees the text
    }

    // Statistics are served by the thread that polls the client (ours, through
    // rd_kafka_consumer_poll), but they are kept under stats_mu so that serving
    // them from librdkafka's own threads would be safe too.
    void on_stats(std::string_view json) noexcept
    {
        try {
            const auto now = Clock::now();
            std::map<TopicPartition, StatsEntry> latest;
            for (auto& fig : kafka::parse_partition_stats(json)) {
                TopicPartition tp{fig.topic, fig.partition};
                latest[std::move(tp)] = StatsEntry{std::move(fig), now};
            }
            std::lock_guard<std::mutex> lock(stats_mu);
            stats.swap(latest);
        } catch (...) {
            // Out of memory: the lag keeps its previous figures.
        }
    }

    // Lag per assigned partition and in total. From the client's cached
    // watermarks and our processed position: before this member processed
    // anything on a partition its position is where it started, the committed
    // offset, fetched once per assignment (the only broker round trip here).
    // With statistics.interval.ms set, from librdkafka's consumer_lag instead
    // (end offset minus committed offset) once a statistics event of this
    // assignment has it; the watermarks fill in until then.
    void update_lag()
    {
        metrics.assigned_partitions.set(static_cast<std::int64_t>(parts.size()));
        if (parts.empty()) {
            metrics.lag.set(-1);
            metrics.set_partitions({});
            return;
        }
        learn_start_offsets();
        std::map<TopicPartition, StatsEntry> latest;
        if (stats_enabled) {
            std::lock_guard<std::mutex> lock(stats_mu);
            latest = stats;
        }
        std::vector<PartitionLag> rows;
        rows.reserve(parts.size());
        std::int64_t total = 0;
        bool known = true;
        for (auto& [tp, ps] : parts) {
            PartitionLag row;
            row.topic = tp.topic;
            row.partition = tp.partition;
            row.committed = ps.committed_next >= 0 ? ps.committed_next
                            : ps.start_known        ? std::max<std::int64_t>(-1, ps.start_offset)
                                                    : -1;
            std::int64_t lo = -1, hi = -1;
            rd_kafka_get_watermark_offsets(rk.get(), tp.topic.c_str(), tp.partition, &lo, &hi);
            std::int64_t pos = ps.processed_next >= 0 ? ps.processed_next : ps.start_offset;
            if (pos == RD_KAFKA_OFFSET_INVALID)
                pos = reset_to_latest ? hi : lo;
            row.position = std::max<std::int64_t>(-1, pos);
            row.high_watermark = std::max<std::int64_t>(-1, hi);
            if (hi >= 0 && pos >= 0)
                row.lag = std::max<std::int64_t>(0, hi - std::max(pos, lo));
            auto st = latest.find(tp);
            if (st != latest.end() && st->second.at > ps.assigned_at && st->second.stats.lag() >= 0) {
                const auto& fig = st->second.stats;
                row.source = LagSource::statistics;
                row.lag = fig.lag();
                row.committed = fig.committed_offset;
                row.high_watermark = fig.hi_offset;
            }
            if (row.lag < 0)
                known = false;
            else
                total += row.lag;
            rows.push_back(std::move(row));
        }
        std::sort(rows.begin(), rows.end(), [](const PartitionLag& a, const PartitionLag& b) {
            return a.topic != b.topic ? a.topic < b.topic : a.partition < b.partition;
        });
        metrics.lag.set(known ? total : -1);
        metrics.set_partitions(std::move(rows));
    }

    void learn_start_offsets()
    {
        auto list = kafka::make_list(static_cast<int>(parts.size()));
        for (auto& [tp, ps] : parts)
            if (ps.processed_next < 0 && !ps.start_known)
                rd_kafka_topic_partition_list_add(list.get(), tp.topic.c_str(), tp.partition);
        if (list->cnt == 0)
            return;
        if (rd_kafka_committed(rk.get(), list.get(), 2000) != RD_KAFKA_RESP_ERR_NO_ERROR)
            return; // try again at the next update
        for (int i = 0; i < list->cnt; ++i) {
            auto* ps = state_of(list->elems[i].topic, list->elems[i].partition);
            if (ps && !list->elems[i].err) {
                ps->start_offset = list->elems[i].offset;
                ps->start_known = true;
            }
        }
    }

    void housekeeping()
    {
        const auto now = Clock::now();
        const bool tick = now >= next_lag_update;
        if (tick) {
            update_lag();
            if (maintenance)
                metrics.expired_partitions_kept.set(static_cast<std::int64_t>(maintenance->expired_partitions_kept()));
            next_lag_update = now + milliseconds(200);
        }
        // Each tick also resends failed commits of an idle partition.
        if (now >= next_commit_at && (tick || uncommitted_since))
            flush_commits();
        for (auto& [tp, ps] : parts) {
            if (ps.needs_seek && ps.resume_from < 0)
                ps.needs_seek = false; // the rewound record arrived: the seek happened
            if (ps.needs_seek)
                seek(ps, tp.topic, tp.partition);
            if (ps.retry_paused && now >= ps.resume_at && !ps.needs_seek) {
                ps.retry_paused = false;
                if (std::exchange(ps.retake, false))
                    ps.position_verified = false; // ensure_db() takes it over again first
                if (!db_pause)
                    pause_one(tp.topic, tp.partition, false);
            }
        }
    }

    // ---- polling ----------------------------------------------------------

    void fill_batch()
    {
        Clock::time_point deadline{};
        auto& bytes = fill_bytes;
        bytes = 0;
        while (batch.size() < cfg.max_batch && bytes < cfg.max_batch_bytes) {
            // The workers are done: hand them what there is rather than leave
            // PostgreSQL idle (and commit their positions when there is nothing).
            // `polling` is set first: a worker finishing from here on sees it
            // and wakes the poll below.
            polling = true;
            if (!running.empty() && running_done.load()) {
                polling = false;
                return;
            }
            milliseconds timeout = idle_poll;
            if (!batch.empty()) {
                timeout = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
                if (timeout.count() <= 0)
                    timeout = milliseconds(0);
            }
            kafka::MessagePtr m(rd_kafka_consumer_poll(rk.get(), static_cast<int>(timeout.count())));
            polling = false;
            if (deferred_error)
                std::rethrow_exception(std::exchange(deferred_error, nullptr));
            if (!m) {
                if (batch.empty() || Clock::now() >= deadline || stop_requests.load())
                    return;
                continue;
            }
            if (m->err) {
                on_consumer_error(*m);
                if (batch.empty())
                    return;
                continue;
            }
            const char* topic = rd_kafka_topic_name(m->rkt);
            auto* ps = state_of(topic, m->partition);
            if (!ps)
                continue; // not (or no longer) ours
            if (ps->resume_from >= 0) {
                // Records fetched before the rewind come again. The first one
                // at or past the rewind point (which may itself be no record:
                // a transaction marker, or an offset removed by retention)
                // shows that the seek took effect, even if its call reported
                // a timeout.
                if (m->offset < ps->resume_from)
                    continue;
                ps->resume_from = -1;
                ps->needs_seek = false;
            }
            bytes += m->len + m->key_len;
            if (batch.empty())
                deadline = Clock::now() + cfg.max_batch_wait;
            add_item(std::move(m), topic, ps);
            if (stop_requests.load())
                return;
        }
    }

    // Called around fill_batch(): a queue at half a cap or more before the
    // batch may have stopped the fetchers; once the batch took it below both
    // halves, wake them (at most every 20 ms). The queue's bytes are
    // estimated from the records taken.
    void check_prefetch(bool before_batch)
    {
        if (!fetch_wakeup)
            return;
        const auto queued = static_cast<std::size_t>(rd_kafka_queue_length(consumer_queue.get()));
        if (!before_batch && !batch.empty())
            record_bytes = fill_bytes / batch.size();
        const bool half_full = queued >= wake_below_records || queued * record_bytes >= wake_below_bytes;
        if (before_batch) {
            wake_armed = wake_armed || half_full;
            return;
        }
        const auto now = Clock::now();
        if (wake_armed && !half_full && now >= next_wake) {
            fetch_wakeup->wake();
            wake_armed = false;
            next_wake = now + milliseconds(20);
        }
    }

    void on_consumer_error(const rd_kafka_message_t& m)
    {
        metrics.kafka_errors.add();
        const char* topic = m.rkt ? rd_kafka_topic_name(m.rkt) : "";
        say(LogLevel::warning,
            error_field(rd_kafka_message_errstr(&m), m.rkt ? coordinates(topic, m.partition, m.offset) : LogFields{}),
            "kafka consumer error{}{}: {}", m.rkt ? " on " : "",
            m.rkt ? coords(topic, m.partition, m.offset) : std::string(), rd_kafka_message_errstr(&m));
        char reason[512];
        if (rd_kafka_fatal_error(rk.get(), reason, sizeof reason))
            throw KafkaError(secrets(fmt::format("fatal Kafka error: {}", reason)));
    }

    void add_item(kafka::MessagePtr m, const char* topic, PartitionState* ps)
    {
        Item it;
        it.record.topic = topic;
        it.record.partition = m->partition;
        it.record.offset = m->offset;
        rd_kafka_timestamp_type_t tstype;
        it.record.timestamp_ms = rd_kafka_message_timestamp(m.get(), &tstype);
        if (m->key)
            it.record.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
        if (m->payload)
            it.record.value = std::string_view(static_cast<const char*>(m->payload), m->len);
        rd_kafka_headers_t* hdrs = nullptr;
        if (rd_kafka_message_headers(m.get(), &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR && hdrs) {
            const char* name;
            const void* val;
            size_t size;
            for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
                 ++i) {
                Header h{name, std::nullopt};
                if (val)
                    h.value.emplace(static_cast<const char*>(val), size);
                it.record.headers.push_back(std::move(h));
            }
        }
        it.part = ps;
        it.msg = std::move(m);
        batch.push_back(std::move(it));
        metrics.in_flight_records.add(1);
        metrics.in_flight_bytes.add(static_cast<std::int64_t>(batch.back().msg->len + batch.back().msg->key_len));
    }

    // The in-flight gauges after records left the batch.
    void count_in_flight()
    {
        std::int64_t bytes = 0;
        for (const auto* items : {&batch, &running})
            for (const auto& it : *items)
                bytes += static_cast<std::int64_t>(it.msg->len + it.msg->key_len);
        metrics.in_flight_records.set(static_cast<std::int64_t>(batch.size() + running.size()));
        metrics.in_flight_bytes.set(bytes);
    }

    // ---- processing -------------------------------------------------------

    // Counted when the record is handed over (see launch()): a record decoded
    // and then dropped by a rewind is not counted twice.
    static void poison(Item& it, DeadLetterReason reason, std::string error)
    {
        it.state = State::poison;
        it.reason = reason;
        it.error = std::move(error);
    }

    void count_poison(const Item& it)
    {
        if (it.reason == DeadLetterReason::invalid_event_id || it.reason == DeadLetterReason::missing_event_id)
            metrics.invalid_event_ids.add();
        else
            metrics.decode_errors.add();
    }

    // The dedup-horizon guard: an event whose claim may already be purged is
    // not handed to the handler blindly. The reconcile hook needs PostgreSQL,
    // so it runs in reconcile(), when no batch is in the workers' hands.
    void apply_horizon(Item& it)
    {
        const auto d = guard->check(it.id);
        it.key_window_open = d.key_window_open;
        if (d.beyond_horizon)
            metrics.beyond_dedup_horizon.add();
        if (d.action == HorizonAction::dead_letter) {
            it.state = State::poison;
            it.reason = d.reason == reason_non_v7_event_id ? DeadLetterReason::non_v7_event_id
                                                           : DeadLetterReason::beyond_dedup_horizon;
            it.error = fmt::format("event {} is {} ms old; dedup horizon is {} ms", it.id.to_string(), d.age.count(),
                                   std::chrono::duration_cast<milliseconds>(cfg.retention.dedup_horizon()).count());
            if (it.reason == DeadLetterReason::non_v7_event_id)
                it.error = "event id " + it.id.to_string() + " is not a UUIDv7; the partitioned claims table needs one";
            explain_default_once(it.reason);
            return;
        }
        if (d.action == HorizonAction::reconcile) {
            it.reconcile = true;
            return;
        }
        if (d.beyond_horizon) {
            metrics.horizon_processed.add();
            say(LogLevel::warning, about(it), "{} (event {}) is beyond the dedup horizon; processed by policy",
                coords(it.record.topic, it.record.partition, it.record.offset), it.id.to_string());
        }
    }

    // The first record a default policy dead-letters gets one error line
    // saying which setting decided it and what to change.
    bool non_v7_explained = false;
    bool horizon_explained = false;
    void explain_default_once(DeadLetterReason reason)
    {
        if (reason == DeadLetterReason::non_v7_event_id && !std::exchange(non_v7_explained, true))
            say(LogLevel::error,
                "event ids that are not UUIDv7 are dead-lettered: retention.non_v7 is dead_letter (the default "
                "with the partitioned claims table, whose partitions expire by the id's time). Producers that send "
                "UUIDv4 or other ids need retention.non_v7 = NonV7Policy::process or retention.mode = "
                "RetentionMode::purge (README, \"Event ids\"). Logged once; every such record is dead-lettered "
                "with reason non_v7_event_id");
        if (reason == DeadLetterReason::beyond_dedup_horizon && !std::exchange(horizon_explained, true))
            say(LogLevel::error,
                "events older than the dedup horizon ({} h) are dead-lettered: retention.beyond_horizon is "
                "dead_letter (the default), as their claims may already be purged. To handle them set "
                "beyond_horizon = reconcile with a reconcile hook, or process, or keep claims longer "
                "(retention.retention). Logged once; every such record is dead-lettered with reason "
                "beyond_dedup_horizon",
                std::chrono::duration_cast<std::chrono::hours>(cfg.retention.dedup_horizon()).count());
    }

    void reconcile(Item& it)
    {
        const auto where = coords(it.record.topic, it.record.partition, it.record.offset);
        ReconcileOutcome outcome = ReconcileOutcome::dead_letter;
        const int attempt = attempt_of(it);
        try {
            pqxx::work tx(*lanes.front().db);
            pg::open_for_writes(tx);
            outcome = cfg.retention.reconcile(tx, Context(it.record, it.id, attempt, it.key_window_open));
            if (const auto state = pg::state_of(tx); state != pg::TxState::open)
                throw std::runtime_error("the hook returned with the " + pg::left_unusable(tx, state));
            if (outcome == ReconcileOutcome::skip) // the effect is there: claimed with what the hook wrote
                pg::exec_prepared(tx, claim_statement, ProcessedEventStore::array_literal({it.id}), cfg.group_id);
            tx.commit();
        } catch (const std::exception& e) {
            const int failures = count_failure(it);
            metrics.handler_failures.add();
            if (failures >= cfg.max_attempts) {
                say(LogLevel::error, about(it, e.what()), "reconcile hook failed on {} (attempt {} of {}): {}", where,
                    failures, cfg.max_attempts, e.what());
                it.state = State::poison;
                it.reason = DeadLetterReason::beyond_dedup_horizon;
                it.error = fmt::format("reconcile hook failed {} times: {}", failures, e.what());
                return;
            }
            metrics.retries.add();
            say(LogLevel::warning, about(it, e.what()),
                "reconcile hook failed on {} (attempt {} of {}): {}; the record comes again", where, failures,
                cfg.max_attempts, e.what());
            it.retry_later = true;
            it.retry_failures = failures;
            return;
        }
        if (outcome == ReconcileOutcome::skip) {
            say(LogLevel::info, about(it), "reconcile hook skipped {} (event {})", where, it.id.to_string());
            it.state = State::done;
            metrics.duplicates.add();
        } else if (outcome == ReconcileOutcome::dead_letter) {
            it.state = State::poison;
            it.reason = DeadLetterReason::beyond_dedup_horizon;
            it.error = "reconcile hook chose the dead letter";
        } else {
            metrics.horizon_processed.add();
        }
    }

    // Decodes `batch` into the free Stage bank (pipeline: while the workers
    // process `running` from the other one).
    void decode_all()
    {
        stage.prepare(fill_bank, batch.size());
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto& it = batch[i];
            it.slot = i;
            const auto& r = it.record;
            if (!r.value || r.value->empty()) {
                poison(it, DeadLetterReason::empty_payload, r.value ? "empty payload" : "null payload");
                continue;
            }
            if (r.value->size() > cfg.max_payload_bytes) {
                poison(it, DeadLetterReason::payload_too_large,
                       fmt::format("payload of {} bytes exceeds max_payload_bytes {}", r.value->size(),
                                   cfg.max_payload_bytes));
                continue;
            }
            try {
                it.id = stage.decode(fill_bank, i, r);
                if (it.id.is_nil())
                    throw InvalidEventId("event id is the nil UUID");
            } catch (const MissingEventId& e) {
                poison(it, DeadLetterReason::missing_event_id, e.what());
            } catch (const InvalidEventId& e) {
                poison(it, DeadLetterReason::invalid_event_id, e.what());
            } catch (const std::exception& e) {
                poison(it, DeadLetterReason::decode_error, e.what());
            } catch (...) {
                poison(it, DeadLetterReason::decode_error, "non-standard exception");
            }
        }
    }

    // ---- dead letters -----------------------------------------------------

    Publisher& dead_letter_producer()
    {
        std::lock_guard<std::mutex> lock(dlq_mu);
        if (!dlq) {
            PublisherConfig pc;
            pc.brokers = cfg.brokers;
            for (const auto& [k, v] : cfg.kafka)
                if (k.rfind("security.", 0) == 0 || k.rfind("sasl.", 0) == 0 || k.rfind("ssl.", 0) == 0 ||
                    k == "client.id" || k == "client.rack")
                    pc.kafka[k] = v;
            for (const auto& [k, v] : cfg.dead_letter_kafka)
                pc.kafka[k] = v;
            pc.log = log;
            dlq = std::make_unique<Publisher>(std::move(pc));
        }
        return *dlq;
    }

    // The dead-letter producer's record size limit (librdkafka's
    // message.max.bytes), less room for the record's framing.
    std::size_t dead_letter_budget() const
    {
        std::size_t limit = 1000000;
        auto m = cfg.dead_letter_kafka.find("message.max.bytes");
        if (m != cfg.dead_letter_kafka.end()) {
            try {
                limit = std::stoull(m->second);
            } catch (const std::exception&) {
                // not a number: the producer's own error names the property
            }
        }
        constexpr std::size_t framing = 1024;
        return limit > 2 * framing ? limit - framing : limit / 2;
    }

    static std::size_t header_bytes(const std::vector<Header>& headers)
    {
        std::size_t n = 0;
        for (const auto& h : headers)
            n += h.name.size() + (h.value ? h.value->size() : 0);
        return n;
    }

    OutgoingRecord dead_letter_record(const Item& it, int attempts) const
    {
        const auto& r = it.record;
        OutgoingRecord out;
        out.topic = dlq_topic;
        if (r.key)
            out.key.emplace(*r.key);
        if (r.value)
            out.value.emplace(*r.value);
        out.headers = r.headers;
        auto add = [&](const char* name, std::string value) { out.headers.push_back(Header{name, std::move(value)}); };
        constexpr std::size_t max_error = 4096; // an exception's text can be anything
        add(dead_letter_header::reason, std::string(to_string(it.reason)));
        add(dead_letter_header::error, it.error.size() > max_error ? it.error.substr(0, max_error) + "..." : it.error);
        add(dead_letter_header::original_topic, std::string(r.topic));
        add(dead_letter_header::original_partition, std::to_string(r.partition));
        add(dead_letter_header::original_offset, std::to_string(r.offset));
        add(dead_letter_header::original_timestamp, std::to_string(r.timestamp_ms));
        if (!it.id.is_nil())
            add(dead_letter_header::event_id, it.id.to_string());
        add(dead_letter_header::attempts, std::to_string(attempts));
        add(dead_letter_header::consumer_group, cfg.group_id);
        fit_dead_letter(out, r.headers.size());
        return out;
    }

    // A dead letter always fits the producer's limit: what does not fit is
    // left out (the value first, then the original headers, then the key),
    // and headers say what and how large it was.
    void fit_dead_letter(OutgoingRecord& out, std::size_t original_headers) const
    {
        const std::size_t budget = dead_letter_budget();
        auto size = [&] {
            return (out.key ? out.key->size() : 0) + (out.value ? out.value->size() : 0) + header_bytes(out.headers) +
                   64; // the headers added below
        };
        if (size() <= budget)
            return;
        if (out.value) {
            const auto bytes = out.value->size();
            out.value.reset();
            out.headers.push_back(Header{dead_letter_header::original_value_bytes, std::to_string(bytes)});
        }
        if (size() > budget && original_headers > 0) {
            out.headers.erase(out.headers.begin(), out.headers.begin() + static_cast<std::ptrdiff_t>(original_headers));
            out.headers.push_back(Header{dead_letter_header::original_headers_dropped, std::to_string(original_headers)});
        }
        if (size() > budget && out.key) {
            const auto bytes = out.key->size();
            out.key.reset();
            out.headers.push_back(Header{dead_letter_header::original_key_bytes, std::to_string(bytes)});
        }
    }

    // Produces the items to the dead-letter topic and waits for the broker's
    // acknowledgement. Acknowledged items are done; for the others the
    // partition is held there, so their offsets never move before the dead
    // letter is safe, and they are tried again after a backoff that grows
    // with each refusal (a topic that refuses for good stalls only that
    // partition, visibly: dead_letter_failures and an error line per try).
    void dead_letter(const std::vector<std::size_t>& items, Holds& holds)
    {
        if (items.empty())
            return;
        std::vector<OutgoingRecord> records;
        records.reserve(items.size());
        for (std::size_t i : items) {
            auto& it = running[i];
            if (it.attempts < 0)
                it.attempts = attempt_of(it) - 1;
            records.push_back(dead_letter_record(it, it.attempts));
        }
        std::vector<std::string> errors;
        try {
            errors = dead_letter_producer().publish_all(records, cfg.dead_letter_timeout);
        } catch (const std::exception& e) {
            errors.assign(items.size(), e.what());
        }
        for (std::size_t k = 0; k < items.size(); ++k) {
            auto& it = running[items[k]];
            const auto& r = it.record;
            if (errors[k].empty()) {
                it.state = State::done;
                forget_failures(it);
                {
                    std::lock_guard<std::mutex> lock(failures_mu);
                    it.part->dead_letter_due.erase(r.offset);
                    it.part->dead_lettered.insert(r.offset);
                }
                metrics.dead_lettered[static_cast<std::size_t>(it.reason)].add();
                auto fields = about(it, it.error);
                fields.push_back({"reason", std::string(to_string(it.reason))});
                say(LogLevel::error, std::move(fields), "dead-lettered {} to {} (reason {}{}{}): {}",
                    coords(r.topic, r.partition, r.offset), dlq_topic, to_string(it.reason),
                    it.id.is_nil() ? "" : ", event ", it.id.is_nil() ? std::string() : it.id.to_string(), it.error);
                continue;
            }
            int refusals = 0;
            {
                std::lock_guard<std::mutex> lock(failures_mu);
                auto& due = it.part->dead_letter_due[r.offset];
                refusals = ++due.refusals;
                due.reason = it.reason;
                due.error = it.error;
                due.attempts = it.attempts;
            }
            metrics.dead_letter_failures.add();
            auto fields = about(it, errors[k]);
            fields.push_back({"refusals", std::to_string(refusals)});
            say(LogLevel::error, std::move(fields),
                "dead letter for {} not acknowledged ({}); its offset does not move, next try in {} ms "
                "(refusal {})",
                coords(r.topic, r.partition, r.offset), errors[k],
                backoff_for(refusals, cfg.retry_backoff, cfg.retry_backoff_max).count(), refusals);
            add_hold(holds, it.part, r.offset, refusals);
        }
    }

    // A record whose dead letter was written in this assignment is done when
    // its partition is rewound behind it; one whose dead letter was refused
    // goes to the dead letter again, as it was (its handler does not run
    // again). Runs on the poll thread with no batch in the workers' hands.
    static bool settled_before(Item& it)
    {
        auto* ps = it.part;
        if (ps->dead_lettered.count(it.record.offset)) {
            it.state = State::done;
            return true;
        }
        auto due = ps->dead_letter_due.find(it.record.offset);
        if (due == ps->dead_letter_due.end())
            return false;
        it.state = State::poison;
        it.reason = due->second.reason;
        it.error = due->second.error;
        it.attempts = due->second.attempts;
        return true;
    }

    int attempt_of(const Item& it)
    {
        std::lock_guard<std::mutex> lock(failures_mu);
        auto f = it.part->failures.find(it.record.offset);
        return f == it.part->failures.end() ? 1 : f->second + 1;
    }

    int count_failure(const Item& it)
    {
        std::lock_guard<std::mutex> lock(failures_mu);
        return ++it.part->failures[it.record.offset];
    }

    void forget_failures(const Item& it)
    {
        std::lock_guard<std::mutex> lock(failures_mu);
        it.part->failures.erase(it.record.offset);
    }

    // ---- transactions -----------------------------------------------------

    // A failure of record `index`; SIZE_MAX when no record is to blame (a
    // conflict at the claim or at COMMIT).
    struct HandlerFailed {
        std::size_t index = 0;
        std::string what;
        bool retryable = true;
        bool batch_call = false; // in a batch handler call of several records
    };
    static constexpr std::size_t nobody = SIZE_MAX;

    // split: a batch handler failed; run again with one call per record.
    enum class Outcome { committed, handler_failed, split, conflict, db_failed, abandoned };

    bool retryable(const std::exception& e) const
    {
        if (dynamic_cast<const NonRetryableError*>(&e))
            return false;
        if (!cfg.is_retryable)
            return true;
        try {
            return cfg.is_retryable(e);
        } catch (...) {
            return true; // a classifier that throws must not lose the record
        }
    }

    // Runs one handler call and times it. False, with `failure` naming record
    // `blame`, when the handler threw; connection loss, an in-doubt commit and
    // serialization failures propagate (they concern the whole transaction).
    template <class Call>
    bool call_handler(std::size_t blame, HandlerFailed& failure, Call&& call)
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
        metrics.handler_seconds.observe(std::chrono::duration<double>(Clock::now() - t0).count());
        return true;
    }

    // After a handler call that returned normally: a transaction it left
    // aborted or ended (it caught a database error and went on) is that
    // record's failure. Its writes go with the rollback; none of them was
    // committed (see pg::guard_session for libpqxx 6).
    bool left_usable(const pqxx::dbtransaction& tx, const Lane& lane, std::size_t blame, HandlerFailed& failure)
    {
        const auto state = pg::state_of(tx);
        if (state == pg::TxState::open)
            return true;
        if (state == pg::TxState::unknown && !lane.db->is_open())
            throw pqxx::broken_connection("connection lost inside the handler");
        metrics.handler_aborted_transactions.add();
        failure = {blame, "transaction aborted inside the handler: it returned normally with the " +
                              pg::left_unusable(tx, state),
                   true};
        return false;
    }

    // Releases the claims of the records from first[k] on (their handlers have
    // not run) and holds their partitions there, so this transaction commits
    // only finished work. Returns how many records are given back.
    std::size_t give_back(pqxx::transaction_base& tx, Lane& lane, const std::vector<std::size_t>& first,
                          std::size_t k, const std::unordered_set<EventId>& claimed)
    {
        std::vector<EventId> release;
        for (std::size_t j = k; j < first.size(); ++j) {
            const auto& it = running[first[j]];
            add_hold(lane.holds, it.part, it.record.offset, 0);
            if (claimed.count(it.id))
                release.push_back(it.id);
        }
        if (!release.empty())
            pg::exec_params(tx,
                            fmt::format("DELETE FROM {} WHERE consumer_group = $1 AND event_id = ANY($2::uuid[])",
                                        store.qualified_name()),
                            cfg.group_id, ProcessedEventStore::array_literal(release));
        std::size_t n = 0;
        for (std::size_t j : lane.items)
            if (held(lane.holds, running[j]))
                ++n;
        return n;
    }

    // One transaction over the lane's pending records that are not held.
    Outcome try_transaction(Lane& lane, HandlerFailed& failure)
    {
        std::vector<EventId> ids;
        std::vector<std::size_t> first; // index of the first pending item per id, in batch order
        std::unordered_set<EventId> seen;
        ids.reserve(lane.items.size());
        first.reserve(lane.items.size());
        seen.reserve(lane.items.size());
        std::size_t active = 0;
        for (std::size_t i : lane.items) {
            const auto& it = running[i];
            if (it.state != State::pending || held(lane.holds, it))
                continue;
            ++active;
            if (seen.insert(it.id).second) {
                ids.push_back(it.id);
                first.push_back(i);
            }
        }
        lane.info = BatchInfo{};
        lane.info.records = active;
        if (ids.empty())
            return Outcome::committed;
        // Claims in id order: lanes that share ids lock them in the same order
        // and cannot deadlock each other.
        std::sort(ids.begin(), ids.end());

        std::size_t current = nobody; // the record whose handler runs
        std::size_t lane_claimed_override = SIZE_MAX;
        const bool batched = stage.batched();
        const bool gather = batched && !lane.one_by_one;
        lane.call_items.clear();
        lane.call_slots.clear();
        lane.call_contexts.clear();
        try {
            pqxx::work tx(*lane.db);
            pg::open_for_writes(tx);
            auto claimed_list = ProcessedEventStore::claimed_ids(
                pg::exec_prepared(tx, claim_statement, ProcessedEventStore::array_literal(ids), cfg.group_id));
            std::unordered_set<EventId> claimed(claimed_list.begin(), claimed_list.end());
            std::size_t handled = 0;
            for (std::size_t k = 0; k < first.size(); ++k) {
                const std::size_t i = first[k];
                auto& it = running[i];
                if (!claimed.count(it.id))
                    continue;
                if (forced())
                    throw Abandon{};
                if (handled > 0 && Clock::now() >= batch_deadline) {
                    // Over the time budget: commit what ran, give the rest back
                    // so the consumer polls again long before max.poll.interval.ms.
                    const auto given_back = give_back(tx, lane, first, k, claimed);
                    say(LogLevel::info, "batch over its time budget after {} handler calls; {} records come again",
                        handled, given_back);
                    active = 0;
                    for (std::size_t j : lane.items)
                        if (running[j].state == State::pending && !held(lane.holds, running[j]))
                            ++active;
                    lane.info.records = active;
                    lane_claimed_override = handled;
                    break;
                }
                if (!it.key_window_open)
                    metrics.key_window_closed.add();
                if (gather) {
                    lane.call_items.push_back(i);
                    lane.call_slots.push_back(it.slot);
                    lane.call_contexts.emplace_back(it.record, it.id, attempt_of(it), it.key_window_open);
                    continue;
                }
                current = i;
                ++handled;
                const bool ok = call_handler(i, failure, [&] {
                    const Context ctx(it.record, it.id, attempt_of(it), it.key_window_open);
                    if (batched)
                        stage.handle_batch(run_bank, tx, &it.slot, &ctx, 1);
                    else
                        stage.handle(run_bank, it.slot, tx, ctx);
                }) && left_usable(tx, lane, i, failure);
                if (!ok)
                    return Outcome::handler_failed;
                current = nobody;
            }
            if (!lane.call_items.empty()) {
                // One call for every claimed record of the transaction.
                handled = lane.call_items.size();
                current = lane.call_items.front();
                const bool ok = call_handler(current, failure, [&] {
                    stage.handle_batch(run_bank, tx, lane.call_slots.data(), lane.call_contexts.data(), handled);
                }) && left_usable(tx, lane, current, failure);
                if (!ok && handled == 1)
                    return Outcome::handler_failed;
                if (!ok) {
                    metrics.batch_splits.add();
                    say(LogLevel::warning, "batch handler failed on {} events; running them one at a time to find "
                                           "the failing record: {}", handled, failure.what);
                    lane.one_by_one = true;
                    return Outcome::split;
                }
            }
            current = nobody;
            if (offset_store && !positions_after_merge())
                write_positions(tx, lane_positions(lane));
            if (const auto state = pg::state_of(tx); state != pg::TxState::open)
                throw std::runtime_error(fmt::format("transaction {} before COMMIT", pg::to_string(state)));
            tx.commit();
            lane.info.claimed = lane_claimed_override != SIZE_MAX ? lane_claimed_override : claimed.size();
            lane.info.duplicates = active - lane.info.claimed;
            return Outcome::committed;
        } catch (const Abandon&) {
            return Outcome::abandoned;
        } catch (const Fenced&) {
            lane.fenced = true;
            return Outcome::abandoned;
        } catch (const pqxx::in_doubt_error& e) {
            // The commit may or may not have happened: never guess. Nothing is
            // committed to Kafka; redelivery and dedup settle it.
            lost_connection(lane, e.what());
            return Outcome::db_failed;
        } catch (const pqxx::broken_connection& e) {
            lost_connection(lane, e.what());
            return Outcome::db_failed;
        } catch (const pqxx::check_violation& e) {
            // 23514 on the claim: maintenance attached the partition for this
            // id at that moment (handler errors never get here). Run it again.
            failure = {current, e.what(), true, current != nobody && lane.call_items.size() > 1};
            return Outcome::conflict;
        } catch (const pqxx::transaction_rollback& e) {
            // 40001 / 40P01: the whole transaction is safe to run again. In a
            // handler call it may be that record's doing; at the claim or at
            // COMMIT it is nobody's.
            failure = {current, e.what(), true, current != nobody && lane.call_items.size() > 1};
            return Outcome::conflict;
        } catch (const pqxx::sql_error& e) {
            if (!pg::is_lock_timeout(e))
                return db_error(lane, e);
            metrics.lock_timeouts.add();
            say(LogLevel::warning, error_field(e.what()),
                "a statement waited for a lock longer than lock_timeout ({} ms){}; the batch is rolled back and runs "
                "again after a backoff: {}",
                cfg.lock_timeout.count(),
                current == nobody ? " at the claim (another member's batch holds these event ids?)" : " in a handler",
                e.what());
            return Outcome::db_failed;
        } catch (const std::exception& e) {
            return db_error(lane, e);
        }
    }

    // Any other PostgreSQL error outside the handlers: the batch is rolled
    // back and runs again after a backoff.
    Outcome db_error(Lane& lane, const std::exception& e)
    {
        metrics.db_failures.add();
        say(LogLevel::error, error_field(e.what()),
            "PostgreSQL error outside the handler, batch rolled back and retried after a backoff: {}", e.what());
        if (lane.db && !lane.db->is_open())
            lost_connection(lane, e.what());
        return Outcome::db_failed;
    }

    // Per-key mode spreads a partition over several lanes: no lane alone knows
    // the partition's contiguous position, so it is written after the merge.
    bool positions_after_merge() const { return cfg.ordering == Ordering::key && lanes.size() > 1; }

    // Next offset per partition of the lane: past every record of this batch
    // that is not held (all of them are finished when the transaction commits).
    std::vector<OffsetStore::Position> lane_positions(const Lane& lane)
    {
        std::map<PartitionState*, OffsetStore::Position> by_part;
        for (std::size_t i : lane.items) {
            const auto& it = running[i];
            if (held(lane.holds, it))
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
        for (auto& [ps, p] : by_part)
            out.push_back(std::move(p));
        return out;
    }

    void write_positions(pqxx::transaction_base& tx, const std::vector<OffsetStore::Position>& positions)
    {
        const auto fenced = offset_store->write(tx, cfg.group_id, positions);
        if (fenced.empty())
            return;
        metrics.fenced_writes.add(fenced.size());
        {
            std::lock_guard<std::mutex> lock(fenced_mu);
            for (const auto& p : fenced)
                fenced_parts.push_back({p.topic, p.partition});
        }
        for (const auto& p : fenced)
            say(LogLevel::error,
                {{log_field::topic, p.topic},
                 {log_field::partition, std::to_string(p.partition)},
                 {"epoch", std::to_string(p.epoch)}},
                "position write for {}/{} refused: epoch {} is stale, another member owns the "
                "partition now; rolling back this transaction",
                p.topic, p.partition, p.epoch);
        throw Fenced{};
    }

    void lost_connection(Lane& lane, const char* why)
    {
        metrics.db_failures.add();
        say(LogLevel::error, error_field(why),
            "PostgreSQL connection lost ({}); offsets of the batch are not committed, records will be redelivered",
            why);
        lane.lost_connection = true;
    }

    // The lane's transactions for this batch: a failing record is held (or
    // dead-lettered) and the rest runs again without its partition's tail.
    void run_lane(Lane& lane)
    {
        int conflicts = 0;
        for (;;) {
            HandlerFailed failure{};
            const Outcome out = try_transaction(lane, failure);
            if (out == Outcome::committed)
                return;
            if (out == Outcome::split)
                continue;
            if (out == Outcome::conflict) {
                metrics.transaction_retries.add();
                if (++conflicts <= cfg.transaction_retries) {
                    say(LogLevel::warning, error_field(failure.what),
                        "transaction conflict, running the batch again ({}/{}): {}", conflicts, cfg.transaction_retries,
                        failure.what);
                    continue;
                }
                conflicts = 0; // persistent: a failure of the record that hit it
                if (failure.batch_call) {
                    // In a call for several records: find which one, one at a time.
                    lane.one_by_one = true;
                    continue;
                }
                if (failure.index == nobody) {
                    // Not any record's doing: the batch waits for a backoff and
                    // runs again; nobody is dead-lettered for it.
                    metrics.db_failures.add();
                    say(LogLevel::error, error_field(failure.what),
                        "transaction conflict persisted outside the handlers, batch rolled back and retried after a "
                        "backoff: {}", failure.what);
                    lane.failed = true;
                    return;
                }
            }
            if (out == Outcome::handler_failed || out == Outcome::conflict) {
                on_handler_failure(lane, failure);
                continue;
            }
            lane.failed = true;
            lane.abandoned = out == Outcome::abandoned && !lane.fenced;
            return;
        }
    }

    void on_handler_failure(Lane& lane, const HandlerFailed& f)
    {
        auto& it = running[f.index];
        const int failures = count_failure(it);
        metrics.handler_failures.add();
        const auto where = coords(it.record.topic, it.record.partition, it.record.offset);
        auto fields = about(it, f.what);
        fields.push_back({"attempt", std::to_string(failures)});
        if (!f.retryable || failures >= cfg.max_attempts) {
            say(LogLevel::error, std::move(fields), "handler failed on {} (event {}, attempt {} of {}{}): {}", where,
                it.id.to_string(), failures, cfg.max_attempts, f.retryable ? "" : ", not retryable", f.what);
            it.reason = f.retryable ? DeadLetterReason::handler_failed : DeadLetterReason::non_retryable;
            it.error = f.what;
            it.state = State::poison;
            dead_letter({f.index}, lane.holds); // done when acknowledged, else held for another try
            return;
        }
        metrics.retries.add();
        say(LogLevel::warning, std::move(fields),
            "handler failed on {} (event {}, attempt {} of {}), retrying in {} ms: {}", where, it.id.to_string(),
            failures, cfg.max_attempts, backoff_for(failures, cfg.retry_backoff, cfg.retry_backoff_max).count(),
            f.what);
        add_hold(lane.holds, it.part, it.record.offset, failures);
    }

    std::size_t lane_of(const Item& it) const
    {
        if (lanes.size() == 1)
            return 0;
        if (cfg.ordering == Ordering::key && it.record.key)
            return std::hash<std::string_view>{}(*it.record.key) % lanes.size();
        return it.part->lane % lanes.size();
    }

    // Hands `batch` (decoded) to the workers. Runs when none is in their
    // hands, so the lanes' connections are free for the reconcile hook.
    void launch()
    {
        std::swap(batch, running);
        run_bank = fill_bank;
        fill_bank = (fill_bank + 1) % Stage::banks;
        metrics.consumed.add(running.size());
        batch_deadline = Clock::now() + batch_budget;
        Holds holds;
        for (auto& it : running) {
            if (settled_before(it))
                continue;
            if (it.state == State::poison) {
                count_poison(it);
                continue;
            }
            apply_horizon(it);
            if (it.reconcile)
                reconcile(it);
            if (it.retry_later)
                add_hold(holds, it.part, it.record.offset, it.retry_failures);
        }
        {
            std::vector<std::size_t> poisoned;
            for (std::size_t i = 0; i < running.size(); ++i)
                if (running[i].state == State::poison && !held(holds, running[i]))
                    poisoned.push_back(i);
            dead_letter(poisoned, holds);
        }
        for (auto& lane : lanes) {
            lane.items.clear();
            lane.holds = holds; // a record held before the transactions is held in every lane
            lane.info = BatchInfo{};
            lane.failed = lane.lost_connection = lane.abandoned = lane.one_by_one = false;
            lane.error = nullptr;
        }
        for (std::size_t i = 0; i < running.size(); ++i)
            if (running[i].state == State::pending)
                lanes[lane_of(running[i])].items.push_back(i);

        auto work = [this](std::size_t n) {
            auto& lane = lanes[n];
            if (lane.items.empty())
                return;
            try {
                run_lane(lane);
            } catch (...) {
                lane.failed = true;
                lane.error = std::current_exception();
            }
        };
        if (!pool) {
            work(0);
            running_done = true;
            return;
        }
        running_done = false;
        pool->start(lanes.size(), work, [this] {
            running_done = true;
            if (polling && consumer_queue)
                rd_kafka_queue_yield(consumer_queue.get()); // a poll waiting for records returns now
        });
        if (!pipelined)
            pool->wait();
    }

    // Waits for the batch in the workers' hands and takes its results: holds
    // and rewinds, positions, counters, the offset commit when it is due.
    // Records of `batch` on a partition rewound here are dropped: they come
    // again after the records the running batch gave back.
    void finish_running()
    {
        if (running.empty())
            return;
        if (pool)
            pool->wait();

        // Merge: a partition stops at the earliest hold of any lane, and at the
        // first unfinished record of a lane whose transaction did not commit.
        Holds holds;
        BatchInfo info;
        bool any_failed = false, lost = false;
        std::exception_ptr error;
        for (auto& lane : lanes) {
            for (const auto& [ps, h] : lane.holds)
                add_hold(holds, ps, h.offset, h.failures);
            if (lane.failed) {
                any_failed = any_failed || !lane.fenced;
                lost = lost || lane.lost_connection;
                if (lane.error && !error)
                    error = lane.error;
                for (std::size_t i : lane.items)
                    if (running[i].state != State::done)
                        add_hold(holds, running[i].part, running[i].record.offset, 0);
                if (lane.lost_connection)
                    lane.db.reset();
                continue;
            }
            info.records += lane.info.records;
            info.claimed += lane.info.claimed;
            info.duplicates += lane.info.duplicates;
        }
        apply_holds(holds, running);
        pause_fenced();
        if (!holds.empty()) {
            batch.erase(std::remove_if(batch.begin(), batch.end(),
                                       [&](const Item& it) { return holds.count(it.part) > 0; }),
                        batch.end());
        }
        if (any_failed && !forced())
            db_hold();
        if (error) {
            running.clear();
            count_in_flight();
            std::rethrow_exception(error);
        }

        const auto committed_at = Clock::now();
        if (info.records) {
            metrics.db_commits.add();
            metrics.batch_records.observe(static_cast<double>(info.records));
            metrics.claimed.add(info.claimed);
            metrics.duplicates.add(info.duplicates);
            if (cfg.hooks.after_db_commit) {
                try {
                    cfg.hooks.after_db_commit(info); // may throw: then nothing below happens
                } catch (...) {
                    running.clear();
                    count_in_flight();
                    throw;
                }
            }
            if (outbox_relay && info.claimed)
                outbox_relay->wake(); // handlers may have enqueued: publish now, not at the next poll
        }
        std::set<PartitionState*> moved;
        for (auto& it : running) {
            if (held(holds, it))
                continue;
            it.state = State::done;
            it.part->processed_next = std::max(it.part->processed_next, it.record.offset + 1);
            moved.insert(it.part);
            it.part->fenced = 0;
            if (!it.part->failures.empty())
                forget_failures(it);
        }
        for (auto* ps : moved)
            ps->dead_lettered.erase(ps->dead_lettered.begin(), ps->dead_lettered.lower_bound(ps->processed_next));
        running.clear();
        count_in_flight();
        if (offset_store && positions_after_merge() && !moved.empty() && !store_merged_positions(moved))
            return; // not stored: Kafka must not get ahead of the database either
        if (info.records && !uncommitted_since)
            uncommitted_since = committed_at;
        if (committed_at >= next_commit_at)
            flush_commits();
    }

    // finish_running() in a librdkafka callback: an exception must not cross
    // librdkafka's frames, so it is kept and thrown after the poll returns,
    // and nothing more is committed meanwhile (as after a crash).
    void finish_running_in_callback() noexcept
    {
        try {
            finish_running();
        } catch (...) {
            no_commit = true;
            if (!deferred_error)
                deferred_error = std::current_exception();
        }
    }

    // Sends the positions committed in PostgreSQL since the last commit (see
    // ConsumerConfig::commit_interval).
    void flush_commits()
    {
        const auto now = Clock::now();
        commit_positions(nullptr, true);
        if (uncommitted_since)
            metrics.commit_delay_seconds.observe(std::chrono::duration<double>(now - *uncommitted_since).count());
        uncommitted_since.reset();
        next_commit_at = now + cfg.commit_interval;
    }

    bool store_merged_positions(const std::set<PartitionState*>& moved)
    {
        std::vector<OffsetStore::Position> positions;
        for (auto& [tp, ps] : parts)
            if (moved.count(&ps))
                positions.push_back({tp.topic, tp.partition, ps.processed_next, ps.epoch});
        auto& db = lanes.front().db;
        if (!db) {
            // Lost in this batch (by another worker's lane, too): ensure_db()
            // reconnects; the positions go with the partition's next batch.
            say(LogLevel::warning, "positions not stored: no PostgreSQL connection (records are redelivered and "
                                   "deduplicated)");
            return false;
        }
        try {
            pqxx::work tx(*db);
            pg::open_for_writes(tx);
            write_positions(tx, positions);
            tx.commit();
            return true;
        } catch (const Fenced&) {
            pause_fenced();
            return false;
        } catch (const std::exception& e) {
            say(LogLevel::warning, error_field(e.what()),
                "storing positions failed (records are redelivered and deduplicated): {}", e.what());
            if (!db->is_open())
                db.reset();
            return false;
        }
    }

    // Rewinds every held partition to its hold; a hold after handler failures
    // also pauses the partition for the backoff (other partitions go on).
    void apply_holds(const Holds& holds, const std::vector<Item>& items)
    {
        const auto now = Clock::now();
        for (const auto& [ps, h] : holds) {
            const Item* first = nullptr;
            for (const auto& it : items)
                if (it.part == ps) {
                    first = &it;
                    break;
                }
            if (!first)
                continue;
            const std::string topic(first->record.topic);
            rewind(*ps, topic, first->record.partition, h.offset);
            if (h.failures > 0) {
                ps->retry_paused = true;
                ps->resume_at = now + backoff_for(h.failures, cfg.retry_backoff, cfg.retry_backoff_max);
                pause_one(topic, first->record.partition, true);
            }
        }
    }

    // A refused position write means another member took the partition over
    // in the offset table. Usually this member lost it in Kafka too and hears
    // so at its next poll; the partition waits (a backoff growing with each
    // refusal in a row) and, if it is still ours then (after an operator's
    // `idemkafka-admin offsets set`, say), is taken over again from the
    // stored position, instead of being rewound and refused forever.
    void pause_fenced()
    {
        std::vector<TopicPartition> fenced;
        {
            std::lock_guard<std::mutex> lock(fenced_mu);
            fenced.swap(fenced_parts);
        }
        const auto now = Clock::now();
        for (const auto& tp : fenced) {
            auto* ps = state_of(tp.topic, tp.partition);
            if (!ps || ps->retake)
                continue;
            ++ps->fenced;
            ps->retake = true;
            ps->retry_paused = true;
            const auto wait = backoff_for(ps->fenced, milliseconds(1000), milliseconds(30000));
            ps->resume_at = now + wait;
            pause_one(tp.topic, tp.partition, true);
            say(LogLevel::warning, coordinates(tp.topic, tp.partition, ps->processed_next),
                "{}/{} is owned by another member in the offset table; paused for {} ms, then taken over again "
                "from the stored position unless a rebalance revokes it first",
                tp.topic, tp.partition, wait.count());
        }
    }

    // Nothing of the batch is processed (PostgreSQL unavailable): every
    // partition goes back to its first record.
    void rewind_batch()
    {
        Holds holds;
        for (const auto& it : batch)
            add_hold(holds, it.part, it.record.offset, 0);
        apply_holds(holds, batch);
        batch.clear();
        count_in_flight();
    }

    // ---- lifecycle --------------------------------------------------------

    void run()
    {
        lanes = std::vector<Lane>(cfg.workers);
        // A hand-over per record costs two thread wake-ups, more than the
        // overlap saves: max_batch = 1 runs one record after the other.
        pipelined = cfg.pipeline && cfg.max_batch > 1;
        if (cfg.workers > 1 || pipelined)
            pool = std::make_unique<LanePool>(cfg.workers);
        try {
            for (std::size_t i = 0; i < lanes.size(); ++i)
                connect_lane(lanes[i], i == 0);
        } catch (const ConfigError& e) {
            throw ConfigError(secrets(e.what()));
        } catch (const DatabaseError& e) {
            throw DatabaseError(secrets(e.what()));
        } catch (const std::exception& e) {
            throw DatabaseError(secrets(fmt::format("cannot start: PostgreSQL: {}", e.what())));
        }
        if (cfg.retention.maintenance)
            maintenance = std::make_unique<MaintenanceRunner>(cfg.postgres, store, cfg.retention, log);
        if (cfg.oldest_claim_refresh.count() > 0)
            claim_age = std::make_unique<ClaimAgeMonitor>(cfg.postgres, store, cfg.group_id, cfg.oldest_claim_refresh,
                                                          metrics.oldest_claim_unix_ms, log);
        if (cfg.outbox && cfg.outbox->relay) {
            auto oc = *cfg.outbox;
            auto user_hook = oc.relay_options.hooks.after_cycle;
            oc.relay_options.hooks.after_cycle = [this, user_hook](std::size_t published, std::size_t failed) {
                metrics.outbox_published.add(published);
                metrics.outbox_failures.add(failed);
                if (user_hook)
                    user_hook(published, failed);
            };
            outbox_relay = OutboxRelay::for_consumer(oc, cfg.postgres, cfg.brokers, cfg.kafka, log);
            outbox_relay->start();
        }
        create_consumer();

        while (stop_requests.load() == 0) {
            housekeeping();
            check_prefetch(true);
            fill_batch(); // pipeline: meanwhile the workers process the running batch
            check_prefetch(false);
            if (!batch.empty())
                decode_all();
            finish_running();
            const bool db_ready = ensure_db();
            if (batch.empty())
                continue;
            if (!db_ready) {
                rewind_batch();
                continue;
            }
            launch();
            if (!pipelined)
                finish_running();
        }
        shutdown();
    }

    void shutdown()
    {
        // Positions of batches already committed in PostgreSQL are always safe
        // to commit, also on a forced stop; unfinished work is not committed.
        finish_running();
        batch.clear();
        count_in_flight();
        commit_positions(nullptr, false);
        say(LogLevel::info, "closing consumer{}", forced() ? " (forced)" : "");
        fetch_wakeup.reset();   // uses the handle
        consumer_queue.reset(); // before the close
        close_consumer();
        maintenance.reset();
        claim_age.reset();
        outbox_relay.reset();
        lanes.clear();
    }
};

Engine::Engine(ConsumerConfig config, Stage& stage)
{
    config.validate();
    impl_ = std::make_unique<Impl>(std::move(config), stage);
}

Engine::~Engine() = default;

void Engine::run()
{
    impl_->run();
}

void Engine::stop() noexcept
{
    impl_->stop_requests.fetch_add(1);
}

const Metrics& Engine::metrics() const noexcept
{
    return impl_->metrics;
}

const ConsumerConfig& Engine::config() const noexcept
{
    return impl_->cfg;
}

} // namespace idemkafka::detail
