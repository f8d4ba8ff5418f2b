#!/usr/bin/env bash
# The pg-boss peer (Node.js, PostgreSQL): two cells where pg-boss has a feature of its own to
# set against the library's, each on the same database and job counts, the two sides
# alternating (the library first in odd rounds, pg-boss first in even ones; within each side,
# the feature's run first in odd rounds, plain first in even ones), best of rounds.
#
#   benches/peer/pgboss.sh                                    # 3 rounds, both cells
#   PEER_ROUNDS=5 PEER_CELLS=group benches/peer/pgboss.sh
#   PEER_ROUNDS=1 PEER_GROUP_JOBS=2000 PEER_FAN_JOBS=2000 benches/peer/pgboss.sh   # a smoke run
#
# 1. group: a per-tenant concurrency limit. PEER_GROUP_JOBS (20,000) no-op jobs over 10 tenants
#    t0..t9, published untimed, then burnt down.
#    - the library: `FLOW_JOBS=$PEER_GROUP_JOBS FLOW_ROUNDS=1 cargo bench --bench flow --
#      postgres/cost`: a table with `concurrency_limit("{tenant}", 1000)` (**limited**) and one
#      without (**plain**); `workers(4).batch_size(100)`, 4 handler threads on
#      `next_batch(100, ..)` + `ack_all` (benches/flow.rs).
#    - pg-boss: jobs sent with `group: { id: 't<n>' }` (docs/api/jobs.md, "Group options") and
#      worked by `work()` with `groupConcurrency: 1000` (**group**; docs/api/workers.md,
#      "groupConcurrency": a per-group limit across all nodes, counted in the database, as the
#      library's limit is), and the same jobs worked without it (**plain**).
#    The limit is 1000 on both sides, a limit that never binds (pg-boss's workers hold at most
#    BATCH_SIZE x LOCAL_CONCURRENCY jobs, a tenant about a tenth of that): the cell measures
#    what keeping the limit costs (that pg-boss's limit holds was checked apart: at
#    `groupConcurrency: 3`, no group had more than 3 jobs in handlers). pg-boss's `localGroupConcurrency` (counted in the process,
#    no database work) is not the same thing (one process only, and it must be at most
#    localConcurrency, so 1000 is refused); it is not measured.
# 2. fanin: one callback that runs once PEER_FAN_JOBS (10,000) jobs are done.
#    - the library: `COMPOSE_FAN=$PEER_FAN_JOBS COMPOSE_ROUNDS=1 cargo bench --bench compose --
#      postgres/cost postgres/fanout`: the jobs each with the callback `after_settled`, burnt
#      down by 4 handler threads acking one by one; the burn-down rate with dependencies and of
#      a plain table, and the callback's delay from the last job's ack (benches/compose.rs).
#    - pg-boss has this built in: `flow(jobs)` with the callback job's `dependsOn` naming every
#      job's `ref` (docs/api/jobs.md, "Flows"; the callback is created `blocked` and unblocked by
#      a background resolver, every flowIntervalSeconds, once every parent is completed; then
#      fetched at a worker's next poll, so its delay is anywhere from ~0 to the two intervals
#      summed, by where the last completion falls: the best of rounds is the luckiest, and
#      each round's delay is printed too). All 10,001 jobs in one `flow()` call, one queue;
#      the same jobs `insert()`ed without the callback for the plain rate. The delay is from
#      the last parent's `completed_on` to the callback reaching the handler.
#    pg-boss completes a whole fetched batch in one statement (its batch handler); the
#    library's compose bench acks one job at a time, its grouped acks (`ack_all`) being the
#    group cell's.
#
# pg-boss is installed with npm (pinned: PGBOSS_VERSION, default 12.38.1, the newest 12.x)
# into a scratch folder (PEER_DIR, default $TMPDIR/sqlbroker-peer-pgboss), not into the
# repository. pg-boss 12 declares `node >= 22.12`; it runs here on node 20 (npm only warns).
# Each run works in a schema of its own, `pgboss_bench_<pid>`, dropped at its end (also when
# the run fails or is signalled). Settings, each can be overridden (the docs cited are
# pg-boss's docs/ in github.com/timgit/pg-boss, published at pgboss.io, read at 12.27; the
# installed 12.38.1 says the same of each option in its dist/types.d.ts):
#   BATCH_SIZE=1000       work() `batchSize`: jobs per fetch, handed to the handler as one
#                         batch and completed in one statement (docs/api/workers.md, "batchSize",
#                         as fetch()'s in docs/api/jobs.md). The docs name no best value; the
#                         best of a sweep here (100, 500, 1000 x 2, 4, 8 workers, 20,000 jobs):
#                         1000 ~17,000 jobs/s plain, 500 ~16,000, 100 ~10,000. Not 1:
#                         burstWhenBatchFull is ignored at 1, so each worker waits the polling
#                         interval between jobs (8 jobs/s with 4 workers).
#   LOCAL_CONCURRENCY=4   work() `localConcurrency`: workers polling and handling in parallel
#                         in the process (docs/api/workers.md, "localConcurrency"); 4 as the
#                         library's 4 workers / 4 handler threads (8 was no faster at 1000).
#   POLL_SECONDS=0.5      `pollingIntervalSeconds`, its minimum (docs/api/workers.md): the
#                         wait after a short fetch, so the fan-in's callback, unblocked after
#                         the burn-down, is fetched as soon as pg-boss allows.
#   BURST=1               `burstWhenBatchFull: true`: fetch again at once while a fetch comes
#                         back full (docs/api/workers.md, "burstWhenBatchFull"); without it each
#                         worker waits the polling interval between batches (800 jobs/s at batch 100).
#   FLOW_SECONDS=1        constructor `flowIntervalSeconds` (default 5; 1 is the least its
#                         config check accepts, dist/attorney.js applyFlowConfig): how often
#                         the resolver unblocks the dependents of completed jobs
#                         (docs/api/constructor.md; the fan-in delay is mostly this).
#   PARTITION=1           createQueue() `partition: true`: each queue in a table of its own
#                         (docs/api/queues.md, docs/introduction.md: for a large queue), as
#                         each library side has its own table.
#   POOL_MAX=10           constructor `max`, the pool's size (its default; docs/api/constructor.md).
# Not used: `useListenNotify` / a queue's `notify` (docs/api/constructor.md, queues.md): jobs
# are all queued before the workers start, and with notify on, the idle poll becomes
# `notifyPollingIntervalSeconds` (30 s), while the resolver's unblocking sends no NOTIFY.
# Also: PEER_ROUNDS=3, PEER_CELLS="group fanin". Server: SQLBROKER_PG_URL (default
# postgres://postgres@127.0.0.1:5432/test). Needs cargo, `node` and `npm` (skips with a
# message when node or npm is missing).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${PEER_ROUNDS:-3}
GROUP_JOBS=${PEER_GROUP_JOBS:-20000}
FAN_JOBS=${PEER_FAN_JOBS:-10000}
CELLS=${PEER_CELLS:-group fanin}
VERSION=${PGBOSS_VERSION:-12.38.1}
DIR=${PEER_DIR:-${TMPDIR:-/tmp}/sqlbroker-peer-pgboss}
PG_URL=${SQLBROKER_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
export BATCH_SIZE=${BATCH_SIZE:-1000} LOCAL_CONCURRENCY=${LOCAL_CONCURRENCY:-4}
export POLL_SECONDS=${POLL_SECONDS:-0.5} BURST=${BURST:-1} FLOW_SECONDS=${FLOW_SECONDS:-1}
export PARTITION=${PARTITION:-1} POOL_MAX=${POOL_MAX:-10}
# The library's limited side is `concurrency_limit("{tenant}", 1000)` (benches/flow.rs): fixed.
export GROUP_LIMIT=1000

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIPPED: the pg-boss peer needs node and npm (not both on PATH here)"
    exit 0
fi
for cell in $CELLS; do
    case $cell in
    group | fanin) ;;
    *) echo "unknown cell '$cell' (group fanin)" >&2; exit 2 ;;
    esac
done

mkdir -p "$DIR"
if [ "$(cd "$DIR" && node -p "require('./node_modules/pg-boss/package.json').version" 2>/dev/null)" != "$VERSION" ]; then
    echo "installing pg-boss@$VERSION and pg into $DIR"
    (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "pg-boss@$VERSION" pg >/dev/null)
fi
cp benches/peer/pgboss-run.mjs "$DIR/"

echo "building the flow and compose benches"
cargo bench --bench flow --bench compose --no-run >/dev/null 2>&1 ||
    cargo bench --bench flow --bench compose --no-run

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

# Each side appends `<round> <key> <value>` lines to $RESULTS.
library_group() {
    # `postgres/cost <side> <N> jobs/s  x<R> of plain  (runs: ..)`; "both limits" and "fair"
    # are the bench's own sides, not compared here.
    FLOW_JOBS=$GROUP_JOBS FLOW_ROUNDS=1 SQLBROKER_PG_URL=$PG_URL \
        cargo bench --bench flow -- postgres/cost 2>/dev/null |
        awk -v r="$1" '$1 == "postgres/cost" && ($2 == "limited" || $2 == "plain") {
            print r, "sb_" $2, $3 }' | tee -a "$RESULTS"
}
pgboss_group() {
    (cd "$DIR" && SWAP=$(($1 % 2 == 0)) PEER_PG_URL=$PG_URL JOBS=$GROUP_JOBS node pgboss-run.mjs group 2>&1) |
        awk -v r="$1" '$1 == "pgboss" { print r, "pb_" $2, $4; next } { print "  pg-boss: " $0 > "/dev/stderr" }' |
        tee -a "$RESULTS"
}
library_fanin() {
    # `postgres/fanout <N> jobs, 1 callback: delay p50 <ms> ms, worst ..` and
    # `postgres/cost burn-down with dependencies <N> jobs/s, plain <M> jobs/s: ..`
    COMPOSE_FAN=$FAN_JOBS COMPOSE_ROUNDS=1 SQLBROKER_PG_URL=$PG_URL \
        cargo bench --bench compose -- postgres/cost postgres/fanout 2>/dev/null |
        awk -v r="$1" '$1 == "postgres/fanout" { print r, "sb_delay", $8 }
            $1 == "postgres/cost" && $2 == "burn-down" { print r, "sb_fan", $5; print r, "sb_fanplain", $8 }' |
        tee -a "$RESULTS"
}
pgboss_fanin() {
    # `pgboss flow <N> <jobs/s> <delay ms>` and `pgboss fanplain <N> <jobs/s>`
    (cd "$DIR" && SWAP=$(($1 % 2 == 0)) PEER_PG_URL=$PG_URL JOBS=$FAN_JOBS node pgboss-run.mjs fanin 2>&1) |
        awk -v r="$1" '$1 == "pgboss" && $2 == "flow" { print r, "pb_fan", $4; print r, "pb_delay", $5; next }
            $1 == "pgboss" { print r, "pb_" $2, $4; next } { print "  pg-boss: " $0 > "/dev/stderr" }' |
        tee -a "$RESULTS"
}

echo "pg-boss $VERSION (node $(node --version)): batchSize $BATCH_SIZE, localConcurrency" \
    "$LOCAL_CONCURRENCY, pollingIntervalSeconds $POLL_SECONDS, burstWhenBatchFull $BURST," \
    "flowIntervalSeconds $FLOW_SECONDS, partition $PARTITION, groupConcurrency $GROUP_LIMIT;" \
    "cells: $CELLS; $GROUP_JOBS jobs (group), $FAN_JOBS (fanin); $ROUNDS rounds;" \
    "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    for cell in $CELLS; do
        if [ $((round % 2)) -eq 1 ]; then
            "library_$cell" "$round"; "pgboss_$cell" "$round"
        else
            "pgboss_$cell" "$round"; "library_$cell" "$round"
        fi
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "best of $ROUNDS rounds (rates: the highest, jobs/s; delays: the lowest, ms);"
echo "sqlbroker / pg-boss, and each side's cost of the feature as a ratio of its own plain:"
awk '{ if ($2 ~ /delay/) { if (!($2 in best) || $3 < best[$2]) best[$2] = $3; runs[$2] = runs[$2] " " $3 }
       else if ($3 > best[$2]) best[$2] = $3 }
    function row(cell, what, s, p, plain_s, plain_p) {
        if (!(s in best) && !(p in best)) return
        printf "%-7s %-28s %10s %10s %8s", cell, what, (s in best) ? sprintf("%.0f", best[s]) : "-",
            (p in best) ? sprintf("%.0f", best[p]) : "-",
            (s in best && p in best && best[p] > 0) ? sprintf("%.2fx", best[s] / best[p]) : "-"
        if (plain_s != "")
            printf "   x%s / x%s of plain",
                (s in best && best[plain_s] > 0) ? sprintf("%.2f", best[s] / best[plain_s]) : "-",
                (p in best && best[plain_p] > 0) ? sprintf("%.2f", best[p] / best[plain_p]) : "-"
        printf "\n"
    }
    END {
        printf "%-7s %-28s %10s %10s %8s\n", "cell", "side", "sqlbroker", "pg-boss", "sb/pgb"
        row("group", "limit 1000 per tenant", "sb_limited", "pb_group", "sb_plain", "pb_plain")
        row("group", "plain", "sb_plain", "pb_plain")
        row("fanin", "jobs with the callback", "sb_fan", "pb_fan", "sb_fanplain", "pb_fanplain")
        row("fanin", "plain", "sb_fanplain", "pb_fanplain")
        if ("sb_delay" in best || "pb_delay" in best)
            printf "%-7s %-28s %10s %10s %8s\n", "fanin", "callback delay, ms",
                ("sb_delay" in best) ? sprintf("%.1f", best["sb_delay"]) : "-",
                ("pb_delay" in best) ? sprintf("%.1f", best["pb_delay"]) : "-",
                ("sb_delay" in best && "pb_delay" in best && best["pb_delay"] > 0) ?
                    sprintf("%.3fx", best["sb_delay"] / best["pb_delay"]) : "-"
        if ("sb_delay" in runs || "pb_delay" in runs)
            printf "%-7s %-28s runs, ms: sqlbroker%s; pg-boss%s\n", "fanin", "callback delay",
                runs["sb_delay"], runs["pb_delay"]
    }' "$RESULTS"
echo "group: the library's limited side is concurrency_limit(\"{tenant}\", 1000), pg-boss's is"
echo "work() with groupConcurrency: 1000 on jobs sent with group { id: tenant }; plain: the same"
echo "jobs (tenant column / group id set) without the limit. Library: 4 workers, batch 100, 4"
echo "handler threads, grouped acks; pg-boss: localConcurrency $LOCAL_CONCURRENCY, batchSize $BATCH_SIZE."
echo "fanin: the library's callback after_settled on every job (handlers ack one by one);"
echo "pg-boss's flow() with the callback's dependsOn naming every job (batches completed whole)."
echo "Delay: library from the last ack's return, pg-boss from the last parent's completed_on, to"
echo "the callback in a handler. pg-boss's resolver runs every flowIntervalSeconds ($FLOW_SECONDS s), the"
echo "callback is fetched at the next poll after it ($POLL_SECONDS s): anywhere from ~0 to ~1.5 s a run."
