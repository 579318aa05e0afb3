#!/usr/bin/env bash
# Prints the directory holding the PostgreSQL server binaries (initdb, pg_ctl, postgres, psql)
# and exits 1 if there is none. Looks at, in order: $COMB_PG_BIN, `pg_config --bindir`, the
# highest /usr/lib/postgresql/*/bin (Debian/Ubuntu keep server binaries off PATH), then PATH.
# A directory only counts if it has initdb and pg_ctl: client-only packages put psql there too.
# The test harness (crates/harness) uses the same search.
set -euo pipefail

has_server_binaries() {
    [[ -n "$1" && -x "$1/initdb" && -x "$1/pg_ctl" ]]
}

if [[ -n "${COMB_PG_BIN:-}" ]]; then
    if has_server_binaries "$COMB_PG_BIN"; then
        echo "$COMB_PG_BIN"
        exit 0
    fi
    echo "COMB_PG_BIN=$COMB_PG_BIN does not contain initdb and pg_ctl" >&2
    exit 1
fi

if command -v pg_config >/dev/null 2>&1; then
    dir="$(pg_config --bindir 2>/dev/null || true)"
    if has_server_binaries "$dir"; then
        echo "$dir"
        exit 0
    fi
fi

best=""
while IFS= read -r dir; do
    if has_server_binaries "$dir"; then
        best="$dir"
    fi
done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V)
if [[ -n "$best" ]]; then
    echo "$best"
    exit 0
fi

if initdb="$(command -v initdb 2>/dev/null)"; then
    dir="$(dirname "$initdb")"
    if has_server_binaries "$dir"; then
        echo "$dir"
        exit 0
    fi
fi

exit 1
