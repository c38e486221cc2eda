#!/usr/bin/env bash
# A PostgreSQL primary and an asynchronous streaming standby on loopback, for failover tests:
# started, cut apart, the primary killed, the standby promoted, and everything stopped again.
#
#   pg_failover.sh start --watch-pid PID   initdb a primary (wal_level=replica), create the
#                                          database idemkafka_test, pg_basebackup -R a standby
#                                          (hot_standby=on), start both, wait until the standby
#                                          streams; prints dir=, primary_port=, standby_port=
#   pg_failover.sh cut DIR                 SIGSTOP the standby's walreceiver: the standby gets
#                                          no more WAL while the primary goes on committing
#   pg_failover.sh kill-primary DIR        SIGKILL every process of the primary, at once (all
#                                          stopped first, so the postmaster restarts nothing)
#   pg_failover.sh kill-walreceiver DIR    SIGKILL the stopped walreceiver: the WAL still in its
#                                          socket buffer never reaches the standby (a SIGCONT
#                                          would let it read that WAL)
#   pg_failover.sh promote DIR             pg_ctl promote the standby and wait until it takes
#                                          writes
#   pg_failover.sh stop DIR                stop both servers, SIGKILL whatever of them is left,
#                                          remove DIR; safe to call more than once
#
# As root the servers run as the postgres user (runuser), otherwise as the caller. Every wait is
# bounded; a failure exits non-zero with a message on stderr. `start` leaves a watchdog that
# runs `stop` once PID (the test program) is gone, so a test killed by a timeout leaves no
# server behind. DIR is the dir= line of `start`.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh: this script stops what it started itself
IK_NO_TRAP=1
# shellcheck source=scripts/lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/lib.sh"

self="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
bin="$(ik_pg_bin)"

# The postmaster's pid of a data directory, when its server runs.
_postmaster_pid() {
    local data="$1" pid
    [ -f "$data/postmaster.pid" ] || return 1
    read -r pid <"$data/postmaster.pid" || return 1
    [ -n "$pid" ] && _alive "$pid" && printf '%s\n' "$pid"
}

# True when the process exists and is no zombie.
_alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }"
    [ "${stat%% *}" != Z ]
}

# The pids whose parent is $1.
_children() {
    local d key value
    for d in /proc/[0-9]*; do
        while read -r key value; do
            if [ "$key" = PPid: ]; then
                [ "$value" = "$1" ] && printf '%s\n' "${d#/proc/}"
                break
            fi
        done 2>/dev/null <"$d/status" || true
    done
}

# Waits until none of the pids is alive; at most $1 tenths of a second.
_wait_gone() {
    local tenths="$1" pid left
    shift
    while :; do
        left=0
        for pid in "$@"; do
            _alive "$pid" && left=1
        done
        [ "$left" -eq 0 ] && return 0
        [ "$tenths" -le 0 ] && return 1
        sleep 0.1
        tenths=$((tenths - 1))
    done
}

_psql() {
    local port="$1"
    shift
    timeout 20 "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@" ||
        return 1
}

# Starts the server of `dir` (its data in dir/data, its socket in dir) on a free
# port other than `avoid`, and prints the port. A lost race for the port is
# worth another try; anything else is in the log.
#   _start_on_free_port DIR AVOID NAME
_start_on_free_port() {
    local dir="$1" avoid="$2" name="$3" attempt port
    for attempt in 1 2 3 4 5; do
        port="$(_ik_random_port)"
        [ "$port" != "$avoid" ] || continue
        _server_conf "$dir/data" "$port" "$dir"
        if _start_server "$dir/data" "$dir/postgres.log"; then
            printf '%s\n' "$port"
            return 0
        fi
        if [ "$attempt" -eq 5 ] ||
            ! grep -q 'could not bind\|could not create any TCP/IP sockets' "$dir/postgres.log" 2>/dev/null; then
            ik_die "the $name did not start"
        fi
    done
    ik_die "the $name did not start: no free port"
}

_server_conf() {
    local data="$1" port="$2" sockets="$3"
    _ik_as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# idemkafka failover test
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sockets'
max_connections = 100
fsync = on
wal_level = replica
max_wal_senders = 5
hot_standby = on
wal_receiver_status_interval = 1s
EOF
}

_start_server() {
    local data="$1" log="$2"
    _ik_as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 start >/dev/null || {
        tail -n 30 "$log" >&2 || true
        return 1
    }
}

cmd_start() {
    local watch_pid=""
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --watch-pid)
                watch_pid="${2:?--watch-pid needs a pid}"
                shift 2
                ;;
            *) ik_die "pg_failover.sh start: unknown argument '$1'" ;;
        esac
    done
    local base="${TMPDIR:-/tmp}"
    if _ik_is_root; then
        id postgres >/dev/null 2>&1 || ik_die "running as root but there is no 'postgres' user to run the servers"
        runuser -u postgres -- test -w "$base" -a -x "$base" 2>/dev/null || base=/tmp
    fi
    local dir
    dir="$(mktemp -d "$base/idemkafka-failover.XXXXXX")"
    _ik_is_root && chown postgres: "$dir"
    # The caller learns the directory first, so that it can stop what started even when a
    # later step fails.
    printf 'dir=%s\n' "$dir"
    if [ -n "$watch_pid" ]; then
        # Detached from the caller's output (popen waits for every writer of its pipe).
        # shellcheck disable=SC2016 # expanded by the inner bash
        setsid bash -c '
            while kill -0 "$1" 2>/dev/null; do sleep 1; done
            exec bash "$2" stop "$3"' _ "$watch_pid" "$self" "$dir" </dev/null >/dev/null 2>&1 &
        printf '%s\n' "$!" >"$dir/watchdog.pid"
    fi

    local primary="$dir/primary" standby="$dir/standby"
    _ik_as_pg mkdir -p "$primary" "$standby"
    _ik_as_pg "$bin/initdb" -D "$primary/data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        ik_die "initdb failed"
    }
    local port1 port2
    port1="$(_start_on_free_port "$primary" "" primary)"
    printf '%s\n' "$port1" >"$dir/primary.port"
    _psql "$port1" -c 'CREATE DATABASE idemkafka_test' >/dev/null ||
        ik_die "could not create database idemkafka_test on the primary"

    _ik_as_pg timeout 60 "$bin/pg_basebackup" -h 127.0.0.1 -p "$port1" -U postgres -D "$standby/data" -R \
        -X stream -c fast --no-sync >"$dir/basebackup.log" 2>&1 || {
        cat "$dir/basebackup.log" >&2
        ik_die "pg_basebackup failed"
    }
    port2="$(_start_on_free_port "$standby" "$port1" standby)"
    printf '%s\n' "$port2" >"$dir/standby.port"

    local tenths=300 streaming=""
    while [ "$tenths" -gt 0 ]; do
        streaming="$(_psql "$port1" -c "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'" ||
            true)"
        [ "$streaming" = 1 ] && break
        sleep 0.1
        tenths=$((tenths - 1))
    done
    [ "$streaming" = 1 ] || {
        tail -n 20 "$standby/postgres.log" >&2 || true
        ik_die "the standby did not stream from the primary within 30 s"
    }
    printf 'primary_port=%s\nstandby_port=%s\n' "$port1" "$port2"
}

_dir_arg() {
    local dir="${1:?a directory (the dir= line of start) is required}"
    [ -d "$dir" ] || ik_die "$dir: no such directory"
    printf '%s\n' "$dir"
}

cmd_cut() {
    local dir port pid
    dir="$(_dir_arg "${1:-}")"
    port="$(cat "$dir/standby.port")"
    pid="$(_psql "$port" -c "SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'")" ||
        ik_die "cannot ask the standby for its walreceiver"
    [ -n "$pid" ] || ik_die "the standby has no streaming walreceiver"
    kill -STOP "$pid"
    printf '%s\n' "$pid" >"$dir/walreceiver.pid"
    printf 'walreceiver=%s\n' "$pid"
}

cmd_kill_primary() {
    local dir pm pids
    dir="$(_dir_arg "${1:-}")"
    pm="$(_postmaster_pid "$dir/primary/data")" || ik_die "the primary is not running"
    # Stopped first: a postmaster that saw a child die would start a crash restart.
    kill -STOP "$pm"
    mapfile -t pids < <(_children "$pm")
    [ "${#pids[@]}" -eq 0 ] || kill -STOP "${pids[@]}" 2>/dev/null || true
    kill -KILL "$pm" "${pids[@]}" 2>/dev/null || true
    _wait_gone 100 "$pm" "${pids[@]}" || ik_die "processes of the primary outlived SIGKILL for 10 s"
    printf 'killed=%s\n' "$((${#pids[@]} + 1))"
}

cmd_kill_walreceiver() {
    local dir pid
    dir="$(_dir_arg "${1:-}")"
    [ -f "$dir/walreceiver.pid" ] || ik_die "no walreceiver was cut"
    read -r pid <"$dir/walreceiver.pid"
    kill -KILL "$pid" 2>/dev/null || true
    _wait_gone 100 "$pid" || ik_die "the walreceiver $pid outlived SIGKILL for 10 s"
    rm -f "$dir/walreceiver.pid"
}

cmd_promote() {
    local dir port tenths=300 state=""
    dir="$(_dir_arg "${1:-}")"
    port="$(cat "$dir/standby.port")"
    # After its walreceiver was killed the standby goes through a crash restart: wait for it
    # to take connections again, then promote.
    while [ "$tenths" -gt 0 ]; do
        state="$(_psql "$port" -c 'SELECT pg_is_in_recovery()' 2>/dev/null || true)"
        [ -n "$state" ] && break
        sleep 0.1
        tenths=$((tenths - 1))
    done
    [ -n "$state" ] || {
        tail -n 20 "$dir/standby/postgres.log" >&2 || true
        ik_die "the standby did not take connections within 30 s"
    }
    _ik_as_pg "$bin/pg_ctl" -D "$dir/standby/data" -w -t 30 promote >/dev/null || {
        tail -n 20 "$dir/standby/postgres.log" >&2 || true
        ik_die "pg_ctl promote failed"
    }
    state="$(_psql "$port" -c 'SELECT pg_is_in_recovery()')" || ik_die "the promoted server does not answer"
    [ "$state" = f ] || ik_die "the promoted server is still in recovery"
}

# Stops one server: pg_ctl stop (immediate), then SIGKILL for anything of it still there.
_stop_server() {
    local data="$1" pm pids=()
    pm="$(_postmaster_pid "$data")" || return 0
    mapfile -t pids < <(_children "$pm")
    _ik_as_pg "$bin/pg_ctl" -D "$data" -m immediate -w -t 15 stop >/dev/null 2>&1 || true
    if ! _wait_gone 50 "$pm" "${pids[@]}"; then
        mapfile -t -O "${#pids[@]}" pids < <(_children "$pm")
        kill -KILL "$pm" "${pids[@]}" 2>/dev/null || true
        _wait_gone 100 "$pm" "${pids[@]}" || ik_warn "processes of the server in $data outlived SIGKILL"
    fi
}

cmd_stop() {
    local dir="${1:?a directory is required}" pid
    [ -d "$dir" ] || return 0
    if [ -f "$dir/watchdog.pid" ] && read -r pid <"$dir/watchdog.pid" && [ "$pid" != "$$" ]; then
        # Unless this is the watchdog itself (it execs this stop).
        kill "$pid" 2>/dev/null || true
    fi
    # A walreceiver still stopped would hold up the standby's shutdown.
    if [ -f "$dir/walreceiver.pid" ] && read -r pid <"$dir/walreceiver.pid"; then
        kill -KILL "$pid" 2>/dev/null || true
    fi
    _stop_server "$dir/standby/data"
    _stop_server "$dir/primary/data"
    rm -rf "$dir"
}

[ "$#" -gt 0 ] || ik_die "usage: pg_failover.sh start|cut|kill-primary|kill-walreceiver|promote|stop ..."
command="$1"
shift
case "$command" in
    start) cmd_start "$@" ;;
    cut) cmd_cut "$@" ;;
    kill-primary) cmd_kill_primary "$@" ;;
    kill-walreceiver) cmd_kill_walreceiver "$@" ;;
    promote) cmd_promote "$@" ;;
    stop) cmd_stop "$@" ;;
    *) ik_die "pg_failover.sh: unknown command '$command'" ;;
esac
