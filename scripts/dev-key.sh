#!/usr/bin/env bash
# Prints the local development encryption key (for queues with encryptionEnabled), creating
# it in .data/encryption.key on first use: 32 random bytes as 64 hex characters, readable by
# its owner only. `make run` passes it to Comb as COMB_ENCRYPTION_KEY unless that is set.
# Never use this key for real data: it sits unprotected next to the development database.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
key="$root/.data/encryption.key"
if [[ ! -s "$key" ]]; then
    mkdir -p "$root/.data"
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$key")
    echo "Created a development encryption key in $key" >&2
fi
cat "$key"
