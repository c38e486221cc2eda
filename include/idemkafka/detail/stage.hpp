#pragma once
// What IdempotentConsumer<Event> is built from, not part of the API: the
// typed Stage (decoder, event id function, handler and the decoded events'
// slots) and the Engine compiled into the library that polls, claims, runs
// the Stage and commits. Included by idemkafka/consumer.hpp.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pqxx/transaction>

#include "idemkafka/batch.hpp"
#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/export.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

namespace detail {

// The non-template half of IdempotentConsumer, compiled into the library
// (src/consumer/engine*.cpp). Not part of the API; exported because the
// template calls it.

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

} // namespace idemkafka
