#!/usr/bin/env bash
# Makes sure PostgreSQL server binaries are available, installing Debian's packages if they
# are not. Does nothing (and prints nothing) when they are already installed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if "$here/pg-bin.sh" >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "PostgreSQL server binaries not found and apt-get is not available." >&2
    echo "Install PostgreSQL 14 or newer and set COMB_PG_BIN to its bin directory." >&2
    exit 1
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "PostgreSQL server binaries not found; installing them needs root or sudo." >&2
        exit 1
    fi
    sudo=(sudo)
fi

echo "Installing PostgreSQL with apt-get..."
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y postgresql postgresql-contrib

# The Debian package creates and may start a cluster called "main" on port 5432. Comb does
# not use it, so stop it to free its memory and port.
if command -v pg_ctlcluster >/dev/null 2>&1; then
    for version_dir in /usr/lib/postgresql/*/; do
        version="$(basename "$version_dir")"
        "${sudo[@]}" pg_ctlcluster "$version" main stop >/dev/null 2>&1 || true
    done
fi

if ! bin="$("$here/pg-bin.sh")"; then
    echo "PostgreSQL was installed but its server binaries were not found." >&2
    exit 1
fi
echo "PostgreSQL server binaries are in $bin"
