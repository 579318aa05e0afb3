#!/usr/bin/env bash
# What Citus's planning costs a router statement, apart from anything of Comb's: one node,
# the same binaries and settings, the same one-message push transaction (lock the partition's
# row, append at head + 1) run by pgbench against plain tables and against the same tables
# distributed with their shards on that node, as a worker runs a partition's statements by
# local execution on the direct route. Prints the server's CPU per transaction of each, in
# two forms of the append: `INSERT … SELECT` reading the head (Comb's form), and a read of the
# head then `INSERT … VALUES` (both of Citus's fast-path form). docs/scale-out-measured.md
# reads the result.
#
#   scripts/citus-floor.sh [seconds per run, default 15]
set -euo pipefail

secs="${1:-15}"
bin="$(dirname "$0")/pg-bin.sh"
B="$("$bin")"
dir="$(mktemp -d /tmp/cf.XXXX)"
as_pg=()
if [[ "$(id -u)" == 0 ]]; then
    chown postgres "$dir"
    as_pg=(runuser -u postgres --)
fi
port=55439
cleanup() {
    "${as_pg[@]}" "$B/pg_ctl" -D "$dir/data" -w -m fast stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

"${as_pg[@]}" "$B/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >>"$dir/data/postgresql.conf" <<EOF
shared_preload_libraries = 'citus'
port = $port
unix_socket_directories = '$dir'
listen_addresses = '127.0.0.1'
shared_buffers = 128MB
citus.shard_count = 8
EOF
"${as_pg[@]}" "$B/pg_ctl" -D "$dir/data" -l "$dir/log" -w start >/dev/null
psql() { "${as_pg[@]}" "$B/psql" -h "$dir" -p "$port" -U postgres -qAtX -v ON_ERROR_STOP=1 "$@"; }
psql -c "CREATE DATABASE plain" -c "CREATE DATABASE dist"
for db in plain dist; do
    psql -d "$db" >/dev/null <<'EOF'
CREATE TABLE parts (id int PRIMARY KEY, name text);
CREATE TABLE msgs (partition_id int, pos bigint, payload jsonb, PRIMARY KEY (partition_id, pos));
INSERT INTO parts SELECT g, 'p' || g FROM generate_series(1, 100) g;
INSERT INTO msgs SELECT g, 0, '{}' FROM generate_series(1, 100) g;
EOF
done
psql -d dist >/dev/null <<EOF
SET client_min_messages = warning;
CREATE EXTENSION citus;
SELECT citus_set_coordinator_host('127.0.0.1', $port);
SELECT citus_set_node_property('127.0.0.1', $port, 'shouldhaveshards', true);
SELECT create_distributed_table('parts', 'id');
SELECT create_distributed_table('msgs', 'partition_id', colocate_with => 'parts');
EOF
[[ "$(psql -d dist -c "SELECT count(*) FROM pg_dist_shard")" == 16 ]] || {
    echo "citus-floor: the tables were not distributed" >&2
    exit 1
}

cat >"$dir/insert-select.sql" <<'EOF'
\set p random(1, 100)
BEGIN;
SELECT id FROM parts WHERE id = :p FOR UPDATE;
INSERT INTO msgs SELECT :p, max(pos) + 1, '{"n": 1}' FROM msgs WHERE partition_id = :p;
COMMIT;
EOF
cat >"$dir/fast-path.sql" <<'EOF'
\set p random(1, 100)
BEGIN;
SELECT id FROM parts WHERE id = :p FOR UPDATE;
SELECT pos + 1 AS next FROM msgs WHERE partition_id = :p ORDER BY pos DESC LIMIT 1 \gset
INSERT INTO msgs VALUES (:p, :next, '{"n": 1}');
COMMIT;
EOF
chmod a+r "$dir"/*.sql

pm="$(head -1 "$dir/data/postmaster.pid")"
# The postmaster's CPU with its exited children's (clock ticks).
cpu() { awk '{print $14 + $15 + $16 + $17}' "/proc/$pm/stat"; }
hz="$(getconf CLK_TCK)"
printf '%-14s %-6s %8s %14s\n' form tables tps "CPU µs/tx"
for form in insert-select fast-path; do
    for db in plain dist plain dist; do
        before="$(cpu)"
        tps="$("${as_pg[@]}" "$B/pgbench" -h "$dir" -p "$port" -U postgres -n -M prepared \
            -f "$dir/$form.sql" -c 8 -j 2 -T "$secs" "$db" 2>&1 |
            awk '/^tps/ {print $3; exit}')"
        sleep 1
        after="$(cpu)"
        printf '%-14s %-6s %8.0f %14.0f\n' "$form" "$db" "$tps" \
            "$(echo "($after - $before) * 1000000 / $hz / ($tps * $secs)" | bc -l)"
    done
done
