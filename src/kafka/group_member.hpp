#pragma once
// The Kafka side of the consumer: the librdkafka client, its callbacks, the
// group's assignment under the eager, cooperative and consumer (KIP-848)
// protocols, seek, pause and resume, offset commits, watermarks, statistics
// and the prefetch queue. It reports assignments and revocations to its
// owner and knows nothing about PostgreSQL. Private to the library.
//
// Records go out round-robin across partitions: librdkafka hands them out in
// runs of one partition (a fetch response's share of it), so poll() takes
// what the client has ready into one queue per partition and returns the
// next partition's head in turn. Per partition the order stays the offset
// order; what is held counts against the prefetch caps. A deferred
// partition's records cannot go out: once they fill the caps' share, its
// fetch is paused until half of what it held has gone out.

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/ledger.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/metrics.hpp"
#include "idemkafka/redact.hpp"
#include "kafka/client.hpp"
#include "kafka/commit_hold.hpp"
#include "kafka/fetch_wakeup.hpp"
#include "kafka/group_settings.hpp"
#include "kafka/latest_stats.hpp"
#include "kafka/prefetch_caps.hpp"
#include "kafka/stats.hpp"
#include "kafka/wake_pacer.hpp"
#include "observe/log_context.hpp"

namespace idemkafka::detail::kafka {

/// No offset (librdkafka's RD_KAFKA_OFFSET_INVALID): no commit yet.
inline constexpr std::int64_t offset_invalid = RD_KAFKA_OFFSET_INVALID;
/// The logical offset "the end of the partition" (RD_KAFKA_OFFSET_END).
inline constexpr std::int64_t offset_end = RD_KAFKA_OFFSET_END;
/// A committed offset the broker reported an error for.
inline constexpr std::int64_t offset_unknown = INT64_MIN;

/// What the consumer reports to its owner, on the thread that polls (inside
/// GroupMember::poll() and GroupMember::close()).
class GroupEvents {
public:
    virtual ~GroupEvents() = default;
    /// Partitions are assigned. The owner may set a start offset for each
    /// (leave it at RD_KAFKA_OFFSET_INVALID for the committed offset) and
    /// returns true to keep them all paused.
    virtual bool assigned(std::vector<std::pair<TopicPartition, std::int64_t>>& start) = 0;
    /// Partitions are revoked (or `lost`: another member may own them
    /// already). The owner settles what runs for them and drops their state;
    /// after a revoke that is not a loss it may commit their positions first
    /// (GroupMember::commit, synchronous).
    virtual void revoked(const std::set<TopicPartition>& parts, bool lost) = 0;
    /// An offset commit for one partition failed; it is to be sent again.
    virtual void commit_failed(const TopicPartition& tp, std::int64_t offset) = 0;
};

class GroupMember {
public:
    /// Creates the client with the consumer's settings and subscribes.
    /// Throws ConfigError for a refused property, KafkaError otherwise.
    GroupMember(const ConsumerConfig& cfg, GroupEvents& events, Metrics& metrics, LogSink sink,
                const Redactor& secrets);
    ~GroupMember();
    GroupMember(const GroupMember&) = delete;
    GroupMember& operator=(const GroupMember&) = delete;

    /// The next record (or consumer error, or nothing after `timeout`);
    /// rebalances are served inside, through GroupEvents. Records of
    /// different partitions come round-robin, each partition's in offset
    /// order; a paused partition's held records wait for its resume.
    MessagePtr poll(std::chrono::milliseconds timeout);
    /// Records taken from librdkafka and held for the round-robin (with their
    /// payload and key bytes): part of the prefetch.
    std::size_t held_records() const noexcept { return caps_.records(); }
    std::size_t held_bytes() const noexcept { return caps_.bytes(); }
    /// Partitions with a queue of held records (and their pause and defer
    /// flags): at most the assigned ones.
    std::size_t queues() const noexcept { return queues_.size(); }
    /// Counts and logs a consumer error; throws KafkaError when it is fatal.
    void consumer_error(const rd_kafka_message_t& m);
    /// A poll waiting for records returns now (from any thread).
    void wake_poll() noexcept;

    /// The topic of a message (not an error).
    static const char* topic_of(const rd_kafka_message_t& m) { return rd_kafka_topic_name(m.rkt); }
    /// The record fields of a message (views into it: it must outlive them): record_of().
    static void read(const rd_kafka_message_t& m, Record& record);

    enum class SeekResult { done, queued, failed };
    /// Moves the fetch position of `tp` to `offset`: nothing fetched before
    /// is delivered any more (held records of `tp` are dropped). `queued` when the call timed out waiting for
    /// the reply: the seek still takes effect. `failed`: to be sent again.
    SeekResult seek(const TopicPartition& tp, std::int64_t offset);
    void pause(const TopicPartition& tp, bool pause);
    /// Holds back what is fetched of `tp` (poll() hands out other partitions'
    /// records meanwhile) without pausing its fetch: for a partition whose
    /// earlier records are still being processed, so its later ones do not
    /// fill the consumer's memory ahead of records that could run.
    void defer(const TopicPartition& tp, bool defer);
    /// Pauses the whole assignment, or resumes it except `keep_paused`.
    void pause_assignment(bool pause, const std::set<TopicPartition>& keep_paused = {});

    /// Commits explicit offsets, each with its metadata. Asynchronous, or
    /// synchronous within `bound` (a commit not confirmed by then is left
    /// pending, and counts as sent). Failed partitions are reported through
    /// GroupEvents::commit_failed.
    void commit(const std::vector<OffsetCommit>& offsets, bool async, std::chrono::milliseconds bound);
    /// True while the periodic offset commits wait for the group to finish a
    /// rebalance (the classic protocol only): from a commit refused with
    /// REBALANCE_IN_PROGRESS or ILLEGAL_GENERATION, or a revoke, until the
    /// assignment that ends this member's part in the rebalance (a
    /// cooperative one has two rounds), at most session.timeout.ms. A commit
    /// sent meanwhile carries a generation the group is leaving; librdkafka
    /// before 2.10 answers its ILLEGAL_GENERATION by dropping the whole
    /// assignment and rejoining, which starts the next rebalance (librdkafka
    /// issue 4059). Also true while an asynchronous commit waits for its
    /// answer (at most session.timeout.ms), so that no more than one is in
    /// flight: commits sent one after another before the first refusal came
    /// back would each be refused again. The commits of a revoke or a stop
    /// are not held.
    bool commits_held() const noexcept;
    /// Kafka's committed offsets of `tps` (RD_KAFKA_OFFSET_INVALID for none,
    /// offset_unknown for a partition the broker reported an error for);
    /// false when the broker did not answer within `timeout`.
    bool committed(std::vector<std::pair<TopicPartition, std::int64_t>>& tps, std::chrono::milliseconds timeout);
    /// The same, with each committed offset's metadata.
    bool committed(std::vector<OffsetCommit>& tps, std::chrono::milliseconds timeout);
    /// True while the partition is paused or deferred by its owner, or its
    /// fetch is paused for the prefetch caps.
    bool held_back(const TopicPartition& tp);
    /// The client's cached low and high watermarks (-1 when unknown).
    std::pair<std::int64_t, std::int64_t> watermarks(const TopicPartition& tp);
    /// The partition's low and high watermarks asked of its leader (not the
    /// group coordinator); nullopt when it did not answer within `timeout`.
    std::optional<std::pair<std::int64_t, std::int64_t>> query_watermarks(const TopicPartition& tp,
                                                                          std::chrono::milliseconds timeout);
    /// The latest statistics per partition (empty without statistics.interval.ms).
    std::map<TopicPartition, StatsEntry> statistics();

    /// Called around filling a batch: wakes librdkafka's fetchers (before 2.1)
    /// once the batch took a queue that had filled below half its caps.
    void check_prefetch(bool before_batch, std::size_t batch_records, std::size_t batch_bytes);

    /// Leaves the group and destroys the client within `bound`; past it the
    /// client goes without leaving (the broker drops the member later).
    void close(std::chrono::milliseconds bound);

    /// auto.offset.reset is latest: a partition without commits starts at the end.
    bool reset_to_latest() const noexcept { return settings_.reset_to_latest(); }
    /// max.poll.interval.ms as configured (librdkafka's default when not).
    std::chrono::milliseconds max_poll_interval() const noexcept { return settings_.max_poll_interval(); }

private:
    // What librdkafka's opaque points to. Shared with a handle destroyed in
    // the background (see destroy()), which may log after the GroupMember is gone.
    struct Relay : ClientOwner {
        GroupMember* consumer = nullptr;
    };
    static GroupMember& of(void* opaque);
    // Destroys the handle with `flags`; past `bound` the destruction goes on
    // in the background, silenced (librdkafka waits there for commits that
    // wait for a coordinator, up to session.timeout.ms).
    void destroy(int flags, std::chrono::milliseconds bound) noexcept;
    void subscribe(const ConsumerConfig& cfg);
    static void rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* parts,
                             void* opaque);
    static void commit_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets,
                          void* opaque);
    static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);
    static int stats_cb(rd_kafka_t* rk, char* json, size_t len, void* opaque);
    void on_rebalance(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list);
    // The two halves of on_rebalance(): partitions assigned to this member, or
    // revoked from it (lost too).
    void on_assign(rd_kafka_topic_partition_list_t* list);
    void on_revoke(rd_kafka_topic_partition_list_t* list);
    void on_commit(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* list);
    void on_error(int err, const char* reason);
    void on_stats(std::string_view json) noexcept;
    rd_kafka_resp_err_t commit_and_wait(rd_kafka_topic_partition_list_t* list, std::chrono::milliseconds bound);

    // One partition's held records, oldest first. `full`: its fetch is
    // paused because its records could not go out while the held ones
    // filled the caps' share; resumed once it holds `resume_at` or fewer
    // (half of what it held then).
    struct Queue {
        std::string topic;
        std::int32_t partition = 0;
        bool paused = false;
        bool deferred = false;
        bool full = false;
        std::size_t resume_at = 0;
        std::deque<MessagePtr> held;
    };
    Queue& queue_of(std::string_view topic, std::int32_t partition);
    Queue* find_queue(std::string_view topic, std::int32_t partition); // null: none, none created
    Queue* hold(MessagePtr m); // its queue (null: an error, kept for poll() to return)
    void pulled(const rd_kafka_message_t* m) noexcept;
    MessagePtr next_held();
    void drop_held(Queue& l);
    void drop_queues(const std::set<TopicPartition>& revoked); // and their held records
    void count_held() noexcept;                                // the prefetched_* gauges
    void pause_full(Queue& l);
    void resume_full(Queue& l);
    void resume(rd_kafka_topic_partition_list_t* list); // and wakes the fetchers
    void log_full_pause(const Queue& l);
    void set_paused(std::string_view topic, std::int32_t partition, bool paused);
    void forget_queues();

    GroupEvents& events_;
    Metrics& metrics_;
    Redactor secrets_;
    LogSink log_; // this thread's lines
    std::chrono::milliseconds shutdown_timeout_;
    std::shared_ptr<Relay> relay_ = std::make_shared<Relay>();
    HandlePtr rk_;
    QueuePtr consumer_queue_; // to wake a poll
    GroupSettings settings_;  // read before the client exists; the protocol observed at each rebalance
    CommitHold commit_hold_;  // commits_held()
    // Holds the periodic commits when `err` refused a commit for a rebalance.
    void hold_if_refused(rd_kafka_resp_err_t err);

    // Wakes the fetchers after a resume, and (librdkafka before 2.1) once the
    // prefetch queue is down to half its caps after it had filled (see FetchWakeup).
    std::unique_ptr<FetchWakeup> fetch_wakeup_;
    std::optional<WakePacer> wake_pacer_; // librdkafka before 2.1: wakes for the prefetch queue too

    // The round-robin (see poll()). Queues of revoked partitions are removed.
    std::deque<Queue> queues_;      // a deque: a Queue (holding a deque) would be copied on a vector's growth
    std::size_t next_queue_ = 0;    // where the round-robin goes on
    std::size_t last_queue_ = 0;    // queue of the last held record (runs of one partition)
    std::deque<MessagePtr> errors_; // consumer errors met while taking records: returned first
    PrefetchCaps caps_;             // what the queues hold, against their share of the caps

    LatestStats stats_;
};

} // namespace idemkafka::detail::kafka
