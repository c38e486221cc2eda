#!/usr/bin/env bash
# Builds the Spring Kafka peer of the benchmark (bench/peers/spring, Spring Boot 4.0.7) into a
# cache outside the repository and prints the path of its runnable jar. The build is keyed by a
# hash of the peer's sources, so it runs again only when they change; Maven resolves the
# dependencies into its local repository (~/.m2 unless MAVEN_REPO_LOCAL names another).
# Java 17 and Maven are needed.
#
#   scripts/spring-peer.sh            build when needed, print the jar's path
#   scripts/spring-peer.sh --check    exit 0 when Java 17+ and Maven are there, else say why
#
# Environment: IDEMKAFKA_SPRING_CACHE (default ~/.cache/idemkafka-spring-peer), MAVEN_REPO_LOCAL.
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$IK_ROOT/bench/peers/spring"
cache="${IDEMKAFKA_SPRING_CACHE:-$HOME/.cache/idemkafka-spring-peer}"

# Prints why the peer cannot be built here, or nothing.
missing_tools() {
    if ! command -v java >/dev/null 2>&1; then
        echo "no java on PATH (Java 17 or later is needed)"
    elif ! command -v mvn >/dev/null 2>&1; then
        echo "no mvn on PATH (Maven is needed)"
    else
        local v
        v="$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)"
        if [ -z "$v" ] || [ "$v" -lt 17 ]; then
            echo "java is version ${v:-unknown}, 17 or later is needed"
        fi
    fi
}

if [ "${1:-}" = "--check" ]; then
    why="$(missing_tools)"
    [ -z "$why" ] && exit 0
    printf '%s\n' "$why"
    exit 1
fi
why="$(missing_tools)"
[ -z "$why" ] || { printf 'error: cannot build the Spring peer: %s\n' "$why" >&2; exit 1; }

hash="$(cd "$src" && find pom.xml src -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
dir="$cache/$hash"
jar="$dir/target/spring-peer.jar"
if [ ! -f "$jar" ]; then
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    cp -r "$src/pom.xml" "$src/src" "$dir.tmp/"
    repo=()
    [ -n "${MAVEN_REPO_LOCAL:-}" ] && repo=(-Dmaven.repo.local="$MAVEN_REPO_LOCAL")
    printf '==> building the Spring peer (%s)\n' "$dir" >&2
    if ! (cd "$dir.tmp" && mvn -B -q "${repo[@]}" -Dmaven.test.skip=true package >"$dir.tmp/build.log" 2>&1); then
        tail -n 40 "$dir.tmp/build.log" >&2
        printf 'error: the Spring peer did not build (log: %s/build.log)\n' "$dir.tmp" >&2
        exit 1
    fi
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
fi
printf '%s\n' "$jar"
