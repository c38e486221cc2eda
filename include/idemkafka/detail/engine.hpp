#pragma once
// Internal: the non-template half of IdempotentConsumer. Not part of the API.

#include <cstddef>
#include <memory>

#include <pqxx/pqxx>

#include "idemkafka/config.hpp"
#include "idemkafka/context.hpp"
#include "idemkafka/event_id.hpp"
#include "idemkafka/metrics.hpp"

namespace idemkafka::detail {

/// The typed half: decodes records into slots and runs the handler on them.
/// Slots come in two banks, so that one batch can be decoded while the
/// handler runs on the one before it.
class Stage {
public:
    static constexpr std::size_t banks = 2;

    virtual ~Stage() = default;
    /// Makes room for `n` decoded events in `bank`; called once per batch.
    virtual void prepare(std::size_t bank, std::size_t n) = 0;
    /// Decodes `record` into slot `i` of `bank` and returns its event id.
    /// Throws DecodeError (or anything else) for an undecodable record and
    /// InvalidEventId for a record without a usable id.
    virtual EventId decode(std::size_t bank, std::size_t i, const Record& record) = 0;
    /// Runs the user's handler on slot `i` of `bank`.
    virtual void handle(std::size_t bank, std::size_t i, pqxx::work& tx, const Context& ctx) = 0;
    /// True when the user gave a batch handler: handle_batch() replaces handle().
    virtual bool batched() const noexcept = 0;
    /// Runs the user's batch handler on slots index[0..n) of `bank` with their contexts.
    virtual void handle_batch(std::size_t bank, pqxx::work& tx, const std::size_t* index, const Context* contexts,
                              std::size_t n) = 0;
};

class Engine {
public:
    Engine(ConsumerConfig config, Stage& stage);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    void run();
    void stop() noexcept;
    const Metrics& metrics() const noexcept;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace idemkafka::detail
