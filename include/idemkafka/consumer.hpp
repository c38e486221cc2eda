#pragma once
/// \file
/// IdempotentConsumer<Event>: a Kafka consumer whose handler's effects are
/// committed at most once per (event id, consumer group).

#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pqxx/transaction>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

/// The events of one transaction that a batch handler applies: every record of
/// the batch whose claim is new, in record order (a re-sent event appears once).
/// Views stay valid during the handler call only.
template <class Event> class Batch {
public:
    /// One claimed event and its record's context.
    struct Entry {
        const Event& event;     ///< the decoded event
        const Context& context; ///< its record's context
    };

    /// A forward iterator over the batch's Entry values, in record order.
    class iterator {
    public:
        using iterator_category = std::forward_iterator_tag; ///< a forward iterator
        using value_type = Entry;                            ///< what it yields
        using difference_type = std::ptrdiff_t;              ///< distance between positions
        using pointer = void;                                ///< none: Entry is yielded by value
        using reference = Entry;                             ///< Entry, by value

        /// The position `pos` of `batch`; Batch::begin() and Batch::end() make them.
        iterator(const Batch* batch, std::size_t pos) noexcept : batch_(batch), pos_(pos) {}
        /// The Entry at this position.
        Entry operator*() const { return (*batch_)[pos_]; }
        /// Advances to the next event.
        iterator& operator++() noexcept
        {
            ++pos_;
            return *this;
        }
        /// Advances to the next event, returning the previous position.
        iterator operator++(int) noexcept
        {
            auto old = *this;
            ++pos_;
            return old;
        }
        /// Same position; only iterators of one batch compare.
        friend bool operator==(const iterator& a, const iterator& b) noexcept { return a.pos_ == b.pos_; }
        /// Different positions.
        friend bool operator!=(const iterator& a, const iterator& b) noexcept { return a.pos_ != b.pos_; }

    private:
        const Batch* batch_;
        std::size_t pos_;
    };

    /// Built by the consumer for each handler call: `size` claimed events, the i-th being
    /// `slots[index[i]]` with context `contexts[i]`.
    Batch(const std::optional<Event>* slots, const std::size_t* index, const Context* contexts,
          std::size_t size) noexcept
        : slots_(slots), index_(index), contexts_(contexts), size_(size)
    {
    }

    /// Number of events (at least 1).
    std::size_t size() const noexcept { return size_; }
    /// Never true for a batch handed to a handler.
    bool empty() const noexcept { return size_ == 0; }
    /// The i-th event in record order; `i < size()`.
    Entry operator[](std::size_t i) const { return Entry{*slots_[index_[i]], contexts_[i]}; }
    /// The first event.
    iterator begin() const noexcept { return iterator(this, 0); }
    /// Past the last event.
    iterator end() const noexcept { return iterator(this, size_); }

private:
    const std::optional<Event>* slots_;
    const std::size_t* index_;
    const Context* contexts_;
    std::size_t size_;
};

namespace detail {

// The non-template half of IdempotentConsumer, compiled into the library
// (src/engine.cpp). Not part of the API; exported because the template calls it.

/// The typed half: decodes records into slots and runs the handler on them.
/// The slots are sized once, before any record is decoded; the poll thread
/// decodes into the slots of one unit of work while workers run the handler
/// on the slots of others, so a slot belongs to one unit at a time.
class IDEMKAFKA_API Stage {
public:
    virtual ~Stage() = default;
    /// Makes room for `n` decoded events; called once, before any decode().
    virtual void reserve(std::size_t n) = 0;
    /// Decodes `record` into slot `slot` (less than reserve()'s `n`) and returns
    /// its event id. Throws DecodeError (or anything else) for an undecodable
    /// record and InvalidEventId for a record without a usable id.
    virtual EventId decode(std::size_t slot, const Record& record) = 0;
    /// Runs the user's handler on slot `slot`.
    virtual void handle(std::size_t slot, pqxx::work& tx, const Context& ctx) = 0;
    /// True when the user gave a batch handler: handle_batch() replaces handle().
    virtual bool batched() const noexcept = 0;
    /// Runs the user's batch handler on slots index[0..n) with their contexts.
    virtual void handle_batch(pqxx::work& tx, const std::size_t* index, const Context* contexts, std::size_t n) = 0;
};

/// The Stage of an Event type: the user's decoder, id function and handler
/// (per-record or batch), as IdempotentConsumer and HandlerHarness take them.
template <class Event> class TypedStage final : public Stage {
public:
    using Decoder = std::function<Event(const Record&)>;
    using EventIdOf = std::function<EventId(const Event&)>;
    using RecordEventIdOf = std::function<EventId(const Record&, const Event&)>;
    using Handler = std::function<void(pqxx::work& tx, const Event& event, const Context& ctx)>;
    using BatchHandler = std::function<void(pqxx::work& tx, const Batch<Event>& batch)>;

    template <class Decode, class IdOf, class Handle>
    TypedStage(Decode&& decode, IdOf&& event_id_of, Handle&& handle)
        : decode_(wrap_decoder(std::forward<Decode>(decode))), id_of_(wrap_id_of(std::forward<IdOf>(event_id_of)))
    {
        wrap_handler(std::forward<Handle>(handle));
    }
    void reserve(std::size_t n) override
    {
        slots_.clear();
        slots_.resize(n);
    }
    EventId decode(std::size_t slot, const Record& record) override
    {
        auto& event = slots_[slot];
        event.emplace(decode_(record));
        return id_of_(record, *event);
    }
    void handle(std::size_t slot, pqxx::work& tx, const Context& ctx) override { handle_(tx, *slots_[slot], ctx); }
    bool batched() const noexcept override { return static_cast<bool>(handle_batch_); }
    void handle_batch(pqxx::work& tx, const std::size_t* index, const Context* contexts, std::size_t n) override
    {
        handle_batch_(tx, Batch<Event>(slots_.data(), index, contexts, n));
    }

private:
    template <class Decode> static Decoder wrap_decoder(Decode&& decode)
    {
        if constexpr (std::is_invocable_v<Decode&, const Record&>) {
            return Decoder(std::forward<Decode>(decode));
        } else {
            static_assert(std::is_invocable_v<Decode&, std::string_view>,
                          "decoder must be callable with const idemkafka::Record& or std::string_view");
            return [d = std::forward<Decode>(decode)](const Record& r) mutable -> Event {
                if (!r.value)
                    throw DecodeError("record has a null payload");
                return d(*r.value);
            };
        }
    }

    // Ids in the payload come from the event; ids in headers (CloudEvents'
    // binary mode, Debezium's outbox) need the record.
    template <class IdOf> static RecordEventIdOf wrap_id_of(IdOf&& id_of)
    {
        using F = std::decay_t<IdOf>;
        if constexpr (std::is_invocable_r_v<EventId, F&, const Event&>) {
            return [f = F(std::forward<IdOf>(id_of))](const Record&, const Event& e) mutable -> EventId {
                return std::invoke(f, e);
            };
        } else if constexpr (std::is_invocable_r_v<EventId, F&, const Record&, const Event&>) {
            return RecordEventIdOf(std::forward<IdOf>(id_of));
        } else {
            static_assert(std::is_invocable_r_v<EventId, F&, const Record&>,
                          "event id function must be callable with (const Event&), "
                          "(const idemkafka::Record&, const Event&) or (const idemkafka::Record&)");
            return [f = F(std::forward<IdOf>(id_of))](const Record& r, const Event&) mutable -> EventId {
                return std::invoke(f, r);
            };
        }
    }

    template <class Handle> void wrap_handler(Handle&& handle)
    {
        if constexpr (std::is_invocable_v<Handle&, pqxx::work&, const Event&, const Context&>) {
            handle_ = Handler(std::forward<Handle>(handle));
        } else {
            static_assert(std::is_invocable_v<Handle&, pqxx::work&, const Batch<Event>&>,
                          "handler must be callable with (pqxx::work&, const Event&, const idemkafka::Context&) "
                          "or (pqxx::work&, const idemkafka::Batch<Event>&)");
            handle_batch_ = BatchHandler(std::forward<Handle>(handle));
        }
    }

    Decoder decode_;
    RecordEventIdOf id_of_;
    Handler handle_;
    BatchHandler handle_batch_;
    std::vector<std::optional<Event>> slots_; // never resized while handlers run
};

/// Polls, claims, runs the Stage and commits: everything but the types.
class IDEMKAFKA_API Engine {
public:
    /// Throws ConfigError for an invalid `config`. Keeps a reference to `stage`.
    Engine(ConsumerConfig config, Stage& stage);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    /// IdempotentConsumer::run().
    void run();
    /// IdempotentConsumer::stop().
    void stop() noexcept;
    /// IdempotentConsumer::metrics().
    const Metrics& metrics() const noexcept;

private:
    struct IDEMKAFKA_LOCAL Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace detail

/// Consumes `config.topics` in group `config.group_id` and, for each record:
/// decodes it, takes its event id, and in one PostgreSQL transaction claims the
/// id in the dedup table and runs the handler only if the claim is new. Up to
/// `max_batch` records share one transaction and one claim statement. Kafka
/// offsets are committed (explicitly, per partition) only after that
/// transaction has committed. A handler that throws rolls the transaction back;
/// the record is delivered again after a backoff and the partition's offset
/// does not move past it, while other records of the batch commit.
///
/// The handler comes in two forms. A per-record handler
/// `void(pqxx::work&, const Event&, const Context&)` is called once per newly
/// claimed record. A batch handler `void(pqxx::work&, const Batch<Event>&)` is
/// called once per transaction with all of them, so it can write every row of
/// the batch with one statement (`INSERT ... SELECT * FROM unnest(...)`): the
/// fastest way through PostgreSQL. When a batch handler throws, the transaction
/// rolls back and runs again with the handler called for one event at a time
/// (a `Batch` of size 1), which finds the failing record; that record is then
/// retried or dead-lettered like any other, and the rest commits.
template <class Event> class IdempotentConsumer {
public:
    /// Turns a record's payload into an Event; throw (DecodeError or anything)
    /// for a record that cannot be decoded.
    using Decoder = typename detail::TypedStage<Event>::Decoder;
    /// Returns the event id carried in the event's payload.
    using EventIdOf = typename detail::TypedStage<Event>::EventIdOf;
    /// Returns the event id of a record whose id is outside the payload (in
    /// a header, say) or made of both.
    using RecordEventIdOf = typename detail::TypedStage<Event>::RecordEventIdOf;
    /// Applies the event's business effect inside `tx`. Throwing rolls back.
    using Handler = typename detail::TypedStage<Event>::Handler;
    /// Applies the effects of all newly claimed events of a transaction inside
    /// `tx`. Throwing rolls back (see the class comment for what follows).
    using BatchHandler = typename detail::TypedStage<Event>::BatchHandler;

    /// `decode` may take `const Record&` or just the payload (`std::string_view`;
    /// a null payload is then a decode error). `event_id_of` is called after
    /// `decode` with `(const Event&)` (an EventIdOf: the id in the payload),
    /// `(const Record&, const Event&)` (a RecordEventIdOf) or `(const Record&)`
    /// (the id in headers: cloud_event_record_id, DebeziumOutboxId), whichever
    /// it takes, in that order; it throws MissingEventId or InvalidEventId for
    /// a record without a usable id. `handle` is a per-record Handler or a
    /// BatchHandler (chosen by what it can be called with). Throws ConfigError
    /// for invalid configuration. Nothing connects until run().
    template <class Decode, class IdOf, class Handle>
    IdempotentConsumer(ConsumerConfig config, Decode&& decode, IdOf&& event_id_of, Handle&& handle)
        : stage_(std::forward<Decode>(decode), std::forward<IdOf>(event_id_of), std::forward<Handle>(handle)),
          engine_(std::move(config), stage_)
    {
    }

    IdempotentConsumer(const IdempotentConsumer&) = delete;
    IdempotentConsumer& operator=(const IdempotentConsumer&) = delete;

    /// Connects to PostgreSQL and Kafka, creates the dedup table when
    /// `create_schema` is set, subscribes, and processes records until stop().
    /// Returns after the last batch committed and the consumer left the group.
    /// Throws DatabaseError/KafkaError when start-up fails, and whatever a
    /// Hooks callback throws.
    void run() { engine_.run(); }

    /// Asks run() to finish the current batch, commit, leave the group and
    /// return. A second call abandons the current batch (rolled back, offsets
    /// not committed). Async-signal-safe: only sets an atomic flag.
    void stop() noexcept { engine_.stop(); }

    /// Live counters; safe to read from any thread.
    const Metrics& metrics() const noexcept { return engine_.metrics(); }

private:
    detail::TypedStage<Event> stage_;
    detail::Engine engine_;
};

} // namespace idemkafka
