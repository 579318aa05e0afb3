#!/usr/bin/env bash
# The local PostgreSQL cluster used for development (`make run`).
#
# Usage: scripts/dev-postgres.sh start|stop|status|url
#
#   start   create the cluster in .data/pg if needed, start it, and create database "comb"
#           (does nothing that is already done)
#   stop    stop the cluster (fast shutdown)
#   status  say whether it is running; exits 0 if it is, 3 if not
#   url     print the database URL for Comb's DATABASE_URL
#
# The cluster listens on TCP 127.0.0.1 only (no Unix sockets), port $COMB_DEV_PG_PORT
# (default 6633), with trust authentication for user "postgres". PostgreSQL does not run as
# root, so when this script runs as root the cluster belongs to the "postgres" user.
# Set COMB_PG_BIN to use PostgreSQL binaries from a particular directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_parent="$root/.data"
data="$data_parent/pg"
log="$data/postgres.log"
port="${COMB_DEV_PG_PORT:-6633}"
database="comb"
pg_user="postgres"

if ! [[ "$port" =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
    echo "COMB_DEV_PG_PORT must be a port number, not '$port'" >&2
    exit 2
fi

is_root() {
    [[ "$(id -u)" == 0 ]]
}

# Runs a server-side tool as the cluster's owner.
as_owner() {
    if is_root; then
        runuser -u "$pg_user" -- "$@"
    else
        "$@"
    fi
}

bin=""
find_bin() {
    if [[ -n "$bin" ]]; then
        return
    fi
    if ! bin="$("$root/scripts/pg-bin.sh")"; then
        "$root/scripts/install-postgres.sh"
        bin="$("$root/scripts/pg-bin.sh")"
    fi
}

# Whether the postmaster recorded in postmaster.pid is alive (what `pg_ctl status` checks).
running() {
    local pid
    [[ -f "$data/postmaster.pid" ]] || return 1
    pid="$(head -n 1 "$data/postmaster.pid" 2>/dev/null)" || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

# The port of the running cluster (line 4 of postmaster.pid), else the configured one.
effective_port() {
    local p=""
    if running; then
        p="$(sed -n 4p "$data/postmaster.pid" 2>/dev/null || true)"
    fi
    if [[ "$p" =~ ^[0-9]+$ ]]; then
        echo "$p"
    else
        echo "$port"
    fi
}

url() {
    echo "postgres://postgres@127.0.0.1:$(effective_port)/$database"
}

psql_admin() {
    PGCONNECT_TIMEOUT=10 "$bin/psql" -X -q -v ON_ERROR_STOP=1 -At \
        -h 127.0.0.1 -p "$(effective_port)" -U postgres -d postgres "$@"
}

init_cluster() {
    mkdir -p "$data"
    if is_root; then
        # The postgres user must be able to reach .data/pg.
        chmod o+x "$data_parent"
        chown "$pg_user:$pg_user" "$data"
        chmod 700 "$data"
        if ! runuser -u "$pg_user" -- test -x "$data"; then
            echo "The $pg_user user cannot reach $data." >&2
            echo "Make the directories above it traversable (chmod o+x), or set DATABASE_URL" >&2
            echo "to a PostgreSQL server of your own." >&2
            exit 1
        fi
    fi
    echo "Creating a PostgreSQL cluster in $data"
    local out
    if ! out="$(cd "$data" && as_owner "$bin/initdb" -D "$data" -U postgres -A trust \
        -E UTF8 --no-locale 2>&1)"; then
        echo "$out" >&2
        exit 1
    fi
    cat >>"$data/postgresql.conf" <<'CONF'

# Development settings for Comb (scripts/dev-postgres.sh). The port is given on the
# command line by the script.
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
CONF
}

wait_ready() {
    local p
    p="$(effective_port)"
    for _ in $(seq 1 60); do
        if "$bin/pg_isready" -q -h 127.0.0.1 -p "$p" -U postgres -d postgres; then
            return 0
        fi
        sleep 0.5
    done
    echo "PostgreSQL on 127.0.0.1:$p did not become ready; see $log" >&2
    exit 1
}

ensure_database() {
    if [[ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" != 1 ]]; then
        psql_admin -c "CREATE DATABASE $database"
        echo "Created database $database"
    fi
}

start() {
    find_bin
    if [[ ! -f "$data/PG_VERSION" ]]; then
        init_cluster
    fi
    if running; then
        local actual
        actual="$(effective_port)"
        if [[ "$actual" != "$port" ]]; then
            echo "Note: the cluster is already running on port $actual, not $port;" \
                "stop it first to change the port." >&2
        fi
    else
        echo "Starting PostgreSQL on 127.0.0.1:$port (data: $data, log: $log)"
        if ! (cd "$data" && as_owner "$bin/pg_ctl" -D "$data" -l "$log" -o "-p $port" \
            -w -t 60 start >/dev/null); then
            echo "PostgreSQL failed to start. End of $log:" >&2
            tail -n 40 "$log" >&2 || true
            echo "If the port is taken, choose another with COMB_DEV_PG_PORT." >&2
            exit 1
        fi
    fi
    wait_ready
    ensure_database
    echo "PostgreSQL is ready: $(url)"
}

stop() {
    if ! running; then
        echo "PostgreSQL is not running"
        return 0
    fi
    find_bin
    (cd "$data" && as_owner "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >/dev/null)
    echo "PostgreSQL stopped"
}

status() {
    if running; then
        echo "PostgreSQL is running on 127.0.0.1:$(effective_port) (data: $data)"
        url
        return 0
    fi
    if [[ -f "$data/PG_VERSION" ]]; then
        echo "PostgreSQL is not running (data: $data)"
    else
        echo "PostgreSQL is not running (no cluster yet; '$0 start' creates one)"
    fi
    return 3
}

case "${1:-}" in
start) start ;;
stop) stop ;;
status) status ;;
url) url ;;
*)
    echo "usage: $0 start|stop|status|url" >&2
    exit 2
    ;;
esac
