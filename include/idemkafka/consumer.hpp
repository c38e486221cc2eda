#pragma once
/// \file
/// IdempotentConsumer<Event>: a Kafka consumer whose handler's effects are
/// committed at most once per (event id, consumer group).

#include <functional>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <pqxx/pqxx>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/detail/engine.hpp"
#include "idemkafka/error.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka {

/// Consumes `config.topics` in group `config.group_id` and, for each record:
/// decodes it, takes its event id, and in one PostgreSQL transaction claims the
/// id in the dedup table and runs the handler only if the claim is new. Up to
/// `max_batch` records share one transaction and one claim statement. Kafka
/// offsets are committed (explicitly, per partition) only after that
/// transaction has committed. A handler that throws rolls the transaction back;
/// the record is delivered again after a backoff and the partition's offset
/// does not move past it, while other records of the batch commit.
template <class Event>
class IdempotentConsumer {
public:
    /// Turns a record's payload into an Event; throw (DecodeError or anything)
    /// for a record that cannot be decoded.
    using Decoder = std::function<Event(const Record&)>;
    /// Returns the event id carried in the event's payload.
    using EventIdOf = std::function<EventId(const Event&)>;
    /// Applies the event's business effect inside `tx`. Throwing rolls back.
    using Handler = std::function<void(pqxx::work& tx, const Event& event, const Context& ctx)>;

    /// `decode` may take `const Record&` or just the payload (`std::string_view`;
    /// a null payload is then a decode error). Throws ConfigError for invalid
    /// configuration. Nothing connects until run().
    template <class Decode>
    IdempotentConsumer(ConsumerConfig config, Decode&& decode, EventIdOf event_id_of, Handler handler)
        : stage_(wrap_decoder(std::forward<Decode>(decode)), std::move(event_id_of), std::move(handler)),
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
    class TypedStage final : public detail::Stage {
    public:
        TypedStage(Decoder d, EventIdOf id, Handler h)
            : decode_(std::move(d)), id_of_(std::move(id)), handle_(std::move(h))
        {
        }
        void prepare(std::size_t n) override
        {
            slots_.clear();
            slots_.resize(n);
        }
        EventId decode(std::size_t i, const Record& record) override
        {
            slots_[i].emplace(decode_(record));
            return id_of_(*slots_[i]);
        }
        void handle(std::size_t i, pqxx::work& tx, const Context& ctx) override { handle_(tx, *slots_[i], ctx); }

    private:
        Decoder decode_;
        EventIdOf id_of_;
        Handler handle_;
        std::vector<std::optional<Event>> slots_;
    };

    template <class Decode>
    static Decoder wrap_decoder(Decode&& decode)
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

    TypedStage stage_;
    detail::Engine engine_;
};

} // namespace idemkafka
