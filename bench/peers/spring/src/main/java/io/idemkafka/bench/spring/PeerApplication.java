package io.idemkafka.bench.spring;

import java.nio.file.Path;
import java.util.Collection;
import java.util.HashMap;
import java.util.Map;

import javax.sql.DataSource;

import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.core.env.Environment;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.listener.ConsumerAwareRebalanceListener;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.transaction.annotation.EnableTransactionManagement;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * The Spring Kafka peer of idemkafka-bench. Properties (command line {@code --name=value}):
 * peer.mode (per_record or batch), peer.ack-mode (MANUAL_IMMEDIATE or MANUAL), peer.topic,
 * peer.group, peer.concurrency (listener containers; also the connection pool's size),
 * peer.expected (records to see before exiting; 0: until idle or killed), peer.idle-exit-ms
 * (exit once assigned and idle that long; 0: never), peer.stall-ms (give up after that long
 * without progress), peer.warmup (records below this sequence number give no latency sample),
 * peer.latency-out (file for the latency samples), peer.claims-table, peer.effect-table,
 * peer.brokers and spring.datasource.url.
 *
 * <p>It prints "ASSIGNED n" once partitions are assigned, "PROGRESS n" (distinct records
 * committed) as that grows, and a final "DONE ..." line; exit status 0 when complete or idle,
 * 3 when stuck.
 */
@SpringBootApplication
@EnableTransactionManagement
public class PeerApplication {

    public static void main(String[] args) throws Exception {
        ConfigurableApplicationContext ctx = SpringApplication.run(PeerApplication.class, args);
        Environment env = ctx.getEnvironment();
        Progress progress = ctx.getBean(Progress.class);
        String outcome = awaitEnd(progress, env.getProperty("peer.idle-exit-ms", Long.class, 0L),
                env.getProperty("peer.stall-ms", Long.class, 60_000L));
        progress.report(System.out, outcome);
        String latencyOut = env.getProperty("peer.latency-out", "");
        if (!latencyOut.isEmpty()) {
            progress.writeLatency(Path.of(latencyOut));
        }
        // A bounded, clean shutdown: the containers commit pending acknowledgements and leave the group.
        Thread closer = new Thread(ctx::close, "peer-close");
        closer.start();
        closer.join(15_000);
        Runtime.getRuntime().halt(outcome.equals("stuck") ? 3 : 0);
    }

    private static String awaitEnd(Progress progress, long idleExitMs, long stallMs) throws InterruptedException {
        long printed = -1;
        while (true) {
            long distinct = progress.distinct();
            if (distinct != printed) {
                System.out.println("PROGRESS " + distinct);
                System.out.flush();
                printed = distinct;
            }
            if (progress.isComplete()) {
                return "complete";
            }
            long idleMs = (Event.wallUs() - progress.lastActivityUs()) / 1000;
            if (idleExitMs > 0 && progress.isAssigned() && idleMs >= idleExitMs) {
                return "idle";
            }
            if (stallMs > 0 && idleMs >= stallMs) {
                return "stuck";
            }
            Thread.sleep(50);
        }
    }

    @Bean
    DataSourceTransactionManager transactionManager(DataSource dataSource) {
        return new DataSourceTransactionManager(dataSource);
    }

    @Bean
    TransactionTemplate transactionTemplate(DataSourceTransactionManager tm) {
        return new TransactionTemplate(tm);
    }

    @Bean
    ConsumerFactory<String, String> consumerFactory(@Value("${peer.brokers}") String brokers) {
        Map<String, Object> props = new HashMap<>();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        // As the bench's librdkafka consumers: earliest, read_committed, a dead member noticed in 6 s.
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 6000);
        props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 500);
        return new DefaultKafkaConsumerFactory<>(props);
    }

    @Bean
    ConcurrentKafkaListenerContainerFactory<String, String> kafkaListenerContainerFactory(
            ConsumerFactory<String, String> consumerFactory, Progress progress,
            @Value("${peer.ack-mode:MANUAL_IMMEDIATE}") String ackMode) {
        var factory = new ConcurrentKafkaListenerContainerFactory<String, String>();
        factory.setConsumerFactory(consumerFactory);
        ContainerProperties props = factory.getContainerProperties();
        props.setAckMode(ContainerProperties.AckMode.valueOf(ackMode));
        props.setConsumerRebalanceListener(new ConsumerAwareRebalanceListener() {
            @Override
            public void onPartitionsAssigned(Consumer<?, ?> consumer, Collection<TopicPartition> partitions) {
                progress.assigned(partitions.size());
            }
        });
        return factory;
    }
}
