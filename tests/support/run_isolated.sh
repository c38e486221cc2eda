#!/usr/bin/env bash
# Runs one test program with services of its own, so that CTest can run tests side by side
# (ctest -j) without one test's broker faults, tables or server restart reaching another:
#
#   - a mock Kafka cluster of its own (idemkafka-mock-broker), unless IDEMKAFKA_TEST_BROKERS
#     names a broker (a real one: then the tests share it, as they would share any cluster);
#   - a database of its own on the PostgreSQL server IDEMKAFKA_TEST_PG names, created here and
#     dropped afterwards; with --own-postgres, or when IDEMKAFKA_TEST_PG is not set, a throwaway
#     server of its own (IDEMKAFKA_TEST_PG_RESTART then restarts that server only; a test on
#     the shared server never gets IDEMKAFKA_TEST_PG_RESTART).
#
#   - with --real-kafka (the lane runs on Apache Kafka, scripts/test.sh --kafka real): the
#     broker IDEMKAFKA_TEST_BROKERS names, shared by the tests; with --own-kafka N, or when none
#     is named, a cluster of N Apache Kafka nodes of its own (scripts/kafka.sh), which the test
#     may kill, freeze and restart through IDEMKAFKA_KAFKA_CTL.
#
#   run_isolated.sh --name NAME --broker-bin PATH [--own-postgres|--no-postgres]
#                   [--real-kafka] [--own-kafka N] -- PROGRAM [ARG...]
#
# The program's exit status is this script's. On a failure the tails of the services' logs
# follow the program's output. Environment: IDEMKAFKA_MOCK_BROKERS (mock cluster size,
# default 1), as for scripts/test.sh.
set -euo pipefail

name=""
broker_bin=""
own_postgres=0
no_postgres=0
real_kafka=0
own_kafka=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        --name)
            name="${2:?--name needs a value}"
            shift 2
            ;;
        --broker-bin)
            broker_bin="${2:?--broker-bin needs a path}"
            shift 2
            ;;
        --own-postgres)
            own_postgres=1
            shift
            ;;
        --no-postgres)
            no_postgres=1
            shift
            ;;
        --real-kafka)
            real_kafka=1
            shift
            ;;
        --own-kafka)
            own_kafka="${2:?--own-kafka needs a number of nodes}"
            shift 2
            ;;
        --)
            shift
            break
            ;;
        *)
            printf 'run_isolated.sh: unknown argument "%s"\n' "$1" >&2
            exit 2
            ;;
    esac
done
[ "$#" -gt 0 ] || {
    printf 'run_isolated.sh: no program to run (after --)\n' >&2
    exit 2
}
[ -n "$name" ] || {
    printf 'run_isolated.sh: --name is required\n' >&2
    exit 2
}

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

# PostgreSQL: a server of our own, or a database of our own on the shared one.
isolated_db=""
shared_pg=""
if [ "$no_postgres" -eq 1 ]; then
    unset IDEMKAFKA_TEST_PG IDEMKAFKA_TEST_PG_RESTART
elif [ "$own_postgres" -eq 1 ] || [ -z "${IDEMKAFKA_TEST_PG:-}" ]; then
    unset IDEMKAFKA_TEST_PG IDEMKAFKA_TEST_PG_RESTART
    ik_start_postgres >/dev/null
else
    unset IDEMKAFKA_TEST_PG_RESTART
    shared_pg="$IDEMKAFKA_TEST_PG"
    # A name PostgreSQL keeps whole (63 bytes), unique on this machine for this run.
    isolated_db="$(printf 'ik_%s' "$name" | tr -c 'a-zA-Z0-9_' '_' | cut -c1-40)_$$_$RANDOM"
    "$(ik_pg_bin)/psql" -X -q -v ON_ERROR_STOP=1 -d "$shared_pg" -c "CREATE DATABASE \"$isolated_db\"" ||
        ik_die "could not create database $isolated_db on '$shared_pg'"
    case "$shared_pg" in
        postgres://* | postgresql://*)
            # Query parameters come after the path, so this dbname wins.
            case "$shared_pg" in
                *\?*) IDEMKAFKA_TEST_PG="$shared_pg&dbname=$isolated_db" ;;
                *) IDEMKAFKA_TEST_PG="$shared_pg?dbname=$isolated_db" ;;
            esac
            ;;
        *) IDEMKAFKA_TEST_PG="$shared_pg dbname=$isolated_db" ;; # the last dbname wins
    esac
    export IDEMKAFKA_TEST_PG
fi

drop_isolated_db() {
    if [ -n "$isolated_db" ]; then
        "$(ik_pg_bin)/psql" -X -q -d "$shared_pg" -c "DROP DATABASE IF EXISTS \"$isolated_db\" WITH (FORCE)" ||
            ik_warn "could not drop database $isolated_db"
        isolated_db=""
    fi
}

# Also when a timeout or a signal ends this script (lib.sh's trap turns INT/TERM into an exit).
on_exit() {
    local status=$?
    drop_isolated_db || true
    ik_cleanup || true
    exit "$status"
}
trap on_exit EXIT

# Kafka: Apache Kafka (shared, or of our own), or a mock cluster of our own unless a broker is named.
if [ "$real_kafka" -eq 1 ]; then
    export IDEMKAFKA_TEST_KAFKA=real
    unset IDEMKAFKA_MOCK_CONTROL
    if [ "$own_kafka" -gt 0 ] || [ -z "${IDEMKAFKA_TEST_BROKERS:-}" ]; then
        unset IDEMKAFKA_TEST_BROKERS IDEMKAFKA_KAFKA_CTL IDEMKAFKA_KAFKA_DIR
        ik_start_kafka --brokers "$((own_kafka > 0 ? own_kafka : 1))" >/dev/null
    fi
elif [ -z "${IDEMKAFKA_TEST_BROKERS:-}" ]; then
    [ -n "$broker_bin" ] && export IDEMKAFKA_MOCK_BROKER_BIN="$broker_bin"
    unset IDEMKAFKA_MOCK_CONTROL
    ik_start_broker --brokers "${IDEMKAFKA_MOCK_BROKERS:-1}" >/dev/null
fi

status=0
"$@" || status=$?
if [ "$status" -ne 0 ]; then
    ik_show_logs
fi
exit "$status"
