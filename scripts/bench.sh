#!/usr/bin/env bash
# The benchmark, end to end: builds idemkafka-bench (Release), starts a throwaway
# PostgreSQL and the mock Kafka cluster, runs every mode on the same data, writes
# bench/results/latest.json and renders bench/results/throughput.png, then removes
# the services again (also on failure).
#
#   scripts/bench.sh                      10k, 100k, 1M records x 0%/30% re-sends, the default modes
#   scripts/bench.sh --full               the same with every mode: also the payload fingerprint,
#                                         the mixed and the 5 ms handler modes (at most 20k records)
#   scripts/bench.sh --quick              10k records only (the CTest smoke run)
#   scripts/bench.sh --mixed              handler-time workloads only: every 100th call 200 ms
#                                         (4 workers), every call 5 ms (64 workers), 20k records
#   scripts/bench.sh --prefill 5000000 --events 100000 --dups 0 \
#       --modes idemkafka_batch,idemkafka_batch_prefilled,idemkafka_per_event,idemkafka_per_event_prefilled
#                                         steady state: a claims table holding 5M claims
#                                         against empty ones, in one run
#   scripts/bench.sh --events 10000,50000 --modes idemkafka_batch,pg_floor_batch
#   scripts/bench.sh --lane modern --modes idemkafka_handler5ms_partition,idemkafka_share_handler5ms \
#       --partitions 2 --events 4000 --dups 0 --latency-seconds 0
#                                         against libpqxx 7.10.7 and librdkafka 2.15.0 (built by
#                                         scripts/deps.sh; build dir <repo>/build-bench-modern),
#                                         which have the share consumer: 8 share members on 2
#                                         partitions next to a consumer group on the same 2
#                                         (--lane, when given, comes first)
#
#   scripts/bench.sh --kafka real --events 20000 --dups 0,30 --partitions 4 \
#       --modes idemkafka_per_event,spring_per_record,spring_per_record_manual,idemkafka_batch,spring_batch
#                                         the library beside the Spring Kafka peer (bench/peers/spring)
#                                         on a real Apache Kafka broker (scripts/kafka.sh)
#   scripts/bench.sh --kafka real --events 20000 --dups 30 --partitions 4 --kill 8 \
#       --modes idemkafka_batch_kill9,spring_per_record_kill9,spring_batch_kill9 --latency-seconds 0
#                                         the library's consumer (a child process) and the peer
#                                         SIGKILLed 8 times at random moments, restarted
#
# --kafka real|mock (default mock): the broker. real starts Apache Kafka 4.3.1 (KRaft) from
# Maven-resolved jars; the Spring modes need it. With a real broker and Java 17 + Maven, the
# peer is built (scripts/spring-peer.sh, cached by a hash of its sources) and its modes join
# the default ones; without them they are skipped with one line saying why. When the peer runs,
# every mode reaches a PostgreSQL this script started over TCP (127.0.0.1), as JDBC must.
#
# Claims tables are partitioned, as the consumer's default configuration creates them;
# idemkafka_batch_plain runs idemkafka_batch on a plain table (RetentionMode::purge), so
# the report's `idemkafka_batch / idemkafka_batch_plain` is what partitioning costs.
#
# Arguments go to idemkafka-bench; `scripts/bench.sh --help` lists them all. Environment:
# BUILD_DIR (default <repo>/build-bench, or <repo>/build-bench-modern with --lane modern),
# RESULTS_DIR (default <repo>/bench/results),
# IDEMKAFKA_TEST_PG / IDEMKAFKA_TEST_BROKERS to measure existing services instead, and
# IDEMKAFKA_BENCH_PERF=1 to run under `perf record` and write the consumer thread's
# profile to RESULTS_DIR/perf.txt (best with one mode: --modes idemkafka_batch).
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lane=debian
if [ "${1:-}" = "--lane" ]; then
    lane="${2:?--lane needs debian or modern}"
    shift 2
fi
case "$lane" in
    debian) default_build="$IK_ROOT/build-bench" ;;
    modern) default_build="$IK_ROOT/build-bench-modern" ;;
    *)
        printf 'error: unknown lane "%s" (debian or modern)\n' "$lane" >&2
        exit 2
        ;;
esac
# Its own build tree: the benchmark needs Release, the tests use RelWithDebInfo.
BUILD_DIR="${BUILD_DIR:-$default_build}"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

# --kafka real|mock is this script's; the rest goes to the binary.
kafka=mock
args=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --kafka)
            kafka="${2:?--kafka needs real or mock}"
            shift 2
            ;;
        *)
            args+=("$1")
            shift
            ;;
    esac
done
case "$kafka" in
    real | mock) ;;
    *)
        printf 'error: --kafka takes real or mock, not "%s"\n' "$kafka" >&2
        exit 2
        ;;
esac
set -- "${args[@]}"

results="${RESULTS_DIR:-$IK_ROOT/bench/results}"
case "$results" in
    /*) ;;
    *) results="$PWD/$results" ;;
esac

# --help: this header and the binary's options, building the binary first if needed
# (no services are started).
for arg in "$@"; do
    if [ "$arg" = "--help" ] || [ "$arg" = "-h" ]; then
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
        echo
        if [ ! -x "$BUILD_DIR/bench/idemkafka-bench" ]; then
            echo "(building idemkafka-bench for its options)" >&2
            [ "$lane" = debian ] || { echo "(--help builds the Debian lane)" >&2; BUILD_DIR="$IK_ROOT/build-bench"; }
            cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DIDEMKAFKA_BUILD_BENCH=ON >/dev/null
            cmake --build "$BUILD_DIR" -j2 --target idemkafka-bench >/dev/null
        fi
        exec "$BUILD_DIR/bench/idemkafka-bench" --help
    fi
done

ik_ensure_packages
# gnuplot only draws the chart: a missing one costs the PNG, not the run.
if ! command -v gnuplot >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        ik_log "installing gnuplot-nox (for the chart)"
        { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gnuplot-nox; } \
            >/dev/null || ik_warn "could not install gnuplot: no chart"
    else
        ik_warn "gnuplot not found (apt-get install gnuplot-nox): no chart"
    fi
fi

lane_args=()
if [ "$lane" = modern ]; then
    ik_log "lane modern: building or reusing libpqxx and librdkafka (scripts/deps.sh)"
    deps_prefix="$(bash "$IK_ROOT/scripts/deps.sh")"
    export PKG_CONFIG_PATH="$deps_prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    lane_args=(-DCMAKE_PREFIX_PATH="$deps_prefix")
fi

ik_log "building Release ($BUILD_DIR, lane $lane)"
cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DIDEMKAFKA_BUILD_BENCH=ON "${lane_args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j2 --target idemkafka-bench idemkafka-mock-broker

pg_ours=0
[ -n "${IDEMKAFKA_TEST_PG:-}" ] || pg_ours=1
ik_log "starting PostgreSQL"
ik_start_postgres
if [ "$kafka" = real ]; then
    ik_log "starting Apache Kafka (real broker)"
    ik_start_kafka
else
    ik_log "starting the mock Kafka cluster"
    ik_start_broker --brokers 1
fi

# The Spring peer: a real broker (started here, or IDEMKAFKA_TEST_BROKERS without the mock's
# control FIFO), Java 17 and Maven.
spring_args=()
if [ -n "${IDEMKAFKA_MOCK_CONTROL:-}" ]; then
    ik_log "Spring modes skipped: they need a real Kafka broker (--kafka real)"
elif ! why="$(bash "$IK_ROOT/scripts/spring-peer.sh" --check)"; then
    ik_log "Spring modes skipped: $why"
else
    spring_jar="$(bash "$IK_ROOT/scripts/spring-peer.sh")" || ik_die "the Spring peer did not build"
    spring_args=(--spring-jar "$spring_jar")
    if [ "$pg_ours" -eq 1 ]; then
        # JDBC has no Unix sockets: every mode goes over TCP, so all pay the same transport.
        IDEMKAFKA_TEST_PG="$(printf '%s\n' "$IDEMKAFKA_TEST_PG" | sed 's/host=[^ ]*/host=127.0.0.1/')"
        export IDEMKAFKA_TEST_PG
    fi
    ik_log "Spring peer: $spring_jar (PostgreSQL over TCP for every mode: $IDEMKAFKA_TEST_PG)"
fi

mkdir -p "$results"
bench="$BUILD_DIR/bench/idemkafka-bench"
ik_log "running the benchmark"
status=0
if [ -n "${IDEMKAFKA_BENCH_PERF:-}" ]; then
    command -v perf >/dev/null 2>&1 || ik_die "IDEMKAFKA_BENCH_PERF needs perf (apt-get install linux-perf)"
    perf record -F 1999 -o "$results/perf.data" -- "$bench" --out "$results/latest.json" "${spring_args[@]}" "$@" || status=$?
    # ik-run is the thread running IdempotentConsumer::run(), rdk:* are librdkafka's, and
    # idemkafka-bench is the main thread (producing the data, the PostgreSQL floors).
    # Percentages are of all samples; perf's --comm filter is unreliable when comm is not
    # a sort key, so the thread is selected with grep.
    {
        echo "# CPU samples per thread (% of all samples)"
        perf report -i "$results/perf.data" --sort comm --stdio 2>/dev/null | grep -v '^#' | sed '/^$/d' | head -20
        echo "# consumer thread (ik-run) by shared object"
        perf report -i "$results/perf.data" --sort comm,dso --stdio 2>/dev/null | grep ' ik-run ' | head -20
        echo "# consumer thread (ik-run) by symbol"
        perf report -i "$results/perf.data" --sort comm,dso,sym --stdio 2>/dev/null | grep ' ik-run ' | head -60
    } >"$results/perf.txt"
    ik_log "profile: $results/perf.txt"
else
    "$bench" --out "$results/latest.json" "${spring_args[@]}" "$@" || status=$?
fi
if [ "$status" -eq 2 ]; then
    exit 2 # usage error: nothing ran
fi
if [ "$status" -ne 0 ]; then
    ik_show_logs
fi

if [ -f "$results/latest.json" ] && command -v gnuplot >/dev/null 2>&1; then
    "$bench" --plot-data "$results/latest.json" >"$results/throughput.dat"
    gnuplot -e "datafile='$results/throughput.dat'; outfile='$results/throughput.png'" \
        "$IK_ROOT/bench/throughput.gp" && ik_log "chart: $results/throughput.png"
fi
[ -f "$results/latest.json" ] && ik_log "report: $results/latest.json"
exit "$status"
