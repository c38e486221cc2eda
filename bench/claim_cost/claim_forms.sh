#!/usr/bin/env bash
# What a claim of 500 ids costs PostgreSQL in each form, with pgbench on a throwaway server: the
# claim with ON CONFLICT DO NOTHING (with and without RETURNING) against a plain INSERT (with and
# without RETURNING, the claim as new of ConsumerConfig::optimistic_claims), the ids in the order a
# consumer of 8 partitions takes them ("consumer": each transaction's ids from 8 places of the key
# range, sorted) and in the order they were made ("made": each past the last). The table has the
# claims table's columns, key and range partitioning on event_id (one default partition). Each
# transaction is one statement; the figure is pgbench's mean latency, the id generation included
# (the same in every form). See docs/processing.md, "Claims made as new first".
#
#   bench/claim_cost/claim_forms.sh [--rounds 2] [--transactions 800]
set -euo pipefail

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
rounds=2
transactions=800
while [ "$#" -gt 0 ]; do
    case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --transactions) transactions="$2"; shift 2 ;;
    *) echo "claim_forms.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"
OUT="${OUT:-/tmp/claim-cost-forms}"
mkdir -p "$OUT"
ik_start_postgres

cat >"$OUT/setup.sql" <<'SQL'
DROP TABLE IF EXISTS claim_forms CASCADE;
DROP SEQUENCE IF EXISTS claim_forms_tx;
CREATE TABLE claim_forms (event_id uuid NOT NULL, consumer_group text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(), payload_fingerprint bigint,
    PRIMARY KEY (event_id, consumer_group)) PARTITION BY RANGE (event_id);
CREATE TABLE claim_forms_default PARTITION OF claim_forms DEFAULT;
CREATE SEQUENCE claim_forms_tx;
SQL

# The ids of transaction :k, as rows n (uuid from n: ascending n, ascending uuid).
consumer="SELECT j * 8 + p AS n FROM generate_series(0, 7) p, generate_series(:k * 62 + p * 500, :k * 62 + p * 500 + 61) j ORDER BY 1"
made="SELECT n FROM generate_series(:k * 496, :k * 496 + 495) n"
declare -A tails=(
    [on_conflict_returning]=" ON CONFLICT DO NOTHING RETURNING event_id"
    [on_conflict]=" ON CONFLICT DO NOTHING"
    [plain_returning]=" RETURNING event_id"
    [plain]=""
)
forms=(on_conflict_returning on_conflict plain_returning plain)
for order in consumer made; do
    ids="$consumer"
    [ "$order" = made ] && ids="$made"
    for form in "${forms[@]}"; do
        printf '%s\n' "SELECT nextval('claim_forms_tx') AS k \\gset" \
            "INSERT INTO claim_forms (event_id, consumer_group) SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid, 'ikbench-run-00001' FROM ($ids) s${tails[$form]};" \
            >"$OUT/$order.$form.sql"
    done
done

read -r -a conn <<<"$(printf '%s\n' "$IDEMKAFKA_TEST_PG" | sed 's/host=\([^ ]*\) port=\([^ ]*\) dbname=\([^ ]*\) user=\([^ ]*\)/-h \1 -p \2 -U \4 \3/')"
for round in $(seq 1 "$rounds"); do
    for order in consumer made; do
        for form in "${forms[@]}"; do
            psql -q -X "${conn[@]}" -f "$OUT/setup.sql" >/dev/null 2>&1
            ms="$(pgbench -n "${conn[@]}" -t "$transactions" -f "$OUT/$order.$form.sql" 2>&1 |
                sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')"
            printf 'round %s  %-8s  %-22s  %s ms\n' "$round" "$order" "$form" "${ms:-failed}"
        done
    done
done
