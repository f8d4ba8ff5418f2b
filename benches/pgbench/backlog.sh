#!/bin/sh
# A long backlog by hand (issue 18): the lease protocol of pg-lease100.sql, claiming from the
# head of the index, and of pg-lease100-cursor.sql, claiming past a cursor, each over a table
# of ROWS rows for SECS seconds with CLIENTS clients, alternating ROUNDS times; pgbench prints
# the rate every 5 s (x100 for jobs/s). The scripts run on a table of their own
# (backlog_jobs_<pid>), dropped at the end.
#
#   benches/pgbench/backlog.sh                 # 1,000,000 rows, 40 s, 4 clients, 1 round
#   ROWS=2000000 SECS=60 ROUNDS=2 benches/pgbench/backlog.sh
#
# Connection: PGHOST (127.0.0.1), PGPORT (5432), PGUSER (postgres), PGDATABASE (test).
set -eu
ROWS=${ROWS:-1000000}
SECS=${SECS:-40}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-1}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export PGDATABASE=${PGDATABASE:-test}
here=$(cd "$(dirname "$0")" && pwd)
table=backlog_jobs_$$
dir=$(mktemp -d)
trap 'psql -q -X -c "DROP TABLE IF EXISTS $table" >/dev/null 2>&1; rm -rf "$dir"' EXIT
for f in pg-schema.sql pg-lease100.sql pg-lease100-cursor.sql; do
    sed "s/jobs/$table/g; s/400000/$ROWS/" "$here/$f" > "$dir/$f"
done
round=1
while [ "$round" -le "$ROUNDS" ]; do
    for script in pg-lease100.sql pg-lease100-cursor.sql; do
        psql -q -X -v ON_ERROR_STOP=1 -f "$dir/pg-schema.sql" >/dev/null 2>&1
        echo "== round $round: $script, $ROWS rows, $CLIENTS clients, $SECS s (load $(cut -d' ' -f1-3 /proc/loadavg))"
        pgbench -n -f "$dir/$script" -D last=0 -D n=0 -c "$CLIENTS" -j "$CLIENTS" -T "$SECS" -P 5 2>&1 \
            | grep -E '^progress|^tps' | sed 's/ (without initial connection time)//'
    done
    round=$((round + 1))
done
