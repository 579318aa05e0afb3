#!/usr/bin/env bash
# The administration listings with 10,000 partitions and a million messages
# (docs/listings.md).
#
# Usage: scripts/listings-bench.sh fill|measure
#
#   fill     on a running Comb whose database is empty (COMB_URL, default
#            http://127.0.0.1:6632): queue "big" with 10,000 partitions of 100 messages each
#            (100 pushes of one message into every partition, 10,000 items per push), consumer
#            groups "audit" and "billing" on every partition (20,000 cursors, after message 50
#            and after message 90: seeks to the times between those pushes), and 99 empty
#            queues. With DATABASE_URL set, ANALYZEs the database afterwards.
#   measure  waits (up to 150 s) until the queue's totals are served from the per-minute
#            snapshot, then fetches each listing route three times and prints the best
#            `time_total` of curl, in seconds.
set -euo pipefail

url="${COMB_URL:-http://127.0.0.1:6632}"

now() { date -u +%Y-%m-%dT%H:%M:%S.%3NZ; }

push_round() {
    awk -v r="$1" 'BEGIN {
        printf "{\"items\":[";
        for (i = 0; i < 10000; i++) {
            if (i) printf ",";
            printf "{\"queue\":\"big\",\"partition\":\"p%05d\",\"payload\":{\"round\":%d,\"n\":%d}}", i, r, i;
        }
        printf "]}";
    }' | curl -fsS -o /dev/null -H 'content-type: application/json' --data-binary @- "$url/api/v1/push"
}

seek() {
    curl -fsS -o /dev/null -H 'content-type: application/json' \
        -d "{\"timestamp\":\"$2\"}" "$url/api/v1/consumer-groups/$1/queues/big/seek"
}

fill() {
    local at50="" at90=""
    for round in $(seq 1 100); do
        push_round "$round"
        case "$round" in
            50) sleep 0.1; at50="$(now)"; sleep 0.1 ;;
            90) sleep 0.1; at90="$(now)"; sleep 0.1 ;;
        esac
    done
    seek audit "$at50"
    seek billing "$at90"
    for n in $(seq -w 1 99); do
        curl -fsS -o /dev/null -H 'content-type: application/json' \
            -d "{\"queue\":\"empty-$n\"}" "$url/api/v1/configure"
    done
    if [[ -n "${DATABASE_URL:-}" ]]; then
        psql -X -q "$DATABASE_URL" -c ANALYZE
    fi
    echo "filled: 10,000 partitions x 100 messages, groups audit (at 50) and billing (at 90), 99 empty queues"
}

best_of_three() {
    local best=""
    for _ in 1 2 3; do
        t="$(curl -fsS -o /dev/null -w '%{time_total}' "$url$1")"
        if [[ -z "$best" ]] || awk -v a="$t" -v b="$best" 'BEGIN { exit !(a < b) }'; then
            best="$t"
        fi
    done
    printf '| `GET %s` | %.2f |\n' "$1" "$best"
}

measure() {
    for _ in $(seq 1 150); do
        if curl -fsS "$url/api/v1/resources/queues/big?limit=1" | grep -q '"figuresLive": *false'; then
            break
        fi
        sleep 1
    done
    echo "| Route | Seconds |"
    echo "|---|---|"
    for route in \
        /api/v1/resources/overview \
        /api/v1/resources/queues \
        /api/v1/resources/queues/big \
        '/api/v1/resources/partitions?limit=100' \
        '/api/v1/resources/partitions?queue=big&limit=1000&offset=9000' \
        /api/v1/consumer-groups \
        /api/v1/consumer-groups/audit \
        '/api/v1/consumer-groups/lagging?minLagSeconds=60' \
        '/api/v1/messages?queue=big&limit=100' \
        '/api/v1/messages?queue=big&status=pending&limit=100' \
        '/api/v1/messages?queue=big&status=completed&limit=100' \
        /api/v1/status \
        /api/v1/status/analytics \
        /metrics \
        / \
        /queues \
        /queues/big \
        /groups; do
        best_of_three "$route"
    done
}

case "${1:-}" in
    fill) fill ;;
    measure) measure ;;
    *) echo "usage: $0 fill|measure" >&2; exit 2 ;;
esac
