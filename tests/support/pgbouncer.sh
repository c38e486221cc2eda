#!/usr/bin/env bash
# PgBouncer (Debian's pgbouncer) on a loopback port in front of a PostgreSQL server, for tests
# of the library behind a connection pooler:
#
#   pgbouncer.sh start --watch-pid PID --mode MODE --host HOST --port PORT
#       starts pgbouncer with pool_mode MODE (session, transaction) in front of the server at
#       HOST (a host name, an address or a socket directory) and PORT, every database name
#       passed through, logged in as postgres without a password (auth_type any); waits until
#       it accepts connections; prints dir= and port=
#   pgbouncer.sh stop DIR
#       stops it (SIGKILL if it does not go within 5 s) and removes DIR; safe to call twice
#
# As root pgbouncer runs as the postgres user (runuser). Every wait is bounded; a failure exits
# non-zero with a message on stderr. `start` leaves a watchdog that runs `stop` once PID (the
# test program) is gone, so a test killed by a timeout leaves no pgbouncer behind.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh: this script stops what it started itself
IK_NO_TRAP=1
# shellcheck source=scripts/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/lib.sh"

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
bouncer="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"

cmd_start() {
    local watch_pid="" mode="" host="" port=""
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --watch-pid) watch_pid="${2:?--watch-pid needs a pid}" ;;
            --mode) mode="${2:?--mode needs session or transaction}" ;;
            --host) host="${2:?--host needs a host}" ;;
            --port) port="${2:?--port needs a port}" ;;
            *) ik_die "pgbouncer.sh start: unknown argument $1" ;;
        esac
        shift 2
    done
    [ -n "$mode" ] && [ -n "$host" ] && [ -n "$port" ] || ik_die "pgbouncer.sh start needs --mode, --host and --port"
    [ -x "$bouncer" ] || ik_die "pgbouncer not found (is the pgbouncer package installed?)"

    local dir
    dir="$(mktemp -d "${TMPDIR:-/tmp}/idemkafka-pgbouncer.XXXXXX")"
    chmod 755 "$dir"
    _ik_is_root && chown postgres: "$dir"
    printf 'dir=%s\n' "$dir"
    if [ -n "$watch_pid" ]; then
        # Detached from the caller's output (popen waits for every writer of its pipe).
        # shellcheck disable=SC2016 # expanded by the inner bash
        setsid bash -c '
            while kill -0 "$1" 2>/dev/null; do sleep 1; done
            exec bash "$2" stop "$3"' _ "$watch_pid" "$self" "$dir" </dev/null >/dev/null 2>&1 &
        printf '%s\n' "$!" >"$dir/watchdog.pid"
    fi

    local listen attempt
    for attempt in 1 2 3 4 5; do
        listen="$(_ik_random_port)"
        _ik_as_pg tee "$dir/pgbouncer.ini" >/dev/null <<EOF
[databases]
* = host=$host port=$port user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = any
pool_mode = $mode
default_pool_size = 20
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
        if _ik_as_pg "$bouncer" -d -q "$dir/pgbouncer.ini"; then
            local i
            for i in $(seq 1 100); do
                if _ik_port_in_use "$listen"; then
                    printf 'port=%s\n' "$listen"
                    return 0
                fi
                sleep 0.1
            done
        fi
        tail -n 20 "$dir/pgbouncer.log" >&2 2>/dev/null || true
        cmd_kill "$dir"
    done
    ik_die "pgbouncer did not start"
}

cmd_kill() {
    local dir="$1" pid i
    [ -f "$dir/pgbouncer.pid" ] && read -r pid <"$dir/pgbouncer.pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

cmd_stop() {
    local dir="${1:?a directory is required}" pid
    [ -d "$dir" ] || return 0
    if [ -f "$dir/watchdog.pid" ] && read -r pid <"$dir/watchdog.pid" && [ "$pid" != "$$" ]; then
        kill "$pid" 2>/dev/null || true # unless this is the watchdog itself (it execs this stop)
    fi
    cmd_kill "$dir"
    rm -rf "$dir"
}

[ "$#" -gt 0 ] || ik_die "usage: pgbouncer.sh start|stop ..."
command="$1"
shift
case "$command" in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    *) ik_die "pgbouncer.sh: unknown command $command" ;;
esac
