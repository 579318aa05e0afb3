#!/usr/bin/env bash
# The data-path integration tests on a Citus cluster (a coordinator and two workers, started by
# the suite's harness): every test of the data-path modules below runs with
# COMB_TEST_BACKEND=citus, except those in crates/comb/tests/suite/citus_exempt.txt, each of
# which says there in one line why it cannot apply to Citus. Ends with the line
#   citus: N of M data-path tests ran on Citus
# where M counts every test of those modules (the exempted included) and N those that passed
# on Citus; fails when a test fails or when N/M falls below 0.9.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The data-path modules of the suite: push, pop, ack, leases, groups, retries and dead
# letters, transactions, idempotency, retention, long-poll, streams, Queen's clients, and the
# bad input and size limits of those routes (`errors`, `limits`: the same problem+json answers
# on both backends).
modules=(
    acks consumer_groups handoff idempotency lease lease_extend long_poll no_skip
    pop_options retention retries streams transactions unreadable queen_compat
    queen_defects queen_python backends errors limits servers upgrades
)

exempt_file=crates/comb/tests/suite/citus_exempt.txt
listed="$(cargo test -q -p comb --test suite -- --list 2>/dev/null | sed -n 's/: test$//p')"
all=()
for m in "${modules[@]}"; do
    while IFS= read -r t; do
        [[ -n "$t" ]] && all+=("$t")
    done < <(grep -E "^${m}::" <<<"$listed" || true)
done
total=${#all[@]}
if (( total == 0 )); then
    echo "citus: no data-path tests found" >&2
    exit 1
fi

skips=()
exempted=0
while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    name="${line%% *}"
    if ! grep -qxF "$name" <<<"$listed"; then
        echo "citus: $exempt_file names $name, which is not a test" >&2
        exit 1
    fi
    skips+=(--skip "$name")
    exempted=$((exempted + 1))
done <"$exempt_file"

filters=()
for m in "${modules[@]}"; do filters+=("${m}::"); done
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
COMB_TEST_BACKEND=citus cargo test -p comb --test suite -- "${filters[@]}" "${skips[@]}" \
    2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
passed="$(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed.*/\1/p' "$log" | tail -1)"
passed="${passed:-0}"
echo "citus: $passed of $total data-path tests ran on Citus ($exempted exempted in $exempt_file)"
if (( status != 0 )); then
    exit "$status"
fi
if (( passed * 10 < total * 9 )); then
    echo "citus: fewer than 9 in 10 data-path tests ran on Citus" >&2
    exit 1
fi
