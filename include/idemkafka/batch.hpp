#pragma once
/// \file
/// Batch<Event>: the events a batch handler applies in one transaction.

#include <cstddef>
#include <iterator>
#include <optional>

#include "idemkafka/context.hpp"

namespace idemkafka {

namespace detail {
template <class Event> class TypedStage;
} // namespace detail

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
    friend class detail::TypedStage<Event>;
    // Built by the consumer for each handler call: `size` claimed events, the
    // i-th being `slots[index[i]]` with context `contexts[i]`.
    Batch(const std::optional<Event>* slots, const std::size_t* index, const Context* contexts,
          std::size_t size) noexcept
        : slots_(slots), index_(index), contexts_(contexts), size_(size)
    {
    }

    const std::optional<Event>* slots_;
    const std::size_t* index_;
    const Context* contexts_;
    std::size_t size_;
};

} // namespace idemkafka
