#!/usr/bin/env bash
# Builds the pinned release sources of libpqxx and librdkafka (the compatibility lane, see
# /work/shared/thirdparty/README.md) into a cache outside the repository and prints the
# install prefix. A library is built only when its stamp in the prefix is missing or stale;
# the stamp is written after a successful install, so a failed build is redone next time.
#
#   scripts/deps.sh                 build what is missing, print the prefix
#   scripts/deps.sh --print-prefix  print the prefix, build nothing
#   scripts/deps.sh --check         exit 0 when both libraries are built and current
#   scripts/deps.sh --force         wipe the prefix and rebuild both
#
#   prefix=$(scripts/deps.sh)
#   cmake -S . -B build-modern -DCMAKE_PREFIX_PATH="$prefix" ...   # with
#   PKG_CONFIG_PATH="$prefix/lib/pkgconfig" (librdkafka is found through pkg-config)
#
# Progress goes to stderr; stdout carries only the prefix, as its last line. Build output
# goes to <cache>/logs/<library>-<version>.log; its tail is shown on failure.
#
# Environment: IDEMKAFKA_DEPS_CACHE (default ~/.cache/idemkafka-deps),
# IDEMKAFKA_THIRDPARTY_DIR (the tarballs; default: ../shared/thirdparty next to the
# repository, else /work/shared/thirdparty),
# IDEMKAFKA_DEPS_JOBS (parallel jobs, default 2), CC/CXX as usual.
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IK_NO_TRAP=1 # no services here; our own trap removes the temp dir
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

PQXX_VERSION=7.10.7
PQXX_SHA256=1cdb229caf954b6fe5aad08e3ac42aee179bd2ad1ae0783f3b96002d113baaff
RDKAFKA_VERSION=2.15.0
RDKAFKA_SHA256=3d8bae7411d6d8f5f9fb2969fff872eec4b63b759253ed4f473e5afbd153c7f1
# Bump when the build options below change, so existing caches are rebuilt.
RECIPE=1

DEPS_PACKAGES=(libpq-dev zlib1g-dev libssl-dev libsasl2-dev libzstd-dev liblz4-dev
    cmake g++ make pkg-config)

CACHE="${IDEMKAFKA_DEPS_CACHE:-$HOME/.cache/idemkafka-deps}"
if [ -n "${IDEMKAFKA_THIRDPARTY_DIR:-}" ]; then
    THIRDPARTY="$IDEMKAFKA_THIRDPARTY_DIR"
elif [ -d "$IK_ROOT/../shared/thirdparty" ]; then
    THIRDPARTY="$(cd "$IK_ROOT/../shared/thirdparty" && pwd)"
else
    THIRDPARTY=/work/shared/thirdparty
fi
JOBS="${IDEMKAFKA_DEPS_JOBS:-2}"
PREFIX="$CACHE/libpqxx-${PQXX_VERSION}_librdkafka-${RDKAFKA_VERSION}"

PQXX_CMAKE_ARGS=(-DBUILD_SHARED_LIBS=ON -DSKIP_BUILD_TEST=ON -DBUILD_TEST=OFF -DBUILD_DOC=OFF
    -DCMAKE_CXX_STANDARD=17)
# Explicit feature switches: a missing -dev package fails the build instead of silently
# producing a librdkafka without SSL/SASL/zstd. CURL only serves OIDC token fetching.
RDKAFKA_CMAKE_ARGS=(-DRDKAFKA_BUILD_TESTS=OFF -DRDKAFKA_BUILD_EXAMPLES=OFF -DRDKAFKA_BUILD_STATIC=OFF
    -DWITH_SSL=ON -DWITH_SASL=ON -DWITH_ZLIB=ON -DWITH_ZSTD=ON -DENABLE_LZ4_EXT=ON -DWITH_CURL=OFF)

usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

log() { ik_log "$@" >&2; }

mode=build
force=0
while [ $# -gt 0 ]; do
    case "$1" in
        --print-prefix) mode=print ;;
        --check) mode=check ;;
        --force) force=1 ;;
        -j | --jobs)
            [ $# -ge 2 ] || ik_die "$1 needs a number"
            JOBS="$2"
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) ik_die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
case "$JOBS" in
    '' | *[!0-9]*) ik_die "jobs must be a number, not '$JOBS'" ;;
esac

if [ "$mode" = print ]; then
    printf '%s\n' "$PREFIX"
    exit 0
fi

# What a stamp must say for the installed library to be reused.
stamp_text() { # name version sha256 cmake-args...
    local name="$1" version="$2" sha="$3"
    shift 3
    printf 'name=%s\nversion=%s\nsha256=%s\nrecipe=%s\ncmake_args=%s\ncc=%s\ncxx=%s\n' \
        "$name" "$version" "$sha" "$RECIPE" "$*" "${CC:-default}" "${CXX:-default}"
}

stamp_ok() { # name stamp-text
    local stamp="$PREFIX/.stamp-$1"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$2" ]
}

want_pqxx="$(stamp_text libpqxx "$PQXX_VERSION" "$PQXX_SHA256" "${PQXX_CMAKE_ARGS[@]}")"
want_rdkafka="$(stamp_text librdkafka "$RDKAFKA_VERSION" "$RDKAFKA_SHA256" "${RDKAFKA_CMAKE_ARGS[@]}")"

if [ "$mode" = check ]; then
    stamp_ok libpqxx "$want_pqxx" && stamp_ok librdkafka "$want_rdkafka"
    exit
fi

# Checks the tarball against the pinned checksum (and SHA256SUMS beside it, when present).
verify() { # file sha256
    local file="$1" want="$2" got listed
    [ -f "$file" ] || ik_die "$file not found (set IDEMKAFKA_THIRDPARTY_DIR)"
    if [ -f "$THIRDPARTY/SHA256SUMS" ]; then
        listed="$(awk -v f="$(basename "$file")" '$2 == f || $2 == "*" f { print $1 }' "$THIRDPARTY/SHA256SUMS")"
        if [ -n "$listed" ] && [ "$listed" != "$want" ]; then
            ik_die "SHA256SUMS lists $listed for $(basename "$file"), this script pins $want"
        fi
    fi
    got="$(sha256sum "$file" | cut -d ' ' -f 1)"
    [ "$got" = "$want" ] || ik_die "checksum mismatch for $file: got $got, want $want"
}

run_logged() { # log-file command...
    local logfile="$1"
    shift
    printf '+ %s\n' "$*" >>"$logfile"
    "$@" >>"$logfile" 2>&1
}

fail_build() { # name version log-file
    printf -- '--- %s (last 40 lines) ---\n' "$3" >&2
    tail -n 40 "$3" >&2 || true
    ik_die "building $1 $2 failed; full log: $3"
}

# Verifies, unpacks, configures, builds and installs one library into $PREFIX.
build_one() { # name version sha256 tarball stamp-text cmake-args...
    local name="$1" version="$2" sha="$3" tarball="$4" stamp="$5"
    shift 5
    local logfile="$CACHE/logs/$name-$version.log"
    local src="$WORK/$name-src" bld="$WORK/$name-build" top start

    log "verifying $(basename "$tarball")"
    verify "$tarball" "$sha"

    log "building $name $version into $PREFIX (log: $logfile)"
    start=$SECONDS
    rm -f "$PREFIX/.stamp-$name"
    : >"$logfile"
    mkdir -p "$src"
    tar -xzf "$tarball" -C "$src" || ik_die "could not unpack $tarball"
    top="$(find "$src" -mindepth 1 -maxdepth 1 -type d)"
    if [ -z "$top" ] || [ "$(printf '%s\n' "$top" | wc -l)" -ne 1 ] || [ ! -f "$top/CMakeLists.txt" ]; then
        ik_die "$tarball does not unpack to one directory with a CMakeLists.txt"
    fi

    run_logged "$logfile" cmake -S "$top" -B "$bld" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$PREFIX" \
        -DCMAKE_INSTALL_LIBDIR=lib \
        -DCMAKE_PREFIX_PATH="$PREFIX" \
        "$@" || fail_build "$name" "$version" "$logfile"
    run_logged "$logfile" cmake --build "$bld" -j "$JOBS" || fail_build "$name" "$version" "$logfile"
    run_logged "$logfile" cmake --install "$bld" || fail_build "$name" "$version" "$logfile"
    rm -rf "$src" "$bld"

    local f
    for f in "${EXPECT[@]}"; do
        [ -e "$PREFIX/$f" ] || ik_die "$name $version installed, but $PREFIX/$f is missing"
    done
    printf '%s\n' "$stamp" >"$PREFIX/.stamp-$name"
    log "$name $version installed in $((SECONDS - start)) s"
}

mkdir -p "$CACHE/logs"
# One build at a time per cache.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lock"
    if ! flock -n 9; then
        log "waiting for another scripts/deps.sh to finish with $CACHE"
        flock 9
    fi
fi

if [ "$force" -eq 1 ] && [ -d "$PREFIX" ]; then
    log "--force: removing $PREFIX"
    rm -rf "$PREFIX"
fi

if stamp_ok libpqxx "$want_pqxx" && stamp_ok librdkafka "$want_rdkafka"; then
    log "libpqxx $PQXX_VERSION and librdkafka $RDKAFKA_VERSION already built in $PREFIX"
    printf '%s\n' "$PREFIX"
    exit 0
fi

# apt-get talks on stdout; keep stdout for the prefix.
ik_ensure_deb_packages "${DEPS_PACKAGES[@]}" >&2

WORK="$(mktemp -d "${TMPDIR:-/tmp}/idemkafka-deps.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$PREFIX"

if stamp_ok librdkafka "$want_rdkafka"; then
    log "librdkafka $RDKAFKA_VERSION already built"
else
    EXPECT=(include/librdkafka/rdkafka.h include/librdkafka/rdkafka_mock.h include/librdkafka/rdkafkacpp.h
        lib/librdkafka.so lib/pkgconfig/rdkafka.pc lib/cmake/RdKafka/RdKafkaConfig.cmake)
    build_one librdkafka "$RDKAFKA_VERSION" "$RDKAFKA_SHA256" "$THIRDPARTY/librdkafka-$RDKAFKA_VERSION.tar.gz" \
        "$want_rdkafka" "${RDKAFKA_CMAKE_ARGS[@]}"
fi

if stamp_ok libpqxx "$want_pqxx"; then
    log "libpqxx $PQXX_VERSION already built"
else
    EXPECT=(include/pqxx/pqxx lib/libpqxx.so lib/pkgconfig/libpqxx.pc lib/cmake/libpqxx/libpqxx-config.cmake)
    build_one libpqxx "$PQXX_VERSION" "$PQXX_SHA256" "$THIRDPARTY/libpqxx-$PQXX_VERSION.tar.gz" \
        "$want_pqxx" "${PQXX_CMAKE_ARGS[@]}"
fi

printf '%s\n' "$PREFIX"
