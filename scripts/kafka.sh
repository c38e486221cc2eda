#!/usr/bin/env bash
# The real Apache Kafka broker (KRaft) for the tests, the demo and the benchmark. Its release
# jars are resolved with Maven (scripts/kafka/pom.xml) into ~/.cache/idemkafka-kafka/kafka-<version>
# the first time; Java 17 and Maven are needed.
#
#   scripts/kafka.sh start [--brokers N]   start a cluster (1 node by default) on free loopback
#                                          ports, print its bootstrap servers, keep it running
#                                          until Ctrl-C; then stop it and remove its data
#   scripts/kafka.sh jars                  resolve the jars only, print their directory
#   scripts/kafka.sh ctl DIR kill|stop|cont|start|term NODE
#                                          fault control of one node of a cluster (the tests
#                                          reach it through IDEMKAFKA_KAFKA_CTL)
#   scripts/kafka.sh topic BOOTSTRAP NAME PARTITIONS
#                                          create a topic (Kafka's kafka-topics; kept if it exists)
#   scripts/kafka.sh version               print the pinned Kafka version
#
# For example, the demo against it:
#   scripts/kafka.sh start &   # prints "Apache Kafka ... ready: 127.0.0.1:PORT"
#   IDEMKAFKA_TEST_BROKERS=127.0.0.1:PORT scripts/demo.sh
#
# Environment: IDEMKAFKA_KAFKA_CACHE (default ~/.cache/idemkafka-kafka), IDEMKAFKA_KAFKA_JAVA_OPTS
# (extra JVM options of the broker).
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
command="${1:-}"
[ "$#" -gt 0 ] && shift
case "$command" in
    ctl | jars | topic | version) IK_NO_TRAP=1 ;; # no services of this process to clean up
esac
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

case "$command" in
    start)
        brokers=1
        if [ "${1:-}" = "--brokers" ]; then
            brokers="${2:?--brokers needs a number}"
        fi
        unset IDEMKAFKA_TEST_BROKERS
        ik_start_kafka --brokers "$brokers"
        printf '%s\n' "$IDEMKAFKA_TEST_BROKERS"
        ik_log "Ctrl-C stops it"
        while sleep 3600; do :; done
        ;;
    jars) ik_kafka_libs ;;
    ctl)
        [ "$#" -eq 3 ] || ik_die "usage: scripts/kafka.sh ctl DIR kill|stop|cont|start|term NODE"
        ik_kafka_ctl "$1" "$2" "$3"
        ;;
    topic)
        [ "$#" -eq 3 ] || ik_die "usage: scripts/kafka.sh topic BOOTSTRAP NAME PARTITIONS"
        ik_kafka_create_topic "$1" "$2" "$3"
        ;;
    version) printf '%s\n' "$IK_KAFKA_VERSION" ;;
    *)
        sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
