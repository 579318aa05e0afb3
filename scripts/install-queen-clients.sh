#!/usr/bin/env bash
# Installs Queen MQ's own Python client, unmodified from PyPI, into virtual environments under
# target/queen-py/: the version Comb's compatibility is defined against (0.15.0) and the newest
# one tested (2.6.0), each with pytest. The compatibility suite (clients/queen-python) runs with
# both. Quiet and quick when they are already installed.
#
# Usage: scripts/install-queen-clients.sh [VERSION...]   (default: 0.15.0 2.6.0)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
versions=("$@")
[[ ${#versions[@]} -gt 0 ]] || versions=(0.15.0 2.6.0)
pytest_version="9.2.0"

python=""
for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 \
        && "$candidate" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [[ -z "$python" ]]; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=()
        [[ "$(id -u)" == 0 ]] || sudo=(sudo)
        echo "Installing python3 and python3-venv with apt-get..."
        "${sudo[@]}" apt-get update -qq
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
        python=python3
    else
        echo "Python 3.9 or newer with venv is needed for the Queen client suite" >&2
        exit 1
    fi
fi

# Tests that run at the same time may each call this script: one installs, the others wait
# for it and then find the clients there.
mkdir -p "$root/target/queen-py"
exec 9>"$root/target/queen-py/.install.lock"
flock 9

for version in "${versions[@]}"; do
    venv="$root/target/queen-py/v$version"
    if [[ -x "$venv/bin/python" ]] \
        && "$venv/bin/python" -c "import importlib.metadata as m, pytest; assert m.version('queen-mq') == '$version'" 2>/dev/null; then
        continue
    fi
    echo "Installing queen-mq==$version into $venv..."
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "queen-mq==$version" "pytest==$pytest_version"
done
