package io.idemkafka.bench.spring;

import java.sql.Array;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Repository;

/**
 * The processed_event claims and the charges, with JdbcTemplate on the transaction's connection.
 * The tables are the bench's: claims {@code PRIMARY KEY (event_id, consumer_group)} and charges
 * {@code (event_id, entity, amount, produced_us)}.
 */
@Repository
class Claims {

    private final JdbcTemplate jdbc;
    private final String claimOne;
    private final String claimMany;
    private final String charge;

    Claims(JdbcTemplate jdbc, @Value("${peer.claims-table}") String claimsTable,
            @Value("${peer.effect-table}") String effectTable) {
        this.jdbc = jdbc;
        this.claimOne = "INSERT INTO " + claimsTable + " (event_id, consumer_group) VALUES (?, ?) ON CONFLICT DO NOTHING";
        this.claimMany = "INSERT INTO " + claimsTable + " (event_id, consumer_group) SELECT unnest(?::uuid[]), ? "
                + "ON CONFLICT DO NOTHING RETURNING event_id";
        this.charge = "INSERT INTO " + effectTable + " (event_id, entity, amount, produced_us) VALUES (?, ?, ?, ?)";
    }

    /** Claims one event for the group; true when this call inserted the claim (first delivery). */
    boolean tryMarkProcessed(UUID eventId, String group) {
        return jdbc.update(claimOne, eventId, group) == 1;
    }

    /** Claims many events in one statement; returns the ids this statement inserted. */
    Set<UUID> tryMarkProcessed(List<UUID> eventIds, String group) {
        Set<UUID> inserted = new HashSet<>();
        jdbc.query(con -> {
            var ps = con.prepareStatement(claimMany);
            Array ids = con.createArrayOf("uuid", eventIds.toArray());
            ps.setArray(1, ids);
            ps.setString(2, group);
            return ps;
        }, rs -> {
            inserted.add(rs.getObject(1, UUID.class));
        });
        return inserted;
    }

    /** The business write of one event. */
    void charge(Event e) {
        jdbc.update(charge, e.id(), e.entity(), e.amount(), e.producedUs());
    }

    /** The business writes of many events as one JDBC batch. */
    void charge(List<Event> events) {
        if (events.isEmpty()) {
            return;
        }
        jdbc.batchUpdate(charge, events, events.size(), (ps, e) -> {
            ps.setObject(1, e.id());
            ps.setString(2, e.entity());
            ps.setLong(3, e.amount());
            ps.setLong(4, e.producedUs());
        });
    }
}
