#!/usr/bin/env bash
# Makes sure the command-line tools the test suite drives are present: curl and jq, which the
# README's example session uses (a test replays it). Quiet when they are already installed.
set -euo pipefail

missing=()
for tool in curl jq; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing tools: ${missing[*]}; install them with your package manager" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    sudo=(sudo)
fi
echo "Installing ${missing[*]} with apt-get..."
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
