#!/usr/bin/env bash
# What each protection of the claim transaction costs the server, measured with pgbench on a
# throwaway PostgreSQL: one client, one record per transaction (the per-record path), the
# variants below run interleaved --reps times so that load on a shared machine meets them all
# alike. Prints, per variant, the medians of: transactions/s, latency, the server's CPU per
# transaction (every PostgreSQL process, the reaped backends included) and pgbench's latency of
# each command (-r). See docs/bench/cost.md.
#
#   bench/claim_cost/run.sh                         every variant, 5 reps of 8 s, fsync off
#   bench/claim_cost/run.sh --reps 3 --seconds 5 --fsync on --variants floor,library
#   bench/claim_cost/run.sh --cpu none               server and pgbench not pinned to one core
#   bench/claim_cost/run.sh --log-only              one variant of each under log_statement=all
#                                                   and the statements the server logged
#
# The scripts are written to $OUT (default /tmp/claim-cost), pgbench's output kept there.
# Every variant runs in pgbench's simple-query mode with its statements PREPAREd in SQL once
# per session and EXECUTEd per transaction, so that a compound command (`\;`, one round trip)
# can be sent as the library sends its prologue and claim; floor_x is the floor in the
# extended protocol (-M prepared), as the bench's floor runs it.
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

reps=5
seconds=8
fsync=off
variants="floor_x,floor,floor_rt,prologue_rw,prologue,guard,arm_lite,arm,library,library_fold"
log_only=0
cpu="$(($(nproc) - 1))"
while [ "$#" -gt 0 ]; do
    case "$1" in
        --reps) reps="$2"; shift 2 ;;
        --seconds) seconds="$2"; shift 2 ;;
        --fsync) fsync="$2"; shift 2 ;;
        --variants) variants="$2"; shift 2 ;;
        --log-only) log_only=1; shift ;;
        --cpu) cpu="$2"; shift 2 ;;
        *) ik_die "unknown argument $1" ;;
    esac
done
OUT="${OUT:-/tmp/claim-cost}"
mkdir -p "$OUT"

# ---- the SQL pieces, as src/pg/tx_guard.cpp and src/pg/claims.cpp write them --------------

durable="CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) END"
origin="CASE WHEN current_setting('session_replication_role') = 'replica' THEN set_config('session_replication_role', 'origin', true) END"
state="concat_ws('|', session_user, current_user, current_setting('search_path'), current_setting('statement_timeout'), current_setting('synchronous_commit'), current_setting('default_transaction_isolation'), current_setting('idle_in_transaction_session_timeout'), current_setting('lock_timeout'), current_setting('session_replication_role'), current_setting('transaction_timeout', true))"
guard_cte="WITH idemkafka_guard AS (UPDATE pg_temp.idemkafka_commit_guard SET xid = txid_current() WHERE set_config('default_transaction_read_only', 'off', true) = 'off') "
claim_sql="INSERT INTO cc.claims (event_id, consumer_group) SELECT unnest(\$1::uuid[]), \$2::text ON CONFLICT DO NOTHING RETURNING event_id"
charge_sql="INSERT INTO cc.effect (event_id, entity, amount, produced_us) VALUES (\$1::uuid, \$2::text, \$3::bigint, \$4::bigint)"
guard_fn="CREATE OR REPLACE FUNCTION pg_temp.idemkafka_commit_guard() RETURNS trigger LANGUAGE plpgsql AS \$g\$ BEGIN IF current_setting('idemkafka.commit', true) IS DISTINCT FROM 'on' THEN RAISE EXCEPTION 'transaction ended inside the handler'; END IF; RETURN NULL; END \$g\$"
guard_table="CREATE TEMPORARY TABLE idemkafka_commit_guard (xid bigint NOT NULL) \\; INSERT INTO pg_temp.idemkafka_commit_guard VALUES (0)"
guard_trigger="CREATE CONSTRAINT TRIGGER idemkafka_commit_guard AFTER UPDATE ON pg_temp.idemkafka_commit_guard DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pg_temp.idemkafka_commit_guard()"
arm_lite="SELECT set_config('idemkafka.commit', 'on', true), $durable FROM pg_temp.idemkafka_commit_guard WHERE xid = txid_current_if_assigned()"
arm_full="SELECT $state, set_config('idemkafka.commit', 'on', true), $durable FROM pg_temp.idemkafka_commit_guard WHERE xid = txid_current_if_assigned()"
guard_cte_fold="WITH idemkafka_guard AS (UPDATE pg_temp.idemkafka_commit_guard SET xid = txid_current() WHERE set_config('default_transaction_read_only', 'off', true) = 'off' AND coalesce($origin, 'origin') = 'origin' AND coalesce($durable, 'local') = 'local') "
id="lpad(to_hex(:n::bigint), 32, '0')::uuid"

# The first transaction of a session prepares (:n, client-side, kept across a session's
# transactions and started at 0 by -D: the record's id, ascending like the bench's).
session_start() { # $1: guard objects (none|table|trigger)  $2: claim text  $3: arm text  $4: read-only default
    printf '\\set n :n + 1\n\\if :n = 1\n'
    if [ "$1" != none ]; then
        printf '%s;\n' "$guard_fn" "$guard_table"
        if [ "$1" = trigger ]; then printf '%s;\n' "$guard_trigger"; fi
    fi
    printf 'PREPARE claim (uuid[], text) AS %s;\n' "$2"
    printf 'PREPARE charge (uuid, text, bigint, bigint) AS %s;\n' "$charge_sql"
    if [ -n "$3" ]; then printf 'PREPARE arm AS %s;\n' "$3"; fi
    if [ "$4" = on ]; then printf 'SET default_transaction_read_only = on;\n'; fi
    printf '\\endif\n'
}

claim_exec="EXECUTE claim (ARRAY[$id], 'ikbench')"
charge_exec="EXECUTE charge ($id, 'key-1', 100, 1700000000000000)"
prologue="SET TRANSACTION READ WRITE \\; SELECT $durable, $origin \\; "

write_variant() { # name
    local f="$OUT/$1.sql"
    case "$1" in
        floor_x) # extended protocol, prepared by pgbench: what the bench's floor sends
            printf '\\set n :n + 1\n' >"$f"
            printf 'BEGIN;\nINSERT INTO cc.claims (event_id, consumer_group) SELECT unnest(ARRAY[%s]), %s ON CONFLICT DO NOTHING RETURNING event_id;\n' \
                "$id" "'ikbench'::text" >>"$f"
            printf 'INSERT INTO cc.effect (event_id, entity, amount, produced_us) VALUES (%s, %s, 100, 1700000000000000);\nCOMMIT;\n' \
                "$id" "'key-1'" >>"$f"
            ;;
        floor) { session_start none "$claim_sql" "" off; printf 'BEGIN;\n%s;\n%s;\nCOMMIT;\n' "$claim_exec" "$charge_exec"; } >"$f" ;;
        floor_rt) { session_start none "$claim_sql" "" off; printf 'BEGIN;\n%s;\n%s;\nSELECT 1;\nCOMMIT;\n' "$claim_exec" "$charge_exec"; } >"$f" ;;
        prologue) { session_start none "$claim_sql" "" on; printf 'BEGIN;\n%s%s;\n%s;\nCOMMIT;\n' "$prologue" "$claim_exec" "$charge_exec"; } >"$f" ;;
        guard) { session_start table "$guard_cte$claim_sql" "" on; printf 'BEGIN;\n%s%s;\n%s;\nCOMMIT;\n' "$prologue" "$claim_exec" "$charge_exec"; } >"$f" ;;
        arm_lite) { session_start table "$guard_cte$claim_sql" "$arm_lite" on; printf 'BEGIN;\n%s%s;\n%s;\nEXECUTE arm;\nCOMMIT;\n' "$prologue" "$claim_exec" "$charge_exec"; } >"$f" ;;
        arm) { session_start table "$guard_cte$claim_sql" "$arm_full" on; printf 'BEGIN;\n%s%s;\n%s;\nEXECUTE arm;\nCOMMIT;\n' "$prologue" "$claim_exec" "$charge_exec"; } >"$f" ;;
        library) { session_start trigger "$guard_cte$claim_sql" "$arm_full" on; printf 'BEGIN;\n%s%s;\n%s;\nEXECUTE arm;\nCOMMIT;\n' "$prologue" "$claim_exec" "$charge_exec"; } >"$f" ;;
        prologue_rw) { session_start none "$claim_sql" "" on; printf 'BEGIN;\nSET TRANSACTION READ WRITE \\; %s;\n%s;\nCOMMIT;\n' "$claim_exec" "$charge_exec"; } >"$f" ;;
        library_fold)
            # The prologue's SELECT folded into the claim statement's guard CTE (prepared once).
            { session_start trigger "$guard_cte_fold$claim_sql" "$arm_full" on; printf 'BEGIN;\nSET TRANSACTION READ WRITE \\; %s;\n%s;\nEXECUTE arm;\nCOMMIT;\n' "$claim_exec" "$charge_exec"; } >"$f" ;;
        *) ik_die "unknown variant $1" ;;
    esac
}

# ---- the server ---------------------------------------------------------------------------

ik_start_postgres
pg_data="$(printf '%s\n' "$IDEMKAFKA_TEST_PG_RESTART" | sed 's/.* -D \([^ ]*\) .*/\1/')"
{
    printf 'fsync = %s\n' "$fsync"
    if [ "$log_only" -eq 1 ]; then printf "log_statement = 'all'\nlog_line_prefix = '%%p '\n"; fi
} | _ik_as_pg tee -a "$pg_data/postgresql.conf" >/dev/null
eval "$IDEMKAFKA_TEST_PG_RESTART" >/dev/null
psql -X -q -v ON_ERROR_STOP=1 -d "$IDEMKAFKA_TEST_PG" <<'SQL'
CREATE SCHEMA cc;
CREATE TABLE cc.claims (event_id uuid NOT NULL, consumer_group text NOT NULL,
  processed_at timestamptz NOT NULL DEFAULT now(), payload_fingerprint bigint,
  PRIMARY KEY (event_id, consumer_group)) PARTITION BY RANGE (event_id);
CREATE TABLE cc.claims_default PARTITION OF cc.claims DEFAULT;
CREATE INDEX ON cc.claims_default (processed_at);
CREATE TABLE cc.effect (event_id uuid NOT NULL, entity text NOT NULL, amount bigint NOT NULL,
  produced_us bigint NOT NULL);
SQL
postmaster_pid="$(head -n 1 "$pg_data/postmaster.pid")"
# One core for the server and pgbench (--cpu, default the last): a round trip is then two
# context switches on that core, not a wake-up of the other core, which on a VM is slow and
# varies from one run to the next. The postmaster's affinity passes to the backends it forks.
if [ "$cpu" != none ]; then
    for pid in "$postmaster_pid" $(pgrep -P "$postmaster_pid"); do taskset -a -p -c "$cpu" "$pid" >/dev/null; done
    pin=(taskset -c "$cpu")
else
    pin=()
fi

# CPU ticks of the server: the postmaster with its reaped children, and the live children.
server_ticks() {
    local total pid
    total="$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster_pid/stat")"
    for pid in $(pgrep -P "$postmaster_pid"); do
        total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
    done
    printf '%s\n' "$total"
}
hz="$(getconf CLK_TCK)"
# Waits (up to 5 s) until the postmaster has only its own processes again: a backend's CPU
# counts in the postmaster's reaped-children time only once it has been reaped.
children_settle() {
    local n=0
    while [ "$(pgrep -c -P "$postmaster_pid")" -gt "$aux_children" ] && [ "$n" -lt 100 ]; do
        sleep 0.05
        n=$((n + 1))
    done
}
sleep 1
aux_children="$(pgrep -c -P "$postmaster_pid")"

IFS=, read -r -a names <<<"$variants"
for v in "${names[@]}"; do write_variant "$v"; done

if [ "$log_only" -eq 1 ]; then
    for v in "${names[@]}"; do
        mode=simple
        [ "$v" = floor_x ] && mode=prepared
        pgbench -n -c 1 -j 1 -t 3 -D n=0 -M "$mode" -f "$OUT/$v.sql" "$IDEMKAFKA_TEST_PG" >/dev/null
    done
    cp "$(dirname "$pg_data")/postgres.log" "$OUT/postgres.log"
    ik_log "server log: $OUT/postgres.log"
    exit 0
fi

results="$OUT/results.tsv"
printf 'rep\tvariant\ttps\tlatency_ms\tserver_us_per_tx\tclient_us_per_tx\n' >"$results"
for rep in $(seq 1 "$reps"); do
    for v in "${names[@]}"; do
        mode=simple
        [ "$v" = floor_x ] && mode=prepared
        psql -X -q -d "$IDEMKAFKA_TEST_PG" -c 'TRUNCATE cc.claims, cc.effect' -c 'CHECKPOINT'
        children_settle
        before="$(server_ticks)"
        t0="$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)"
        "${pin[@]}" pgbench -n -c 1 -j 1 -T "$seconds" -r -D n=0 -M "$mode" -f "$OUT/$v.sql" "$IDEMKAFKA_TEST_PG" >"$OUT/$v.$rep.out" 2>&1 ||
            { cat "$OUT/$v.$rep.out" >&2; ik_die "pgbench failed on $v"; }
        children_settle
        after="$(server_ticks)"
        t1="$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)"
        tx="$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$OUT/$v.$rep.out")"
        tps="$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/$v.$rep.out")"
        lat="$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$OUT/$v.$rep.out")"
        awk -v r="$rep" -v v="$v" -v tps="$tps" -v lat="$lat" -v s=$((after - before)) -v c=$((t1 - t0)) -v tx="$tx" -v hz="$hz" \
            'BEGIN { printf "%s\t%s\t%.1f\t%.4f\t%.1f\t%.1f\n", r, v, tps, lat, s / hz * 1e6 / tx, c / hz * 1e6 / tx }' >>"$results"
        tail -n 1 "$results"
    done
done

# Medians per variant, and the ratio of each to the floor.
python3 - "$results" "$OUT" "$reps" <<'PY'
import csv, statistics, sys, re, glob, os
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
out, reps = sys.argv[2], int(sys.argv[3])
order = []
for r in rows:
    if r["variant"] not in order:
        order.append(r["variant"])
med = lambda v, k: statistics.median(float(r[k]) for r in rows if r["variant"] == v)
base = med("floor", "tps") if "floor" in order else med(order[0], "tps")
print("\nvariant      tps     ratio  latency_ms  server_us/tx  pgbench_us/tx")
for v in order:
    print(f"{v:<12} {med(v,'tps'):7.0f}  {med(v,'tps')/base:5.3f}  {med(v,'latency_ms'):9.3f}  {med(v,'server_us_per_tx'):11.1f}  {med(v,'client_us_per_tx'):12.1f}")
# pgbench -r: median latency (ms) of each command over the reps
print("\nper-command latency (median over reps, ms)")
for v in order:
    per = {}
    for rep in range(1, reps + 1):
        text = open(os.path.join(out, f"{v}.{rep}.out")).read().split("statement latencies in milliseconds")[-1]
        for i, line in enumerate(l for l in text.splitlines() if re.match(r"\s+[0-9.]+\s+[0-9]+\s+", l)):
            f = line.split(None, 2)
            per.setdefault(i, (f[2][:70], []))[1].append(float(f[0]))
    print(f"-- {v}")
    for i, (cmd, vals) in per.items():
        m = statistics.median(vals)
        if m >= 0.001 and not cmd.startswith(("PREPARE", "CREATE", "SET default", "\\")):
            print(f"   {m:7.3f}  {cmd}")
PY
