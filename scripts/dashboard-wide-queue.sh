#!/usr/bin/env bash
# Measures the dashboard's page of a queue of 10,000 partitions: pushes one message into each
# of 10,000 partitions of queue "wide" on a running Comb (COMB_URL, default
# http://127.0.0.1:6632), then loads /queues/wide five times and prints the server's own time
# for each (the Server-Timing header). docs/dashboard.md records the result.
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
for run in 1 2 3 4 5; do
    curl -fsS -o /dev/null -D - "$url/queues/wide" | tr -d '\r' | grep -i '^server-timing' \
        | sed "s/^/run $run: /"
done
