package io.idemkafka.bench.spring;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.support.Acknowledgment;
import org.springframework.stereotype.Component;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * spring_batch: a batch listener with one transaction per poll. The claims of the poll's records
 * in one multi-row INSERT ... ON CONFLICT DO NOTHING RETURNING, the charges of the claimed records
 * in one JDBC batch, the commit, then the acknowledgement of the poll.
 */
@Component
@ConditionalOnProperty(name = "peer.mode", havingValue = "batch")
class BatchListener {

    private final Claims claims;
    private final Progress progress;
    private final TransactionTemplate tx;
    private final String group;

    BatchListener(Claims claims, Progress progress, TransactionTemplate tx, @Value("${peer.group}") String group) {
        this.claims = claims;
        this.progress = progress;
        this.tx = tx;
        this.group = group;
    }

    @KafkaListener(id = "spring_batch", topics = "${peer.topic}", groupId = "${peer.group}",
            concurrency = "${peer.concurrency}", batch = "true")
    public void onOrders(List<ConsumerRecord<String, String>> records, Acknowledgment ack) {
        long taken = Event.wallUs();
        List<Event> events = new ArrayList<>(records.size());
        List<UUID> ids = new ArrayList<>(records.size());
        for (ConsumerRecord<String, String> r : records) {
            Event e = Event.parse(r.key(), r.value());
            events.add(e);
            ids.add(e.id());
        }
        List<Event> charged = tx.execute(status -> {
            Set<UUID> claimed = claims.tryMarkProcessed(ids, group);
            List<Event> fresh = new ArrayList<>(claimed.size());
            Set<UUID> taking = new HashSet<>();
            for (Event e : events) {
                if (claimed.contains(e.id()) && taking.add(e.id())) {
                    fresh.add(e); // the first record of each claimed id is charged
                }
            }
            claims.charge(fresh);
            return fresh;
        });
        progress.committed(events, charged, taken);
        ack.acknowledge();
    }
}
