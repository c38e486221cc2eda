package io.idemkafka.bench.spring;

import java.time.Instant;
import java.util.UUID;

/**
 * One record of the bench's data: {@code "<event id>,<seq>,<produce timestamp us>"}, keyed by the
 * entity. The amount is derived from the id as idemkafka-bench derives it (its last two bytes), so
 * every mode writes the same charge rows.
 */
record Event(UUID id, long seq, long producedUs, String entity) {

    static Event parse(String entity, String payload) {
        if (payload == null || payload.length() < 40 || payload.charAt(36) != ',') {
            throw new IllegalArgumentException("expected \"<event id>,<seq>,<timestamp>\", got " + payload);
        }
        int comma = payload.indexOf(',', 37);
        if (comma < 0) {
            throw new IllegalArgumentException("no timestamp in " + payload);
        }
        return new Event(UUID.fromString(payload.substring(0, 36)), Long.parseLong(payload.substring(37, comma)),
                Long.parseLong(payload.substring(comma + 1)), entity);
    }

    /** The business amount: the id's last two bytes, big-endian. */
    long amount() {
        return id.getLeastSignificantBits() & 0xFFFFL;
    }

    /** Microseconds since the Unix epoch, the clock of the payloads' produce timestamps. */
    static long wallUs() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000L;
    }
}
