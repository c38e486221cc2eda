#pragma once
/// \file
/// The exception hierarchy. A duplicate is a normal outcome, never an exception.

#include <stdexcept>
#include <string>

#include "idemkafka/export.hpp"

namespace idemkafka {

/// Base of every exception the library throws.
class IDEMKAFKA_API Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A configuration value is missing, malformed or not allowed (the message names it).
class IDEMKAFKA_API ConfigError : public Error {
public:
    using Error::Error;
};

/// Text or bytes that are not a valid event id.
class IDEMKAFKA_API InvalidEventId : public Error {
public:
    using Error::Error;
};

/// The payload carries no event id at all (a decoder may throw this to tell it
/// apart from a malformed one). The record is dead-lettered as missing_event_id.
class IDEMKAFKA_API MissingEventId : public InvalidEventId {
public:
    using InvalidEventId::InvalidEventId;
};

/// A record's payload cannot be decoded. Decoders may throw this (or any other
/// exception) to mark a record as poison; the library never hands it to the handler.
class IDEMKAFKA_API DecodeError : public Error {
public:
    using Error::Error;
};

/// Thrown by a handler for a failure that retrying cannot fix (a business rule
/// rejects the event, say): the record goes to the dead-letter topic on the first
/// failure, without retries.
class IDEMKAFKA_API NonRetryableError : public Error {
public:
    using Error::Error;
};

/// Kafka client failure that the library cannot recover from (client creation,
/// subscription, fatal client errors).
class IDEMKAFKA_API KafkaError : public Error {
public:
    using Error::Error;
};

/// Schema creation or a statement of the library's own failed in PostgreSQL.
class IDEMKAFKA_API DatabaseError : public Error {
public:
    using Error::Error;
};

} // namespace idemkafka
