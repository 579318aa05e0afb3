#!/usr/bin/env bash
# Measures the dashboard's page of a queue of 10,000 partitions: pushes one message into each
# of 10,000 partitions of queue "wide" on a running Comb (COMB_URL, default
# http://127.0.0.1:6632), loads /queues/wide once at once (the queue's totals computed over
# every partition: the per-minute snapshot does not hold it yet), waits (up to 150 s) for the
# snapshot to hold it, then loads the page five more times. Prints the server's own time for
# each load (the Server-Timing header). docs/dashboard.md records the result.
set -euo pipefail

url="${COMB_URL:-http://127.0.0.1:6632}"
for chunk in $(seq 0 9); do
    body='{"items":['
    for i in $(seq 0 999); do
        n=$((chunk * 1000 + i))
        [[ $i -gt 0 ]] && body+=','
        body+="$(printf '{"queue":"wide","partition":"p%05d","payload":{"n":%d}}' "$n" "$n")"
    done
    body+=']}'
    curl -fsS -o /dev/null -H 'content-type: application/json' -d "$body" "$url/api/v1/push"
done
timing() {
    curl -fsS -o /dev/null -D - "$url/queues/wide" | tr -d '\r' | grep -i '^server-timing' \
        | sed "s/^/$1: /"
}
timing "before the snapshot"
for _ in $(seq 1 150); do
    if curl -fsS "$url/api/v1/resources/queues/wide?limit=1" | grep -q '"figuresLive": *false'; then
        break
    fi
    sleep 1
done
for run in 1 2 3 4 5; do
    timing "run $run"
done
