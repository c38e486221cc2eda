#!/usr/bin/env bash
# Builds idemkafka, starts a throwaway PostgreSQL, runs the tests side by side (each test that
# needs Kafka starts its own mock cluster: tests/support/run_isolated.sh), and prints the
# slowest ten tests and the lane's test time.
#
#   scripts/test.sh                 all labels, Debian lane
#   scripts/test.sh -L unit         extra arguments go to ctest
#   scripts/test.sh --lane modern   against libpqxx 7.10.7 and librdkafka 2.15.0 built from
#                                   ../shared/thirdparty by scripts/deps.sh (cached); the mock
#                                   broker is then librdkafka 2.15's
#   scripts/test.sh --lane modern --kafka real
#                                   against Apache Kafka (scripts/kafka.sh: its jars through
#                                   Maven, cached): one broker the tests share, a cluster of
#                                   their own for those that kill or freeze it; the cases that
#                                   need the mock's fault injection ([mock]) are listed and left
#                                   out. --kafka mock (the default): librdkafka's mock cluster.
#
#   scripts/test.sh --lane asan     the Debian lane under AddressSanitizer (leaks too) and
#                                   UndefinedBehaviorSanitizer: the `unit` label and the
#                                   integration tests of the consumer's core (the list below);
#                                   only their programs are built. ctest arguments replace that
#                                   selection (then every program is built).
#
# Lanes: `debian` (default): Debian 12's libpqxx 6.4 and librdkafka 2.0.2, build dir
# <repo>/build; `modern`: the versions most users run, build dir <repo>/build-modern; `asan`:
# the Debian stack with -fsanitize=address,undefined on idemkafka's own code (Debian's
# librdkafka and libpqxx are not instrumented), build dir <repo>/build-asan, every report a
# failed test; tests/support/sanitizers/ holds the suppressions (findings inside those
# libraries only, each explained).
#
# Environment: BUILD_DIR (overrides the lane's build dir), IDEMKAFKA_CMAKE_ARGS (extra configure
# arguments, split on spaces), IDEMKAFKA_TEST_PG / IDEMKAFKA_TEST_BROKERS to use existing
# services instead of starting them, IDEMKAFKA_MOCK_BROKERS (mock cluster size, default 1),
# IDEMKAFKA_TEST_JOBS (tests at a time, default 6, 2 on the asan lane; a -j among the ctest
# arguments wins).
set -euo pipefail

lane=debian
kafka=mock
while [ "$#" -gt 0 ]; do
    case "$1" in
        --lane)
            lane="${2:?--lane needs debian, modern or asan}"
            shift 2
            ;;
        --kafka)
            kafka="${2:?--kafka needs mock or real}"
            shift 2
            ;;
        *) break ;;
    esac
done
case "$kafka" in
    mock | real) ;;
    *)
        printf 'error: unknown Kafka "%s" (mock or real)\n' "$kafka" >&2
        exit 2
        ;;
esac
case "$lane" in
    debian | modern | asan) ;;
    *)
        printf 'error: unknown lane "%s" (debian, modern or asan)\n' "$lane" >&2
        exit 2
        ;;
esac

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$lane" = asan ] && [ "$kafka" = real ]; then
    printf 'error: the asan lane runs on the mock cluster only (--kafka mock)\n' >&2
    exit 2
fi
if [ "$lane" != debian ] && [ -z "${BUILD_DIR:-}" ]; then
    BUILD_DIR="$IK_ROOT/build-$lane"
fi
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

ik_ensure_packages

lane_args=()
if [ "$lane" = modern ]; then
    ik_log "lane modern: building or reusing libpqxx and librdkafka (scripts/deps.sh)"
    deps_prefix="$(bash "$IK_ROOT/scripts/deps.sh")"
    # Also in the environment, for the projects the package test configures against the install.
    export PKG_CONFIG_PATH="$deps_prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export CMAKE_PREFIX_PATH="$deps_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    lane_args=(-DCMAKE_PREFIX_PATH="$deps_prefix")
fi

ik_log "configuring ($BUILD_DIR)"
# Every optional part ON: a package missing here fails the configure, naming it, instead of
# leaving its tests out (a plain configure would skip the part with a status line).
parts=(-DIDEMKAFKA_BUILD_TESTS=ON -DIDEMKAFKA_BUILD_DOCS=ON -DIDEMKAFKA_BUILD_EXAMPLES=ON
    -DIDEMKAFKA_BUILD_TOOLS=ON -DIDEMKAFKA_BUILD_BENCH=ON -DIDEMKAFKA_BILLING_METRICS=ON
    -DIDEMKAFKA_BILLING_TESTS=ON -DIDEMKAFKA_ADMIN_CONSOLE=ON)
build_type=RelWithDebInfo
targets=()
if [ "$lane" = asan ]; then
    # The unit label and the integration tests most likely to find memory errors: the consumer's
    # engine, workers, pipelining, stored offsets, payload fingerprints, the claim transaction
    # (directly, a transaction per record, and through the handler harness), the waiting room's
    # fill (fairness) and log
    # records. The rest of the integration label (outbox, gauges, replay, producer ids, the test
    # kit) is left out to keep the lane within CI's budget: all of it took 14 minutes on two
    # shared cores, build included. Only these programs are built (the lane's time is mostly
    # the compiler's).
    # -Og -g1: a quarter of the compile time of -O2 -g under the sanitizers (about 9 s
    # instead of 35 s for one of the consumer's files), line numbers kept in the reports.
    parts=(-DIDEMKAFKA_BUILD_TESTS=ON -DIDEMKAFKA_BUILD_TOOLS=ON -DIDEMKAFKA_BUILD_DOCS=OFF
        -DIDEMKAFKA_BUILD_EXAMPLES=OFF -DIDEMKAFKA_BUILD_BENCH=OFF -DIDEMKAFKA_ADMIN_CONSOLE=OFF
        -DIDEMKAFKA_SANITIZE=address,undefined -DIDEMKAFKA_WERROR=OFF
        "-DCMAKE_CXX_FLAGS_DEBUG=-Og -g1")
    build_type=Debug
    targets=(idemkafka_unit_tests idemkafka_retention_unit_tests idemkafka_integration_tests
        idemkafka_logging_tests idemkafka_fairness_tests idemkafka_harness_tests
        idemkafka-mock-broker idemkafka-admin)
    if [ "$#" -eq 0 ]; then
        set -- -R '^(unit|unit_.*|retention_unit|integration_(consumer|workers|offsets|pipeline|fingerprint|claim_transaction|per_record|fairness|logging)|testing_harness)$'
    else
        targets=() # a selection of one's own: every program is built
    fi
    sanitizers="$IK_ROOT/tests/support/sanitizers"
    # Every finding fails the test: ASan and UBSan stop the program (the build adds
    # -fno-sanitize-recover=undefined), LeakSanitizer reports at exit with a non-zero status.
    export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$sanitizers/ubsan.supp${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi
# shellcheck disable=SC2086 # IDEMKAFKA_CMAKE_ARGS is a list of arguments
cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "${parts[@]}" "${lane_args[@]}" \
    -DIDEMKAFKA_TEST_KAFKA="$kafka" \
    ${IDEMKAFKA_CMAKE_ARGS:-}

ik_log "building${targets[*]:+ ${targets[*]}}"
cmake --build "$BUILD_DIR" -j2 ${targets[@]:+--target "${targets[@]}"}

versions="$("$BUILD_DIR/tools/admin/idemkafka-admin" --version 2>/dev/null | tail -n 1 || true)"
ik_log "lane $lane: ${versions:-versions unknown}"

ik_log "starting PostgreSQL"
ik_start_postgres

if [ "$kafka" = real ]; then
    ik_log "starting Apache Kafka (the broker the tests share)"
    ik_start_kafka
    # What runs where, in the log: the cases that need the mock's fault injection.
    ik_log "left out on Apache Kafka, run on the mock lanes ([mock] test cases):"
    for program in "$BUILD_DIR"/tests/idemkafka_*_tests "$BUILD_DIR"/tests/*/idemkafka_*_tests; do
        [ -x "$program" ] || continue
        # Catch v2 exits with the number of cases listed.
        { "$program" --list-test-names-only "[mock]" 2>/dev/null || true; } |
            sed -n "s|^\(..*\)$|    ${program##*/}: \1|p"
    done
    printf '    idemkafka_share_probe: all of it (the mock cluster'"'"'s share-group settings)\n'

fi

# No lane-wide broker: each test that needs Kafka runs through tests/support/run_isolated.sh,
# which starts a mock cluster of its own (its binary comes from CMake) and a database of its
# own, so tests run side by side. IDEMKAFKA_TEST_BROKERS, when set, names a broker every test
# then shares.

# Most tests wait on timers, rebalances and the broker, so more of them run at once than
# there are cores; the CPU-heavy ones (package, fuzz, bench) claim more slots (PROCESSORS).
# The asan lane: two at a time (each sanitized program is slower and takes more memory).
jobs_default=6
[ "$lane" = asan ] && jobs_default=2
jobs="${IDEMKAFKA_TEST_JOBS:-$jobs_default}"
ik_log "running tests (lane $lane, Kafka $kafka, $jobs at a time)"
log="$BUILD_DIR/ctest-$lane.log"
status=0
started=$(date +%s)
(cd "$BUILD_DIR" && ctest --output-on-failure --no-tests=error -j "$jobs" "$@") 2>&1 | tee "$log" ||
    status=${PIPESTATUS[0]}
ended=$(date +%s)
if [ "$status" -ne 0 ]; then
    ik_show_logs
fi
# The budget in every log: the slowest ten tests of this run, and the lane's test time.
printf '==> slowest tests (lane %s):\n' "$lane"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' "$log" |
    sort -rn | head -n 10 | awk '{ printf "    %8.1f s  %s\n", $1, $2 }'
ik_log "lane $lane: tests took $((ended - started)) s; ctest exited with $status"
exit "$status"
