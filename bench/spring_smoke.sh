#!/usr/bin/env bash
# The CTest test bench_spring: keeps the Spring Kafka peer building and running. Builds the
# peer (scripts/spring-peer.sh; Java 17 and Maven are required, a missing one fails the test),
# starts a real Apache Kafka broker unless IDEMKAFKA_TEST_BROKERS names one that is not the
# mock cluster, and runs idemkafka_batch, spring_batch and spring_per_record on a few thousand
# records at 30% re-sends, each verified (charges == unique events, no doubles).
#
#   bench/spring_smoke.sh IDEMKAFKA_BENCH OUT_JSON
set -euo pipefail

bench="${1:?usage: spring_smoke.sh IDEMKAFKA_BENCH OUT_JSON}"
out="${2:?usage: spring_smoke.sh IDEMKAFKA_BENCH OUT_JSON}"
IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

why="$(bash "$IK_ROOT/scripts/spring-peer.sh" --check)" || ik_die "the Spring peer cannot be built: $why"
jar="$(bash "$IK_ROOT/scripts/spring-peer.sh")"
if [ -n "${IDEMKAFKA_MOCK_CONTROL:-}" ]; then
    # run_isolated.sh started a mock cluster: the peer needs a real broker.
    unset IDEMKAFKA_TEST_BROKERS IDEMKAFKA_MOCK_CONTROL
fi
ik_start_postgres
ik_start_kafka
"$bench" --events 3000 --dups 30 --partitions 2 --slow-max 1000 --latency-seconds 0 \
    --modes idemkafka_batch,spring_batch,spring_per_record --spring-jar "$jar" --out "$out"
