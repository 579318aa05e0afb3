#!/bin/bash
# PostgreSQL CPU and WAL per message of one storage variant under pgbench, on a running
# cluster (PGDATA, PGHOST, PGPORT) with a database `pk` made by schema.sql (for `gin`, a
# database `pkgin` made by schema.sql and then `CREATE INDEX ON pk.batches USING gin (ids)`).
# Usage: measure.sh packed|nodedup|gin|rows [SECONDS] [CLIENTS]
set -e
dir=$(cd "$(dirname "$0")" && pwd)
v=$1; secs=${2:-20}; clients=${3:-4}
: "${PGDATA:=/tmp/px/d}" "${PGHOST:=/tmp/px}" "${PGPORT:=55432}"
bin=/usr/lib/postgresql/15/bin
db=pk; [ "$v" = gin ] && db=pkgin
P="runuser -u postgres -- psql -h $PGHOST -p $PGPORT -d $db -At"
pop=packed; [ "$v" = rows ] && pop=rows
case $v in
  rows) batches=; states=pk.row_states ;;
  *) batches=pk.batches; states=pk.cursor_states ;;
esac
if [ -n "$batches" ]; then pushed="select coalesce(sum(n),0) from $batches"; else pushed="select count(*) from pk.messages"; fi
consumed="select coalesce(sum(pos),0) from (select distinct on (partition_id) pos from $states order by partition_id, ver desc) s"
pm=$(head -1 "$PGDATA/postmaster.pid")
# The cluster's live processes, and what the postmaster reaped of its exited backends.
cpu() { local t=0; for p in $(pgrep -P $pm) $pm; do s=$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null); t=$((t + ${s:-0})); done; c=$(awk '{print $16+$17}' /proc/$pm/stat); echo $((t + c)); }
p0=$($P -c "$pushed"); c0=$($P -c "$consumed"); w0=$($P -c "select pg_current_wal_lsn()")
sleep 3; t0=$(cpu)
runuser -u postgres -- $bin/pgbench -h $PGHOST -p $PGPORT -n -M prepared -c $clients -j 2 -T $secs \
  -f "$dir/push_$v.sql@10" -f "$dir/pop_$pop.sql@2" $db > "/tmp/pgbench_$v.txt" 2>&1
t1=$(cpu)
p1=$($P -c "$pushed"); c1=$($P -c "$consumed"); w1=$($P -c "select pg_wal_lsn_diff(pg_current_wal_lsn(), '$w0')")
hz=$(getconf CLK_TCK)
python3 -c "
pushed=$p1-$p0; consumed=$c1-$c0; cpu=($t1-$t0)/$hz; wal=$w1
print('$v: pushed %d (%.0f msg/s), consumed %d; PostgreSQL CPU %.2f s = %.2f us/msg, %.2f cores; WAL %.0f B/msg' % (pushed, pushed/$secs, consumed, cpu, cpu*1e6/pushed, cpu/$secs, wal/pushed))
"
