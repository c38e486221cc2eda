#include "observe/trace.hpp"

#include <algorithm>

namespace idemkafka::detail {
namespace {

thread_local const Record* current_record = nullptr;

bool lower_hex(std::string_view s) noexcept
{
    return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool all_zero(std::string_view s) noexcept
{
    return std::all_of(s.begin(), s.end(), [](char c) { return c == '0'; });
}

std::optional<std::string_view> header_of(const std::vector<Header>& headers, std::string_view name) noexcept
{
    for (const auto& h : headers)
        if (h.name == name)
            return h.value ? std::optional<std::string_view>(*h.value) : std::nullopt;
    return std::nullopt;
}

} // namespace

std::optional<std::string_view> valid_traceparent(std::string_view v) noexcept
{
    // version "-" trace-id "-" parent-id "-" trace-flags: 2 + 1 + 32 + 1 + 16 + 1 + 2.
    constexpr std::size_t size = 55;
    if (v.size() < size || v[2] != '-' || v[35] != '-' || v[52] != '-')
        return std::nullopt;
    const auto version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16), flags = v.substr(53, 2);
    if (!lower_hex(version) || version == "ff" || !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags))
        return std::nullopt;
    if (all_zero(trace) || all_zero(parent))
        return std::nullopt;
    // Version 00 has exactly these fields; a later one may append "-...".
    if (v.size() > size && (version == "00" || v[size] != '-'))
        return std::nullopt;
    return v;
}

std::optional<std::string_view> trace_parent_of(const std::vector<Header>& headers) noexcept
{
    const auto v = header_of(headers, traceparent_header);
    return v ? valid_traceparent(*v) : std::nullopt;
}

TraceScope::TraceScope(const Record* record) noexcept : previous_(current_record)
{
    current_record = record;
}

TraceScope::~TraceScope()
{
    current_record = previous_;
}

const std::vector<Header>& with_trace(const std::vector<Header>& headers, std::vector<Header>& storage)
{
    if (!current_record ||
        std::any_of(headers.begin(), headers.end(), [](const Header& h) { return h.name == traceparent_header; }))
        return headers;
    const auto parent = trace_parent_of(current_record->headers);
    if (!parent)
        return headers;
    storage = headers;
    storage.push_back({std::string(traceparent_header), std::string(*parent)});
    if (auto state = header_of(current_record->headers, tracestate_header);
        state && !header_of(headers, tracestate_header))
        storage.push_back({std::string(tracestate_header), std::string(*state)});
    return storage;
}

} // namespace idemkafka::detail

namespace idemkafka {

std::optional<std::string_view> Context::trace_parent() const noexcept
{
    return detail::trace_parent_of(record_->headers);
}

std::optional<std::string_view> Context::trace_state() const noexcept
{
    if (!trace_parent())
        return std::nullopt;
    return header(detail::tracestate_header);
}

std::string_view Context::trace_id() const noexcept
{
    const auto parent = trace_parent();
    return parent ? detail::trace_id_of(*parent) : std::string_view{};
}

std::vector<Header> Context::trace_headers() const
{
    std::vector<Header> out;
    if (auto parent = trace_parent()) {
        out.push_back({std::string(detail::traceparent_header), std::string(*parent)});
        if (auto state = trace_state())
            out.push_back({std::string(detail::tracestate_header), std::string(*state)});
    }
    return out;
}

} // namespace idemkafka
