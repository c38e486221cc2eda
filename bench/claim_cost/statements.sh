#!/usr/bin/env bash
# What the library sends PostgreSQL in a bench mode, counted from the server's own log
# (log_statement = all): a throwaway PostgreSQL and mock broker, one idemkafka-bench mode, then
# the statements of every session by shape (literals and numbers replaced), with how many
# each session sent per transaction (COMMITs). See docs/bench/cost.md.
#
#   bench/claim_cost/statements.sh [BENCH_BINARY] [idemkafka-bench arguments...]
#   bench/claim_cost/statements.sh build-bench/bench/idemkafka-bench \
#       --modes idemkafka_per_event --events 2000 --dups 0 --latency-seconds 0
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bench="${1:-$IK_ROOT/build-bench/bench/idemkafka-bench}"
shift || true
[ "$#" -gt 0 ] || set -- --modes idemkafka_per_event --events 2000 --dups 0 --latency-seconds 0
BUILD_DIR="$(cd "$(dirname "$bench")/.." && pwd)"
export BUILD_DIR
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"
OUT="${OUT:-/tmp/claim-cost-statements}"
mkdir -p "$OUT"

ik_start_postgres
pg_data="$(printf '%s\n' "$IDEMKAFKA_TEST_PG_RESTART" | sed 's/.* -D \([^ ]*\) .*/\1/')"
printf "log_statement = 'all'\nlog_line_prefix = '%%p '\nlog_min_messages = warning\n" |
    _ik_as_pg tee -a "$pg_data/postgresql.conf" >/dev/null
eval "$IDEMKAFKA_TEST_PG_RESTART" >/dev/null
ik_start_broker --brokers 1
"$bench" --out "$OUT/report.json" "$@" >"$OUT/bench.txt" 2>&1 || { tail -n 20 "$OUT/bench.txt" >&2; exit 1; }
log="$(dirname "$pg_data")/postgres.log"
cp "$log" "$OUT/postgres.log"

python3 - "$OUT/postgres.log" <<'PY'
import re, sys, collections
by_pid = collections.defaultdict(list)
cur = None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\d+) LOG:  (?:statement|execute [^:]*): (.*)", line)
    if m:
        cur = (m.group(1), m.group(2))
        by_pid[cur[0]].append(cur[1])
    elif line.startswith(("\t", " ")) and cur:
        by_pid[cur[0]][-1] += " " + line.strip()
    else:
        cur = None
def shape(s):
    s = re.sub(r"'[^']*'", "'…'", s)
    s = re.sub(r"\b\d+\b", "N", s)
    return s[:150]
for pid, stmts in sorted(by_pid.items(), key=lambda kv: -len(kv[1])):
    commits = sum(1 for s in stmts if s.strip().upper() in ("COMMIT", "COMMIT;"))
    print(f"\n== session {pid}: {len(stmts)} statements, {commits} COMMITs"
          + (f", {len(stmts) / commits:.2f} statements per COMMIT" if commits else ""))
    for s, n in collections.Counter(shape(s) for s in stmts).most_common(12):
        print(f"  {n:7d}  {s}")
PY
