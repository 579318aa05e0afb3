#!/usr/bin/env bash
# Proves `comb-bench --peer NAME=PROGRAM` works end to end: Comb itself, started the way a
# Queen-API peer is (`PROGRAM serve --listen ADDR`, `DATABASE_URL`, ready on `GET /health`),
# runs the `light` cell beside Comb in smoke mode. Fails unless the peer's row and the
# Comb ÷ peer table come out with a delivered rate. Its numbers mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=target/release/comb-bench
comb=target/release/comb
for bin in "$bench" "$comb"; do
    [ -x "$bin" ] || { echo "$bin missing: cargo build --release -p comb-cli -p comb-bench" >&2; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$bench" --smoke --cells "${CELLS:-light}" --baseline /dev/null \
    --peer "comb-peer=$comb" | tee "$out"
# The peer's row: cell, system, a delivered rate above zero.
if ! awk '$2 == "comb-peer" && $3 + 0 > 0 { found = 1 } END { exit !found }' "$out"; then
    echo "bench-peer-smoke: no row with a delivered rate for the peer" >&2
    exit 1
fi
if ! grep -q '^Comb / peer, by cell:' "$out"; then
    echo "bench-peer-smoke: no Comb / peer table" >&2
    exit 1
fi
echo "bench-peer-smoke: ok"
