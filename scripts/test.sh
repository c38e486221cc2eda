#!/usr/bin/env bash
# Builds idemkafka, starts a throwaway PostgreSQL and the mock Kafka cluster, runs the tests.
#
#   scripts/test.sh                 all labels, Debian lane
#   scripts/test.sh -L unit         extra arguments go to ctest
#   scripts/test.sh --lane modern   against libpqxx 7.10.7 and librdkafka 2.15.0 built from
#                                   ../shared/thirdparty by scripts/deps.sh (cached); the mock
#                                   broker is then librdkafka 2.15's
#
# Lanes: `debian` (default): Debian 12's libpqxx 6.4 and librdkafka 2.0.2, build dir
# <repo>/build; `modern`: the versions most users run, build dir <repo>/build-modern.
#
# Environment: BUILD_DIR (overrides the lane's build dir), IDEMKAFKA_CMAKE_ARGS (extra configure
# arguments, split on spaces), IDEMKAFKA_TEST_PG / IDEMKAFKA_TEST_BROKERS to use existing
# services instead of starting them, IDEMKAFKA_MOCK_BROKERS (mock cluster size, default 1).
set -euo pipefail

lane=debian
if [ "${1:-}" = "--lane" ]; then
    lane="${2:?--lane needs debian or modern}"
    shift 2
fi
case "$lane" in
    debian | modern) ;;
    *)
        printf 'error: unknown lane "%s" (debian or modern)\n' "$lane" >&2
        exit 2
        ;;
esac

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$lane" = modern ] && [ -z "${BUILD_DIR:-}" ]; then
    BUILD_DIR="$IK_ROOT/build-modern"
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
# shellcheck disable=SC2086 # IDEMKAFKA_CMAKE_ARGS is a list of arguments
cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${lane_args[@]}" ${IDEMKAFKA_CMAKE_ARGS:-}

ik_log "building"
cmake --build "$BUILD_DIR" -j2

versions="$("$BUILD_DIR/tools/admin/idemkafka-admin" --version 2>/dev/null | tail -n 1 || true)"
ik_log "lane $lane: ${versions:-versions unknown}"

ik_log "starting PostgreSQL"
ik_start_postgres

ik_log "starting the mock Kafka cluster"
ik_start_broker --brokers "${IDEMKAFKA_MOCK_BROKERS:-1}"

ik_log "running tests (lane $lane)"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --no-tests=error "$@") || status=$?
if [ "$status" -ne 0 ]; then
    ik_show_logs
fi
ik_log "lane $lane: ctest exited with $status"
exit "$status"
