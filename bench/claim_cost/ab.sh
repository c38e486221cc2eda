#!/usr/bin/env bash
# A/B of two idemkafka-bench binaries (say, main's and a branch's, each a Release build) on one
# throwaway PostgreSQL and mock broker: A, B, A, B, ... --rounds times, so that load on a shared
# machine meets both alike, then each ratio's values per binary and their medians.
#
#   bench/claim_cost/ab.sh A_BINARY B_BINARY [--rounds 3] [idemkafka-bench arguments...]
#   bench/claim_cost/ab.sh build-base/idemkafka-bench build-bench/bench/idemkafka-bench \
#       --events 50000 --dups 0,30 --latency-seconds 0 \
#       --modes idemkafka_per_event,pg_floor_per_event,idemkafka_batch,pg_floor_batch
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
a="$(readlink -f "$1")"
b="$(readlink -f "$2")"
shift 2
rounds=3
if [ "${1:-}" = "--rounds" ]; then
    rounds="$2"
    shift 2
fi
BUILD_DIR="${BUILD_DIR:-$IK_ROOT/build-bench}" # for the mock broker's binary
export BUILD_DIR
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"
OUT="${OUT:-/tmp/claim-cost-ab}"
mkdir -p "$OUT"

ik_start_postgres
ik_start_broker --brokers 1
for round in $(seq 1 "$rounds"); do
    for side in A B; do
        bin="$a"
        [ "$side" = B ] && bin="$b"
        ik_log "round $round, $side: $bin"
        "$bin" --out "$OUT/$side.$round.json" "$@" >"$OUT/$side.$round.txt" 2>&1 ||
            { tail -n 20 "$OUT/$side.$round.txt" >&2; ik_die "$side failed in round $round"; }
    done
done

python3 - "$OUT" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
vals = {}
cpu = {}
for side in "AB":
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/{side}.{r}.json"))
        for x in d["summary"]["ratios"]:
            vals.setdefault((x["name"], x["dup_percent"]), {}).setdefault(side, []).append(x["value"])
        for run in d["runs"]:
            c = run.get("cpu_us_per_event")
            if c and c.get("app_threads") is not None and c.get("postgres") is not None:
                key = (run["mode"], run["dup_percent"])
                cpu.setdefault(key, {}).setdefault(side, []).append((c["app_threads"], c["postgres"]))
            print(f"{side} {r} {run['mode']:<24} {run['dup_percent']:>3}% {run['events_per_s']:>10.1f}/s"
                  f"  other cores {run.get('other_processes_cores')}")
print("ratio                                         dup   A (each)               median A  B (each)               median B")
for (name, dup), s in sorted(vals.items()):
    fa = " ".join(f"{v:.3f}" for v in s.get("A", []))
    fb = " ".join(f"{v:.3f}" for v in s.get("B", []))
    print(f"{name:<45} {dup:>3}%  {fa:<22} {statistics.median(s['A']):.3f}     {fb:<22} {statistics.median(s['B']):.3f}")
print("\nCPU us/event, medians: app threads / PostgreSQL")
for (mode, dup), s in sorted(cpu.items()):
    line = f"{mode:<24} {dup:>3}%"
    for side in "AB":
        xs = s.get(side, [])
        if xs:
            line += f"  {side}: {statistics.median(x[0] for x in xs):7.2f} / {statistics.median(x[1] for x in xs):7.2f}"
    print(line)
PY
