# shellcheck shell=bash
# Shared helpers for idemkafka's scripts. Source it from bash:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# Sourcing registers ik_cleanup on EXIT (and turns INT/TERM into an exit), so whatever
# ik_start_postgres and ik_start_broker started is stopped even when the script fails.
# Set IK_NO_TRAP=1 before sourcing to manage the traps yourself; then call ik_cleanup.
#
# Exports, for the tests:
#   IDEMKAFKA_TEST_PG          libpq conninfo of the throwaway server (kept if already set)
#   IDEMKAFKA_TEST_BROKERS     bootstrap servers of the mock cluster (kept if already set)
#   IDEMKAFKA_MOCK_CONTROL     control FIFO of that mock cluster (only when we started it)
#   IDEMKAFKA_MOCK_BROKER_BIN  the idemkafka-mock-broker binary, for tests that run their own

IK_ROOT="${IK_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
BUILD_DIR="${BUILD_DIR:-$IK_ROOT/build}"
case "$BUILD_DIR" in
    /*) ;;
    *) BUILD_DIR="$PWD/$BUILD_DIR" ;;
esac

IK_PACKAGES=(librdkafka-dev libpqxx-dev libfmt-dev catch2 nlohmann-json3-dev libxxhash-dev libcpp-httplib-dev doxygen postgresql cmake g++ clang clang-format clang-tidy pkg-config make libclang-rt-dev nftables pgbouncer chromium prometheus)

# State for ik_cleanup.
_ik_pg_dir=""
_ik_pg_data=""
_ik_broker_dir=""
_ik_broker_pid=""
_ik_kafka_dir=""
_ik_watchdog_pid=""

ik_log() { printf '==> %s\n' "$*"; }
ik_warn() { printf 'warning: %s\n' "$*" >&2; }
ik_die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

_ik_is_root() { [ "$(id -u)" -eq 0 ]; }

_ik_pkg_installed() {
    dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

# Installs the Debian packages the build and the tests need, when any is missing.
ik_ensure_packages() {
    ik_ensure_deb_packages "${IK_PACKAGES[@]}"
}

# What the console's browser test needs: Chromium (Debian's package) and Node.js with npm. A
# node and npm already on the PATH (from NodeSource, say) are used as they are; only when one
# is missing are Debian's nodejs and npm installed.
ik_ensure_browser_tools() {
    ik_ensure_deb_packages chromium
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        ik_ensure_deb_packages nodejs npm
    fi
    command -v node >/dev/null 2>&1 || ik_die "node is missing after installing nodejs"
    command -v npm >/dev/null 2>&1 || ik_die "npm is missing after installing npm"
}

# Installs the named Debian packages when any is missing: as root with apt-get, otherwise
# it prints the command to run and exits. Without dpkg it only warns.
#   ik_ensure_deb_packages zlib1g-dev libssl-dev
ik_ensure_deb_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        ik_warn "no dpkg here: not checking for $*"
        return 0
    fi
    local missing=() pkg
    for pkg in "$@"; do
        if _ik_pkg_installed "$pkg"; then
            continue
        fi
        # A versioned server package (postgresql-15, ...) serves as well as the metapackage.
        if [ "$pkg" = postgresql ] &&
            dpkg-query -W -f='${Status}\n' 'postgresql-[0-9]*' 2>/dev/null | grep -q '^install ok installed$'; then
            continue
        fi
        missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0

    local install="DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
    if ! _ik_is_root; then
        printf 'error: missing packages: %s\ninstall them with:\n  sudo apt-get update && sudo %s\n' \
            "${missing[*]}" "$install" >&2
        exit 1
    fi
    ik_log "installing ${missing[*]}"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
}

# Prints the directory holding initdb and pg_ctl: PATH first, else the newest
# /usr/lib/postgresql/*/bin.
ik_pg_bin() {
    local initdb
    if initdb="$(command -v initdb 2>/dev/null)" && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$initdb")"
        return 0
    fi
    local dir
    dir="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    if [ ! -x "$dir/initdb" ]; then
        ik_die "initdb not found (is the postgresql package installed?)"
    fi
    printf '%s\n' "$dir"
}

# Runs a command as the postgres OS user when we are root (the server refuses to run as root).
_ik_as_pg() {
    if _ik_is_root; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

_ik_port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

_ik_random_port() {
    local port
    while :; do
        # Below Linux's ephemeral range (32768-60999), so no client connection holds it.
        port=$((20000 + RANDOM % 12000))
        _ik_port_in_use "$port" || break
    done
    printf '%s\n' "$port"
}

# Prints a loopback TCP port that nothing listens on right now.
ik_free_port() { _ik_random_port; }

# GET http://HOST:PORT/PATH; prints the whole response (status line, headers, body) and
# fails when nothing answers within 5 s. Plain bash, so no HTTP client is needed.
ik_http_get() {
    local host="$1" port="$2" path="$3"
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1
        printf "GET %s HTTP/1.0\r\nHost: %s\r\nConnection: close\r\n\r\n" "$3" "$1" >&3
        cat <&3' _ "$host" "$port" "$path" 2>/dev/null
}

# If this script dies without running its EXIT trap (SIGKILL), a small background process
# stops the services and removes their temp dirs once the script's pid is gone. The broker
# also watches the pid itself (--watch-pid); the server has no such option.
_ik_start_watchdog() {
    [ -z "$_ik_watchdog_pid" ] || return 0
    local script_pid=$$ pg_ctl_cmd="" kafka_dir="$_ik_kafka_dir"
    if [ -n "$_ik_pg_data" ]; then
        pg_ctl_cmd="$(ik_pg_bin)/pg_ctl" || exit 1
    fi
    (
        trap - EXIT INT TERM
        while kill -0 "$script_pid" 2>/dev/null; do
            sleep 1
        done
        if [ -n "$pg_ctl_cmd" ] && [ -f "$_ik_pg_data/postmaster.pid" ]; then
            _ik_as_pg "$pg_ctl_cmd" -D "$_ik_pg_data" -m immediate -w -t 60 stop || true
        fi
        if [ -n "$kafka_dir" ]; then
            for pid_file in "$kafka_dir"/node-*/pid; do
                [ -f "$pid_file" ] && kill -KILL "$(cat "$pid_file")" 2>/dev/null
            done
        fi
        sleep 2 # time for the broker to notice and exit
        rm -rf "$_ik_pg_dir" "$_ik_broker_dir" "$kafka_dir"
    ) </dev/null >/dev/null 2>&1 &
    _ik_watchdog_pid=$!
}

_ik_stop_watchdog() {
    if [ -n "$_ik_watchdog_pid" ]; then
        kill "$_ik_watchdog_pid" 2>/dev/null || true
        wait "$_ik_watchdog_pid" 2>/dev/null || true
        _ik_watchdog_pid=""
    fi
}

# Starts a throwaway PostgreSQL cluster in a temp dir and exports IDEMKAFKA_TEST_PG,
# unless IDEMKAFKA_TEST_PG already names a server.
ik_start_postgres() {
    if [ -n "${IDEMKAFKA_TEST_PG:-}" ]; then
        ik_log "using PostgreSQL at '$IDEMKAFKA_TEST_PG'"
        return 0
    fi
    local bin base
    bin="$(ik_pg_bin)" || exit 1
    base="${TMPDIR:-/tmp}"
    if _ik_is_root; then
        id postgres >/dev/null 2>&1 || ik_die "running as root but there is no 'postgres' user to run the server"
        # The server runs as postgres, which must reach the socket directory.
        runuser -u postgres -- test -w "$base" -a -x "$base" 2>/dev/null || base=/tmp
    fi
    _ik_pg_dir="$(mktemp -d "$base/idemkafka-pg.XXXXXX")"
    _ik_pg_data="$_ik_pg_dir/data"
    if _ik_is_root; then
        chown postgres: "$_ik_pg_dir"
    fi

    # --no-sync only skips initdb's own flushes; the server runs with fsync on.
    _ik_as_pg "$bin/initdb" -D "$_ik_pg_data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$_ik_pg_dir/initdb.log" 2>&1 || {
        cat "$_ik_pg_dir/initdb.log" >&2
        ik_die "initdb failed"
    }

    local attempt port=""
    for attempt in 1 2 3 4 5; do
        port="$(_ik_random_port)"
        _ik_as_pg tee -a "$_ik_pg_data/postgresql.conf" >/dev/null <<EOF

# idemkafka test cluster (attempt $attempt)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$_ik_pg_dir'
max_connections = 200
fsync = on
EOF
        if _ik_as_pg "$bin/pg_ctl" -D "$_ik_pg_data" -l "$_ik_pg_dir/postgres.log" -w -t 60 start >/dev/null; then
            break
        fi
        # A lost race for the port is worth another try; anything else shows in the log.
        if ! grep -q 'could not bind\|could not create any TCP/IP sockets' "$_ik_pg_dir/postgres.log" 2>/dev/null ||
            [ "$attempt" -eq 5 ]; then
            tail -n 30 "$_ik_pg_dir/postgres.log" >&2 || true
            ik_die "PostgreSQL did not start"
        fi
        port=""
    done

    local conninfo="host=$_ik_pg_dir port=$port dbname=idemkafka_test user=postgres"
    "$bin/psql" -X -q -v ON_ERROR_STOP=1 -d "host=$_ik_pg_dir port=$port dbname=postgres user=postgres" \
        -c 'CREATE DATABASE idemkafka_test' || ik_die "could not create database idemkafka_test"
    export IDEMKAFKA_TEST_PG="$conninfo"
    # For fault tests that restart the server mid-run.
    local as_pg=""
    _ik_is_root && as_pg="runuser -u postgres -- "
    export IDEMKAFKA_TEST_PG_RESTART="${as_pg}$bin/pg_ctl -D $_ik_pg_data -l $_ik_pg_dir/postgres.log -m fast -w -t 60 restart"
    _ik_stop_watchdog
    _ik_start_watchdog
    ik_log "PostgreSQL ready: $IDEMKAFKA_TEST_PG (also 127.0.0.1:$port)"
}

# Starts idemkafka-mock-broker in the background (extra arguments go to it, e.g. --brokers 3)
# and exports IDEMKAFKA_TEST_BROKERS and IDEMKAFKA_MOCK_CONTROL, unless
# IDEMKAFKA_TEST_BROKERS already names a cluster.
ik_start_broker() {
    local bin="${IDEMKAFKA_MOCK_BROKER_BIN:-$BUILD_DIR/tools/idemkafka-mock-broker}"
    [ -x "$bin" ] && export IDEMKAFKA_MOCK_BROKER_BIN="$bin"
    if [ -n "${IDEMKAFKA_TEST_BROKERS:-}" ]; then
        ik_log "using Kafka at '$IDEMKAFKA_TEST_BROKERS'"
        return 0
    fi
    [ -x "$bin" ] || ik_die "$bin not found: build first (or set IDEMKAFKA_TEST_BROKERS)"

    _ik_broker_dir="$(mktemp -d "${TMPDIR:-/tmp}/idemkafka-broker.XXXXXX")"
    local bootstrap_file="$_ik_broker_dir/bootstrap" control="$_ik_broker_dir/control"
    # --watch-pid: the cluster goes away even when this script is killed with SIGKILL.
    "$bin" --bootstrap-file "$bootstrap_file" --control "$control" --watch-pid "$$" "$@" \
        </dev/null >"$_ik_broker_dir/broker.log" 2>&1 &
    _ik_broker_pid=$!
    _ik_stop_watchdog
    _ik_start_watchdog

    local waited=0
    while [ ! -s "$bootstrap_file" ]; do
        if ! kill -0 "$_ik_broker_pid" 2>/dev/null; then
            wait "$_ik_broker_pid" 2>/dev/null || true
            _ik_broker_pid=""
            cat "$_ik_broker_dir/broker.log" >&2 || true
            ik_die "idemkafka-mock-broker exited during startup"
        fi
        if [ "$waited" -ge 200 ]; then
            cat "$_ik_broker_dir/broker.log" >&2 || true
            ik_die "idemkafka-mock-broker did not write $bootstrap_file within 20 s"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done

    IDEMKAFKA_TEST_BROKERS="$(head -n 1 "$bootstrap_file")"
    export IDEMKAFKA_TEST_BROKERS
    export IDEMKAFKA_MOCK_CONTROL="$control"
    ik_log "mock broker ready: $IDEMKAFKA_TEST_BROKERS (pid $_ik_broker_pid, control $control)"
}

# The real Apache Kafka broker (KRaft), from its release jars resolved through Maven
# (scripts/kafka/pom.xml) into a cache outside the repository, keyed by version.
IK_KAFKA_VERSION=4.3.1
IK_KAFKA_CACHE="${IDEMKAFKA_KAFKA_CACHE:-$HOME/.cache/idemkafka-kafka}"

# Prints the directory holding the broker's jars, resolving them with Maven when they are
# missing or the pom changed. Progress goes to stderr.
ik_kafka_libs() {
    local pom="$IK_ROOT/scripts/kafka/pom.xml" dir="$IK_KAFKA_CACHE/kafka-$IK_KAFKA_VERSION"
    local want
    want="$(sha256sum "$pom" | cut -d' ' -f1)"
    if [ -f "$dir/stamp" ] && [ "$(cat "$dir/stamp")" = "$want" ]; then
        printf '%s\n' "$dir/libs"
        return 0
    fi
    command -v java >/dev/null 2>&1 || ik_ensure_deb_packages openjdk-17-jre-headless
    command -v mvn >/dev/null 2>&1 || ik_ensure_deb_packages maven
    ik_log "resolving Apache Kafka $IK_KAFKA_VERSION through Maven into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$dir"
    if ! mvn -q -B -f "$pom" -Dkafka.version="$IK_KAFKA_VERSION" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$dir/libs" >"$dir/maven.log" 2>&1; then
        tail -n 30 "$dir/maven.log" >&2
        ik_die "Maven could not resolve the Kafka $IK_KAFKA_VERSION broker (log: $dir/maven.log)"
    fi
    [ -f "$dir/libs/kafka_2.13-$IK_KAFKA_VERSION.jar" ] ||
        ik_die "Maven resolved no kafka_2.13-$IK_KAFKA_VERSION.jar (log: $dir/maven.log)"
    printf '%s\n' "$want" >"$dir/stamp"
    printf '%s\n' "$dir/libs"
}

# Runs a class of the broker's jars in the foreground: _ik_kafka_java LIBS CLASS ARGS...
_ik_kafka_java() {
    local libs="$1"
    shift
    java -Xms128m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        ${IDEMKAFKA_KAFKA_JAVA_OPTS:-} -cp "$libs/*" "$@"
}

# Starts node ID of the cluster in DIR in the background and returns at once; its pid goes to
# DIR/node-ID/pid. The node's log is DIR/node-ID/server.log (log4j) and stdout.
_ik_kafka_node_launch() {
    local dir="$1" id="$2" node libs
    node="$dir/node-$id"
    libs="$(cat "$dir/libs")"
    # Marks where this start's log begins, so the wait below reads only this start.
    if [ -f "$node/server.log" ]; then wc -l <"$node/server.log" >"$node/log-start"; else echo 0 >"$node/log-start"; fi
    (
        trap - EXIT INT TERM
        exec java -Xms128m -Xmx768m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
            ${IDEMKAFKA_KAFKA_JAVA_OPTS:-} -Dlog4j2.configurationFile="$node/log4j2.properties" \
            -Dkafka.logs.dir="$node" -cp "$libs/*" kafka.Kafka "$node/server.properties"
    ) </dev/null >>"$node/stdout" 2>&1 &
    printf '%s\n' "$!" >"$node/pid"
}

# Waits until node ID of the cluster in DIR has started (its log says so) and accepts
# connections; fails, showing the log, when it exits or takes longer than 120 s.
_ik_kafka_node_wait() {
    local dir="$1" id="$2" node pid from port waited=0
    node="$dir/node-$id"
    pid="$(cat "$node/pid")"
    from="$(($(cat "$node/log-start") + 1))"
    port="$(sed -n 's/^listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$node/server.properties")"
    until tail -n "+$from" "$node/server.log" 2>/dev/null | grep -q 'Kafka Server started' &&
        _ik_port_in_use "$port"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$node/server.log" "$node/stdout" >&2 2>/dev/null || true
            ik_die "Kafka node $id exited during startup (logs in $node)"
        fi
        if [ "$waited" -ge 1200 ]; then
            tail -n 40 "$node/server.log" >&2 2>/dev/null || true
            ik_die "Kafka node $id did not start within 120 s (logs in $node)"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

# Creates a cluster of N combined broker+controller nodes (KRaft, static quorum) in DIR, on
# free loopback ports, formats its storage and starts it; returns once every node serves.
# Replication factors of the internal topics are min(N, 3), min.insync.replicas min(N, 2).
# Writes DIR/bootstrap (the bootstrap servers).
ik_kafka_create() {
    local dir="$1" brokers="$2" libs cluster_id id voters="" bootstrap="" rf isr
    [ "$brokers" -ge 1 ] 2>/dev/null || ik_die "the number of Kafka brokers must be 1 or more, not '$brokers'"
    libs="$(ik_kafka_libs)"
    mkdir -p "$dir"
    printf '%s\n' "$libs" >"$dir/libs"
    rf=$((brokers < 3 ? brokers : 3))
    isr=$((brokers < 2 ? 1 : 2))
    local -a ports=() controller_ports=()
    for id in $(seq 1 "$brokers"); do
        ports[id]="$(_ik_random_port)"
        controller_ports[id]="$(_ik_random_port)"
        voters="${voters:+$voters,}$id@127.0.0.1:${controller_ports[id]}"
        bootstrap="${bootstrap:+$bootstrap,}127.0.0.1:${ports[id]}"
    done
    cluster_id="$(_ik_kafka_java "$libs" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    [ -n "$cluster_id" ] || ik_die "could not make a Kafka cluster id (java -cp $libs/* kafka.tools.StorageTool)"
    for id in $(seq 1 "$brokers"); do
        local node="$dir/node-$id"
        mkdir -p "$node/data"
        {
            cat "$IK_ROOT/scripts/kafka/broker.properties"
            cat <<EOF

# Node $id of $brokers (scripts/lib.sh ik_kafka_create)
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:${ports[id]},CONTROLLER://127.0.0.1:${controller_ports[id]}
advertised.listeners=PLAINTEXT://127.0.0.1:${ports[id]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$node/data
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
EOF
        } >"$node/server.properties"
        cat >"$node/log4j2.properties" <<EOF
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $node/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
        if ! _ik_kafka_java "$libs" kafka.tools.StorageTool format -t "$cluster_id" -c "$node/server.properties" \
            >"$node/format.log" 2>&1; then
            cat "$node/format.log" >&2
            ik_die "could not format the storage of Kafka node $id"
        fi
    done
    printf '%s\n' "$bootstrap" >"$dir/bootstrap"
    for id in $(seq 1 "$brokers"); do
        _ik_kafka_node_launch "$dir" "$id"
    done
    for id in $(seq 1 "$brokers"); do
        _ik_kafka_node_wait "$dir" "$id"
    done
}

# Fault control of one node of the cluster in DIR:
#   ik_kafka_ctl DIR kill ID      SIGKILL (a crash; the node's storage stays)
#   ik_kafka_ctl DIR stop ID      SIGSTOP (frozen: connections stay open, nothing answers)
#   ik_kafka_ctl DIR cont ID      SIGCONT
#   ik_kafka_ctl DIR start ID     start a killed node again and wait until it serves
#   ik_kafka_ctl DIR term ID      SIGTERM and wait (a clean shutdown)
ik_kafka_ctl() {
    local dir="$1" what="$2" id="$3" pid_file
    pid_file="$dir/node-$id/pid"
    [ -f "$pid_file" ] || ik_die "no Kafka node $id in $dir"
    case "$what" in
        kill)
            kill -KILL "$(cat "$pid_file")" 2>/dev/null || true
            while kill -0 "$(cat "$pid_file")" 2>/dev/null; do sleep 0.05; done
            ;;
        stop) kill -STOP "$(cat "$pid_file")" ;;
        cont) kill -CONT "$(cat "$pid_file")" ;;
        term)
            kill -TERM "$(cat "$pid_file")" 2>/dev/null || true
            local tries=0
            while kill -0 "$(cat "$pid_file")" 2>/dev/null; do
                [ "$tries" -lt 600 ] || kill -KILL "$(cat "$pid_file")" 2>/dev/null || true
                sleep 0.05
                tries=$((tries + 1))
            done
            ;;
        start)
            kill -0 "$(cat "$pid_file")" 2>/dev/null && ik_die "Kafka node $id is running"
            _ik_kafka_node_launch "$dir" "$id"
            _ik_kafka_node_wait "$dir" "$id"
            ;;
        *) ik_die "unknown Kafka node command '$what' (kill, stop, cont, start, term)" ;;
    esac
}

# Creates TOPIC with PARTITIONS partitions on the Apache Kafka cluster at BOOTSTRAP (Kafka's own
# kafka-topics; an existing topic is left as it is).
#   ik_kafka_create_topic 127.0.0.1:9092 orders 4
ik_kafka_create_topic() {
    local bootstrap="$1" topic="$2" partitions="$3" libs
    libs="$(ik_kafka_libs)"
    _ik_kafka_java "$libs" -Dlog4j2.level=WARN org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
        --create --if-not-exists --topic "$topic" --partitions "$partitions" >/dev/null ||
        ik_die "could not create topic $topic ($partitions partitions) on $bootstrap"
}

# Stops every node of the cluster in DIR (SIGCONT first: a frozen node cannot stop).
ik_kafka_stop() {
    local dir="$1" pid_file pid tries
    for pid_file in "$dir"/node-*/pid; do
        [ -f "$pid_file" ] || continue
        pid="$(cat "$pid_file")"
        kill -CONT "$pid" 2>/dev/null || true
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid_file in "$dir"/node-*/pid; do
        [ -f "$pid_file" ] || continue
        pid="$(cat "$pid_file")"
        tries=0
        while kill -0 "$pid" 2>/dev/null && [ "$tries" -lt 200 ]; do
            sleep 0.1
            tries=$((tries + 1))
        done
        kill -KILL "$pid" 2>/dev/null || true
    done
}

# Starts a throwaway Apache Kafka cluster (default 1 node; --brokers N) in a temp dir and
# exports IDEMKAFKA_TEST_BROKERS, IDEMKAFKA_KAFKA_DIR and IDEMKAFKA_KAFKA_CTL (a command taking
# "kill|stop|cont|start|term NODE", for tests that fault the broker), unless
# IDEMKAFKA_TEST_BROKERS already names a cluster. Stopped by ik_cleanup.
ik_start_kafka() {
    local brokers=1
    if [ "${1:-}" = "--brokers" ]; then
        brokers="${2:?--brokers needs a number}"
    fi
    if [ -n "${IDEMKAFKA_TEST_BROKERS:-}" ]; then
        ik_log "using Kafka at '$IDEMKAFKA_TEST_BROKERS'"
        return 0
    fi
    _ik_kafka_dir="$(mktemp -d "${TMPDIR:-/tmp}/idemkafka-kafka.XXXXXX")"
    _ik_stop_watchdog
    _ik_start_watchdog
    ik_kafka_create "$_ik_kafka_dir" "$brokers"
    IDEMKAFKA_TEST_BROKERS="$(cat "$_ik_kafka_dir/bootstrap")"
    export IDEMKAFKA_TEST_BROKERS
    export IDEMKAFKA_KAFKA_DIR="$_ik_kafka_dir"
    export IDEMKAFKA_KAFKA_CTL="bash $IK_ROOT/scripts/kafka.sh ctl $_ik_kafka_dir"
    unset IDEMKAFKA_MOCK_CONTROL
    ik_log "Apache Kafka $IK_KAFKA_VERSION ready: $IDEMKAFKA_TEST_BROKERS ($brokers node(s), $_ik_kafka_dir)"
}

# Sends one command to the mock cluster's control FIFO and waits until it has been applied.
# Prints the result; returns 0 on "ok", 1 on an error. One writer at a time: the
# acknowledgement file only carries the latest result.
#   ik_mock_control broker-down 1
ik_mock_control() {
    local fifo="${IDEMKAFKA_MOCK_CONTROL:-}"
    [ -p "$fifo" ] || ik_die "IDEMKAFKA_MOCK_CONTROL does not name a control FIFO"
    local ack="$fifo.ack" before=0 line count
    if [ -f "$ack" ]; then
        read -r before _ <"$ack" || before=0
    fi
    # Opening a FIFO with no reader blocks, so a dead broker must not hang us.
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout 5 bash -c 'printf "%s\n" "$1" >"$2"' _ "$*" "$fifo" ||
        ik_die "could not write to $fifo (is the mock broker running?)"
    local polls=0
    while [ "$polls" -lt 200 ]; do
        if [ -f "$ack" ] && read -r line <"$ack" && count="${line%% *}" && [ "$count" -gt "$before" ]; then
            printf '%s\n' "${line#* }"
            [ "${line#* }" = ok ]
            return
        fi
        sleep 0.05
        polls=$((polls + 1))
    done
    ik_die "no answer from the mock broker to '$*' within 10 s"
}

# Stops what ik_start_postgres, ik_start_broker and ik_start_kafka started and removes their
# temp dirs. Safe to call more than once.
ik_cleanup() {
    local status=$?
    _ik_stop_watchdog
    if [ -n "$_ik_kafka_dir" ]; then
        ik_kafka_stop "$_ik_kafka_dir" || ik_warn "could not stop Kafka in $_ik_kafka_dir"
        rm -rf "$_ik_kafka_dir"
        _ik_kafka_dir=""
    fi
    if [ -n "$_ik_broker_pid" ]; then
        if kill -TERM "$_ik_broker_pid" 2>/dev/null; then
            local tries=0
            while kill -0 "$_ik_broker_pid" 2>/dev/null && [ "$tries" -lt 100 ]; do
                sleep 0.1
                tries=$((tries + 1))
            done
            kill -KILL "$_ik_broker_pid" 2>/dev/null || true
        fi
        wait "$_ik_broker_pid" 2>/dev/null || true
        _ik_broker_pid=""
    fi
    if [ -n "$_ik_pg_data" ] && [ -f "$_ik_pg_data/postmaster.pid" ]; then
        local bin
        if ! bin="$(ik_pg_bin 2>/dev/null)" ||
            ! _ik_as_pg "$bin/pg_ctl" -D "$_ik_pg_data" -m fast -w -t 60 stop >/dev/null 2>&1; then
            ik_warn "could not stop PostgreSQL in $_ik_pg_data"
        fi
    fi
    if [ -n "$_ik_broker_dir" ]; then
        rm -rf "$_ik_broker_dir"
        _ik_broker_dir=""
    fi
    if [ -n "$_ik_pg_dir" ] && [ ! -f "$_ik_pg_data/postmaster.pid" ]; then
        rm -rf "$_ik_pg_dir"
        _ik_pg_dir=""
        _ik_pg_data=""
    fi
    return "$status"
}

# Prints the tail of the service logs, for a failed run.
ik_show_logs() {
    local node_log
    if [ -n "$_ik_kafka_dir" ]; then
        for node_log in "$_ik_kafka_dir"/node-*/server.log; do
            [ -f "$node_log" ] || continue
            printf -- '--- Kafka %s (last 40 lines) ---\n' "${node_log#"$_ik_kafka_dir"/}" >&2
            tail -n 40 "$node_log" >&2
        done
    fi
    if [ -n "$_ik_broker_dir" ] && [ -f "$_ik_broker_dir/broker.log" ]; then
        printf -- '--- mock broker log (last 40 lines) ---\n' >&2
        tail -n 40 "$_ik_broker_dir/broker.log" >&2
    fi
    if [ -n "$_ik_pg_dir" ] && [ -f "$_ik_pg_dir/postgres.log" ]; then
        printf -- '--- PostgreSQL log (last 40 lines) ---\n' >&2
        tail -n 40 "$_ik_pg_dir/postgres.log" >&2
    fi
}

if [ -z "${IK_NO_TRAP:-}" ]; then
    trap ik_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
fi
