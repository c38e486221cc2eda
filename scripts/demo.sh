#!/usr/bin/env bash
# The billing demo, end to end on this machine:
#   builds idemkafka, starts a throwaway PostgreSQL and the mock Kafka cluster,
#   publishes order.confirmed events of which a share are re-sent duplicates,
#   runs the billing listener until the topic is drained, and checks that every
#   order was charged exactly once.
#
#   scripts/demo.sh            10,000 events, 20% re-sent
#   DEMO_EVENTS=50000 DEMO_DUPLICATES=0.3 scripts/demo.sh
#   scripts/demo.sh --kafka real   against Apache Kafka (scripts/kafka.sh) instead of the mock;
#                                  with IDEMKAFKA_TEST_BROKERS set, against that broker
set -euo pipefail

kafka=mock
if [ "${1:-}" = "--kafka" ]; then
    kafka="${2:?--kafka needs mock or real}"
    shift 2
fi
case "$kafka" in
    mock | real) ;;
    *)
        printf 'error: unknown Kafka "%s" (mock or real)\n' "$kafka" >&2
        exit 2
        ;;
esac

IK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/lib.sh
source "$IK_ROOT/scripts/lib.sh"

events="${DEMO_EVENTS:-10000}"
duplicates="${DEMO_DUPLICATES:-0.2}"
topic="order-service.order.confirmed"
partitions=4

ik_ensure_packages

ik_log "building ($BUILD_DIR)"
cmake -S "$IK_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j2 --target billing-producer billing-listener idemkafka-mock-broker

ik_log "starting PostgreSQL"
ik_start_postgres
if [ "$kafka" = real ]; then
    ik_log "starting Apache Kafka"
    ik_start_kafka
    ik_kafka_create_topic "$IDEMKAFKA_TEST_BROKERS" "$topic" "$partitions"
else
    ik_log "starting the mock Kafka cluster"
    ik_start_broker --topic "$topic:$partitions"
fi

bin="$BUILD_DIR/examples/billing"
ik_log "publishing $events order.confirmed events ($duplicates of them re-sent duplicates)"
producer_out="$("$bin/billing-producer" --brokers "$IDEMKAFKA_TEST_BROKERS" --topic "$topic" \
    --events "$events" --duplicates "$duplicates")"
echo "  $producer_out"
unique_orders="$(sed -n 's/.*unique_orders=\([0-9]*\).*/\1/p' <<<"$producer_out")"

ik_log "running the billing listener until the topic is drained"
metrics_port="$(ik_free_port)"
listener_file="$(mktemp "${TMPDIR:-/tmp}/idemkafka-demo.XXXXXX")"
"$bin/billing-listener" --brokers "$IDEMKAFKA_TEST_BROKERS" --postgres "$IDEMKAFKA_TEST_PG" \
    --topic "$topic" --until-drained "$events" --metrics-port "$metrics_port" >"$listener_file" &
listener_pid=$!

# Scrape the listener's /metrics endpoint while it runs; the last answer is checked below.
metrics=""
while kill -0 "$listener_pid" 2>/dev/null; do
    if response="$(ik_http_get 127.0.0.1 "$metrics_port" /metrics)" && [[ "$response" == "HTTP/1."?" 200"* ]]; then
        metrics="$response"
    fi
    sleep 0.5
done
listener_status=0
wait "$listener_pid" || listener_status=$?
listener_out="$(cat "$listener_file")"
rm -f "$listener_file"
if [ "$listener_status" -ne 0 ]; then
    ik_die "billing-listener exited with $listener_status"
fi
if [ -z "$metrics" ]; then
    ik_die "no answer from http://127.0.0.1:$metrics_port/metrics while billing-listener ran"
fi
consumed_metric="$(grep -m 1 '^idemkafka_consumed_total{' <<<"$metrics" | tr -d '\r' || true)"
if [ -z "$consumed_metric" ] || ! grep -qi '^content-type: text/plain; version=0.0.4' <<<"$metrics"; then
    printf '%s\n' "$metrics" | head -n 20 >&2
    ik_die "/metrics did not serve idemkafka_consumed_total as text/plain; version=0.0.4"
fi

field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$listener_out"; }
consumed="$(field consumed)"
skipped="$(field duplicates)"
charges="$(field charges_in_db)"
charged_orders="$(field unique_orders_in_db)"
provider_charges="$(field provider_charges)"

echo
echo "summary"
printf '  %-36s %s\n' "events consumed" "$consumed" \
    "duplicates skipped" "$skipped" \
    "charges in the database" "$charges" \
    "distinct orders charged" "$charged_orders" \
    "unique orders published" "$unique_orders" \
    "charges made at the payment provider" "$provider_charges" \
    "/metrics, last scrape during the run" "$consumed_metric"
if [ "$consumed" = "$events" ] && [ "$charges" = "$unique_orders" ] && [ "$charged_orders" = "$unique_orders" ] &&
    [ "$provider_charges" = "$unique_orders" ]; then
    echo "OK: every order charged exactly once"
else
    echo "FAILED: charges do not match unique orders"
    exit 1
fi
