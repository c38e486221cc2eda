// The two modes written against librdkafka directly: the raw consumption
// ceiling (no database) and the naive listener a user would write by hand.

#include <memory>
#include <thread>

#include <fmt/format.h>
#include <librdkafka/rdkafka.h>

#include "modes.hpp"
#include "pg/exec.hpp"

namespace idemkafka::bench {

namespace {

struct RkDeleter {
    void operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
};
struct MessageDeleter {
    void operator()(rd_kafka_message_t* p) const noexcept { rd_kafka_message_destroy(p); }
};
struct ListDeleter {
    void operator()(rd_kafka_topic_partition_list_t* p) const noexcept { rd_kafka_topic_partition_list_destroy(p); }
};
using RkPtr = std::unique_ptr<rd_kafka_t, RkDeleter>;
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;
using ListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, ListDeleter>;

// A subscribed consumer in group `group` with the properties every Kafka mode shares.
RkPtr subscribe(const RunEnv& env, const Job& job, const std::string& group, std::map<std::string, std::string> extra)
{
    auto props = common_consumer_props();
    for (const auto& [k, v] : env.consumer_props)
        props[k] = v;
    for (auto& [k, v] : extra)
        props[k] = std::move(v);
    props["bootstrap.servers"] = env.services.brokers;
    props["group.id"] = group;
    if (!env.verbose)
        props["log_level"] = std::string("3"); // not "3": g++ 12 -Wrestrict false positive in C++20 (GCC PR 105651)
    char err[512];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    for (const auto& [k, v] : props) {
        if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
            rd_kafka_conf_destroy(conf);
            throw std::runtime_error(fmt::format("{}={}: {}", k, v, err));
        }
    }
    RkPtr rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err));
    if (!rk) {
        rd_kafka_conf_destroy(conf);
        throw std::runtime_error(fmt::format("cannot create consumer: {}", err));
    }
    rd_kafka_poll_set_consumer(rk.get());
    ListPtr topics(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(topics.get(), job.topic.c_str(), RD_KAFKA_PARTITION_UA);
    if (auto e = rd_kafka_subscribe(rk.get(), topics.get()))
        throw std::runtime_error(fmt::format("subscribe: {}", rd_kafka_err2str(e)));
    return rk;
}

bool assigned(rd_kafka_t* rk)
{
    rd_kafka_topic_partition_list_t* list = nullptr;
    if (rd_kafka_assignment(rk, &list) != RD_KAFKA_RESP_ERR_NO_ERROR || !list)
        return false;
    const bool any = list->cnt > 0;
    rd_kafka_topic_partition_list_destroy(list);
    return any;
}

// Progress bookkeeping shared by both loops: declares the run stuck when no
// new record arrives for too long.
class Progress {
public:
    explicit Progress(const Job& job) : job_(job), last_(SteadyClock::now()) {}
    void advanced()
    {
        last_ = SteadyClock::now();
        any_ = true;
    }
    // Non-empty: the reason the run is given up.
    std::string stuck(std::size_t done) const
    {
        const auto limit = any_ ? std::chrono::duration_cast<std::chrono::seconds>(stall_timeout)
                                : std::chrono::duration_cast<std::chrono::seconds>(first_record_timeout);
        if (SteadyClock::now() - last_ < limit)
            return {};
        return fmt::format("lost: only {} of {} records arrived (no progress for {} s)", done, job_.count,
                           limit.count());
    }

private:
    const Job& job_;
    SteadyClock::time_point last_;
    bool any_ = false;
};

void close_consumer(rd_kafka_t* rk)
{
    rd_kafka_consumer_close(rk);
}

struct Drained {
    std::uint64_t delivered = 0; ///< records polled, repeats included
    std::size_t distinct = 0;
    std::string stuck; ///< why the drain gave up; empty when every record came
};

// Polls `rk` until each of the job's records came once: `before_poll()` ahead
// of every poll, `first(record, steady_us, distinct so far)` for a record's
// first delivery.
template <class BeforePoll, class First>
Drained drain(rd_kafka_t* rk, const Job& job, BeforePoll before_poll, First first)
{
    SeenSet seen(job.count);
    Progress progress(job);
    Drained out;
    while (seen.distinct() < job.count) {
        before_poll();
        MessagePtr m(rd_kafka_consumer_poll(rk, 100));
        if (!m || m->err) {
            out.stuck = progress.stuck(seen.distinct());
            if (!out.stuck.empty())
                break;
            continue;
        }
        const std::int64_t now_s = steady_us();
        ++out.delivered;
        const auto d = decode_payload(std::string_view(static_cast<const char*>(m->payload), m->payload ? m->len : 0));
        if (seen.mark(d.seq)) {
            first(d, now_s, seen.distinct());
            progress.advanced();
        }
    }
    out.distinct = seen.distinct();
    return out;
}

} // namespace

void run_kafka_raw(const RunEnv& env, const Job& job, RunState& st)
{
    // No commits at all: the ceiling is the fetch path alone.
    auto rk =
        subscribe(env, job, group_of(job), {{"enable.auto.commit", "false"}, {"enable.auto.offset.store", "false"}});
    bool ready = false;
    const auto drained = drain(
        rk.get(), job,
        [&] {
            if (!ready && assigned(rk.get())) {
                ready = true;
                st.ready();
            }
        },
        [&](const Decoded& d, std::int64_t now_s, std::size_t distinct) {
            if (st.first_taken_us < 0)
                st.first_taken_us = now_s;
            if (st.measured(d.seq, job))
                st.latency.record(d.produced_us, -1, wall_us(), now_s);
            st.last_commit_us = now_s;
            st.set_processed(distinct);
        });
    st.take_cpu_after(*env.meter);
    close_consumer(rk.get());
    if (!drained.stuck.empty())
        st.result.errors.push_back(drained.stuck);
    if (drained.delivered > drained.distinct)
        st.result.notes.push_back(
            fmt::format("{} records delivered more than once", drained.delivered - drained.distinct));
}

std::vector<std::uint32_t> read_fetch_order(const RunEnv& env, const Job& job)
{
    auto rk = subscribe(env, job, fmt::format("ikbench-order-{}", job.serial),
                        {{"enable.auto.commit", "false"}, {"enable.auto.offset.store", "false"}});
    std::vector<std::uint32_t> order;
    order.reserve(job.count);
    const auto drained = drain(
        rk.get(), job, [] {},
        [&](const Decoded& d, std::int64_t, std::size_t) { order.push_back(static_cast<std::uint32_t>(d.seq)); });
    close_consumer(rk.get());
    if (!drained.stuck.empty())
        throw std::runtime_error(drained.stuck);
    return order;
}

void run_naive_listener(const RunEnv& env, const Job& job, RunState& st)
{
    const std::string group = group_of(job);
    auto rk = subscribe(env, job, group, {{"enable.auto.commit", "false"}, {"enable.auto.offset.store", "false"}});
    pqxx::connection db(env.services.postgres);
    // Written the way such listeners usually are: ad-hoc parameterised
    // statements, look before inserting, commit the offset right after.
    const std::string check =
        fmt::format("SELECT 1 FROM {} WHERE event_id = $1::uuid AND consumer_group = $2", st.tables.claims_q);
    const std::string insert_claim =
        fmt::format("INSERT INTO {} (event_id, consumer_group) VALUES ($1::uuid, $2)", st.tables.claims_q);

    SeenSet seen(job.count);
    Progress progress(job);
    bool ready = false;
    std::uint64_t commit_failures = 0;
    while (seen.distinct() < job.count) {
        if (!ready && assigned(rk.get())) {
            ready = true;
            st.ready();
        }
        MessagePtr m(rd_kafka_consumer_poll(rk.get(), 100));
        if (!m || m->err) {
            if (auto why = progress.stuck(seen.distinct()); !why.empty()) {
                st.result.errors.push_back(why);
                break;
            }
            continue;
        }
        const std::int64_t taken = steady_us();
        if (st.first_taken_us < 0)
            st.first_taken_us = taken;
        const auto d = decode_payload(std::string_view(static_cast<const char*>(m->payload), m->payload ? m->len : 0));
        const std::string key(static_cast<const char*>(m->key), m->key ? m->key_len : 0);

        pqxx::work tx(db);
        const bool fresh = detail::pg::exec_params(tx, check, d.id_text.data(), group).empty();
        if (fresh) {
            detail::pg::exec_params(tx, insert_claim, d.id_text.data(), group);
            detail::pg::exec_params(tx, st.tables.insert_effect, d.id_text.data(), key, amount_of(d.id), d.produced_us);
        }
        tx.commit();
        ++st.result.transactions;
        const std::int64_t now_s = steady_us();
        st.last_commit_us = now_s;
        if (fresh) {
            if (st.measured(d.seq, job))
                st.latency.record(d.produced_us, taken, wall_us(), now_s);
            ++st.effects_reported;
        }
        if (rd_kafka_commit_message(rk.get(), m.get(), 0) != RD_KAFKA_RESP_ERR_NO_ERROR)
            ++commit_failures;
        if (seen.mark(d.seq)) {
            st.set_processed(seen.distinct());
            progress.advanced();
        }
    }
    st.take_cpu_after(*env.meter);
    close_consumer(rk.get());
    if (commit_failures)
        st.result.notes.push_back(fmt::format("{} synchronous offset commits failed", commit_failures));
}

} // namespace idemkafka::bench
