#!/usr/bin/env bash
# Makes sure the Citus extension is installed for the PostgreSQL the tests use (the harness's
# Citus cluster needs it; docs/scale-out.md). Does nothing (and prints nothing) when `citus.so`
# is already in that PostgreSQL's library directory. Otherwise builds Citus from the source
# tarball named by CITUS_SOURCE (default ../shared/vendor/citus-13.2.2.tar.gz from the project's
# root), as ../shared/vendor/README.md describes: Debian's build packages, one line of
# compatibility with PostgreSQL 15.20 and later, configure without libcurl, make install.
# On a machine with the internet, Citus's own package repository is the simpler source
# (`postgresql-15-citus-13.2`).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"

"$here/install-postgres.sh"
bin="$("$here/pg-bin.sh")"
pg_config="$bin/pg_config"
if [[ ! -x "$pg_config" ]]; then
    pg_config="$(command -v pg_config || true)"
fi

citus_installed() {
    [[ -n "$pg_config" && -x "$pg_config" ]] || return 1
    local libdir
    libdir="$("$pg_config" --pkglibdir 2>/dev/null)" || return 1
    [[ -f "$libdir/citus.so" ]]
}

if citus_installed; then
    exit 0
fi

source="${CITUS_SOURCE:-$root/../shared/vendor/citus-13.2.2.tar.gz}"
if [[ ! -f "$source" ]]; then
    echo "Citus is not installed and its source tarball $source does not exist." >&2
    echo "Install Citus (Citus's package repository serves postgresql-15-citus-13.2)" >&2
    echo "or set CITUS_SOURCE to a Citus source tarball." >&2
    exit 1
fi

sudo=()
if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "Building Citus needs root or sudo (apt-get, make install)." >&2
        exit 1
    fi
    sudo=(sudo)
fi

version="$("$bin/postgres" --version | sed -E 's/.* ([0-9]+)\..*/\1/')"
echo "Building Citus from $source for PostgreSQL $version..."
if command -v apt-get >/dev/null 2>&1; then
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "postgresql-server-dev-$version" liblz4-dev libzstd-dev libkrb5-dev make gcc >/dev/null
fi
# Installing the development package may have moved the server to a newer minor release.
bin="$("$here/pg-bin.sh")"
pg_config="$bin/pg_config"

build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
tar -xzf "$source" -C "$build"
src="$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n 1)"

# PostgreSQL 15.20 and later export have_createdb_privilege, which Citus 13.2.2 also defines
# for PostgreSQL < 16: rename Citus's own before its definition.
compat="$src/src/include/pg_version_compat.h"
if [[ -f "$compat" ]] && grep -q 'have_createdb_privilege' "$compat" \
    && ! grep -q 'citus_have_createdb_privilege_compat' "$compat"; then
    # The line before `have_createdb_privilege(void)` is its `static inline bool`.
    line="$(grep -n '^have_createdb_privilege(void)' "$compat" | head -n 1 | cut -d: -f1)"
    sed -i "$((line - 1))i #define have_createdb_privilege citus_have_createdb_privilege_compat" "$compat"
fi

(
    cd "$src"
    ./configure PG_CONFIG="$pg_config" --without-libcurl >"$build/configure.log" 2>&1 \
        || { tail -n 30 "$build/configure.log" >&2; exit 1; }
    make -j"$(nproc)" >"$build/make.log" 2>&1 || { tail -n 40 "$build/make.log" >&2; exit 1; }
    "${sudo[@]}" make install >"$build/install.log" 2>&1 \
        || { tail -n 30 "$build/install.log" >&2; exit 1; }
)

if ! citus_installed; then
    echo "Citus was built but citus.so is not in $("$pg_config" --pkglibdir)." >&2
    exit 1
fi
echo "Citus is installed in $("$pg_config" --pkglibdir)"
