#!/usr/bin/env bash
# Builds idemkafka, starts a throwaway PostgreSQL and the mock Kafka cluster, runs the tests.
#
#   scripts/test.sh                 all labels
#   scripts/test.sh -L unit         extra arguments go to ctest
#
# Environment: BUILD_DIR (default <repo>/build), IDEMKAFKA_CMAKE_ARGS (extra configure
# arguments, split on spaces), IDEMKAFKA_TEST_PG / IDEMKAFKA_TEST_BROKERS to use existing
# services instead of starting them, IDEMKAFKA_MOCK_BROKERS (mock cluster size, default 1).
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

ik_ensure_packages

ik_log "configuring ($BUILD_DIR)"
# shellcheck disable=SC2086 # IDEMKAFKA_CMAKE_ARGS is a list of arguments
cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${IDEMKAFKA_CMAKE_ARGS:-}

ik_log "building"
cmake --build "$BUILD_DIR" -j2

ik_log "starting PostgreSQL"
ik_start_postgres

ik_log "starting the mock Kafka cluster"
ik_start_broker --brokers "${IDEMKAFKA_MOCK_BROKERS:-1}"

ik_log "running tests"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --no-tests=error "$@") || status=$?
if [ "$status" -ne 0 ]; then
    ik_show_logs
fi
ik_log "ctest exited with $status"
exit "$status"
