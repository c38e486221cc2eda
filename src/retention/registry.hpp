#pragma once
// The retention registry of a claims table (`<table>_retention`): each
// consumer group's retention. Several groups may share one claims table with
// different retentions; maintenance keeps every claim for the longest of them,
// so that no group's claims go before its own retention says. Private to the
// library.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "idemkafka/retention.hpp"
#include "idemkafka/store.hpp"

namespace idemkafka::detail::retention {

/// The registry's qualified name.
std::string registry_of(const ProcessedEventStore& store);

/// Whether the registry exists (a claims table of schema version 2 or later has one).
bool registry_exists(pqxx::transaction_base& tx, const ProcessedEventStore& store);

/// The group with the longest registered retention; nullopt when none is
/// registered or the registry does not exist. With `lock` the registry is
/// first locked in SHARE mode until the transaction ends: no group registers
/// meanwhile, so a DROP or DELETE in the same transaction cannot take claims
/// of a group that registers while it runs.
std::optional<RegisteredRetention> longest_registered(pqxx::transaction_base& tx, const ProcessedEventStore& store,
                                                      bool lock);

/// longest_registered() where the registry is known to exist.
std::optional<RegisteredRetention> longest_in_registry(pqxx::transaction_base& tx, const ProcessedEventStore& store,
                                                       bool lock);

/// Every registration, longest retention first; empty without a registry.
std::vector<RegisteredRetention> registrations(pqxx::transaction_base& tx, const ProcessedEventStore& store);

/// Records `retention` as `group`'s, replacing its earlier registration.
/// Returns the earlier retention, if there was one.
std::optional<std::chrono::milliseconds> register_retention(pqxx::transaction_base& tx,
                                                            const ProcessedEventStore& store, const std::string& group,
                                                            std::chrono::milliseconds retention);

} // namespace idemkafka::detail::retention
