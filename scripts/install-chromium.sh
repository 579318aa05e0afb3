#!/usr/bin/env bash
# Makes sure a headless Chromium is present for the dashboard's browser tests (Debian's
# `chromium` and `chromium-driver` packages, driven over WebDriver). Quiet when it is already installed.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing; install it with your package manager" >&2
    exit 1
fi
sudo=()
if [[ "$(id -u)" != 0 ]]; then
    sudo=(sudo)
fi
echo "Installing chromium with apt-get..."
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
