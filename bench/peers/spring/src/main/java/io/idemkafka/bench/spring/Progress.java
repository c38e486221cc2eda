package io.idemkafka.bench.spring;

import java.io.IOException;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.BitSet;
import java.util.List;

import org.springframework.beans.factory.annotation.Value;
import org.springframework.stereotype.Component;
import org.springframework.transaction.support.TransactionSynchronization;
import org.springframework.transaction.support.TransactionSynchronizationManager;

/**
 * What idemkafka-bench reads from the peer: the records seen (by sequence number), the effects
 * committed, the first record's take and the last commit (wall-clock microseconds), the process
 * CPU time at both, and one latency sample per charged record. Everything is recorded after the
 * transaction commits.
 */
@Component
class Progress {

    private final long expected;
    private final long warmup;
    private final BitSet seen = new BitSet();
    private long distinct;
    private long delivered;
    private long effects;
    private long transactions;
    private volatile long firstTakenUs = -1;
    private long cpuFirstNs;
    private long lastCommitUs = -1;
    private long cpuLastNs;
    private long[] latency = new long[3 * 4096]; // (produced, taken, committed) per charged record
    private int latencyLen;
    private volatile long lastActivityUs = Event.wallUs();
    private volatile boolean assigned;
    private volatile boolean complete;

    Progress(@Value("${peer.expected:0}") long expected, @Value("${peer.warmup:0}") long warmup) {
        this.expected = expected;
        this.warmup = warmup;
    }

    /** Records the moment a record (or poll) reached the listener: the first one starts the clock. */
    void taken(long takenUs) {
        if (firstTakenUs < 0) {
            synchronized (this) {
                if (firstTakenUs < 0) {
                    cpuFirstNs = processCpuNs();
                    firstTakenUs = takenUs;
                }
            }
        }
    }

    /** Records `event` once the current transaction has committed (and nothing if it rolls back). */
    void afterCommit(Event event, long takenUs, boolean charged) {
        taken(takenUs);
        TransactionSynchronizationManager.registerSynchronization(new TransactionSynchronization() {
            @Override
            public void afterCommit() {
                committed(List.of(event), charged ? List.of(event) : List.of(), takenUs);
            }
        });
    }

    /** A transaction holding `events` committed, with the charges of `charged` among them. */
    synchronized void committed(List<Event> events, List<Event> charged, long takenUs) {
        taken(takenUs);
        long now = Event.wallUs();
        ++transactions;
        delivered += events.size();
        for (Event e : events) {
            if (e.seq() >= 0 && e.seq() <= Integer.MAX_VALUE && !seen.get((int) e.seq())) {
                seen.set((int) e.seq());
                ++distinct;
            }
        }
        effects += charged.size();
        for (Event e : charged) {
            if (e.seq() >= warmup) {
                addLatency(e.producedUs(), takenUs, now);
            }
        }
        lastCommitUs = now;
        lastActivityUs = now;
        if (expected > 0 && distinct >= expected && !complete) {
            cpuLastNs = processCpuNs();
            complete = true;
        }
    }

    private void addLatency(long produced, long taken, long committed) {
        if (latencyLen + 3 > latency.length) {
            latency = java.util.Arrays.copyOf(latency, latency.length * 2);
        }
        latency[latencyLen++] = produced;
        latency[latencyLen++] = taken;
        latency[latencyLen++] = committed;
    }

    void assigned(int partitions) {
        if (partitions > 0 && !assigned) {
            assigned = true;
            lastActivityUs = Event.wallUs();
            System.out.println("ASSIGNED " + partitions);
            System.out.flush();
        }
    }

    boolean isAssigned() {
        return assigned;
    }

    boolean isComplete() {
        return complete;
    }

    long lastActivityUs() {
        return lastActivityUs;
    }

    synchronized long distinct() {
        return distinct;
    }

    /** The final line: key=value pairs idemkafka-bench parses. */
    synchronized void report(PrintStream out, String outcome) {
        if (!complete) {
            cpuLastNs = processCpuNs();
        }
        out.printf("DONE outcome=%s records=%d distinct=%d effects=%d transactions=%d first_taken_us=%d "
                + "last_commit_us=%d cpu_first_ns=%d cpu_last_ns=%d latency_samples=%d%n", outcome, delivered,
                distinct, effects, transactions, firstTakenUs, lastCommitUs, cpuFirstNs, cpuLastNs, latencyLen / 3);
        out.flush();
    }

    /** One line per charged record after the warm-up: "produced_us taken_us committed_us". */
    synchronized void writeLatency(Path path) throws IOException {
        try (PrintWriter w = new PrintWriter(Files.newBufferedWriter(path))) {
            for (int i = 0; i < latencyLen; i += 3) {
                w.print(latency[i]);
                w.print(' ');
                w.print(latency[i + 1]);
                w.print(' ');
                w.println(latency[i + 2]);
            }
        }
    }

    static long processCpuNs() {
        var os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean sun) {
            return sun.getProcessCpuTime();
        }
        return -1;
    }
}
