package io.idemkafka.bench.spring;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.support.Acknowledgment;
import org.springframework.stereotype.Component;
import org.springframework.transaction.annotation.Transactional;

/**
 * spring_per_record: the textbook listener. One database transaction per record
 * (DataSourceTransactionManager), the claim, the charge only when the claim was inserted, and the
 * manual acknowledgement inside the listener method; the container's AckMode (MANUAL_IMMEDIATE or
 * MANUAL) decides when the offset is committed.
 */
@Component
@ConditionalOnProperty(name = "peer.mode", havingValue = "per_record")
class PerRecordListener {

    private final Claims claims;
    private final Progress progress;
    private final String group;

    PerRecordListener(Claims claims, Progress progress, @Value("${peer.group}") String group) {
        this.claims = claims;
        this.progress = progress;
        this.group = group;
    }

    @KafkaListener(id = "spring_per_record", topics = "${peer.topic}", groupId = "${peer.group}",
            concurrency = "${peer.concurrency}")
    @Transactional
    public void onOrder(ConsumerRecord<String, String> record, Acknowledgment ack) {
        long taken = Event.wallUs();
        Event event = Event.parse(record.key(), record.value());
        boolean inserted = claims.tryMarkProcessed(event.id(), group);
        if (inserted) {
            claims.charge(event);
        }
        progress.afterCommit(event, taken, inserted);
        ack.acknowledge();
    }
}
