#!/usr/bin/env bash
# Makes sure Patroni and etcd are available for `make chaos-ha`, installing Debian's packages
# (patroni, etcd-server, etcd-client) if they are not. Does nothing (and prints nothing) when
# they are already installed. The chaos scenario starts its own etcd and PostgreSQL nodes; a
# service the packages may have started is stopped so that it holds no ports or memory.
set -euo pipefail

if command -v patroni >/dev/null 2>&1 && command -v patronictl >/dev/null 2>&1 \
    && command -v etcd >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "Patroni and etcd not found and apt-get is not available." >&2
    echo "Install patroni and etcd (server) so that 'patroni', 'patronictl' and 'etcd' are on PATH." >&2
    exit 1
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "Patroni and etcd not found; installing them needs root or sudo." >&2
        exit 1
    fi
    sudo=(sudo)
fi

echo "Installing Patroni and etcd with apt-get..."
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq patroni etcd-server etcd-client

# The etcd package may start a system-wide etcd; the scenario runs its own.
if command -v service >/dev/null 2>&1; then
    "${sudo[@]}" service etcd stop >/dev/null 2>&1 || true
fi

for tool in patroni patronictl etcd; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "Patroni and etcd were installed but '$tool' is not on PATH." >&2
        exit 1
    fi
done
