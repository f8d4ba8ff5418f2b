#!/usr/bin/env bash
# The peer in the project's benches: graphile-worker (Node.js, PostgreSQL) against the library
# on the same database and job count, alternating, with the same lease protocol by hand
# (pgbench, 4 clients) and the library's raw loop beside (both from the burn-down bench).
#
#   benches/peer/graphile.sh                      # 3 rounds of 60,000 jobs each side
#   PEER_ROUNDS=5 PEER_JOBS=100000 benches/peer/graphile.sh
#
# Each round: one burn-down run of the library's lease cells (`cargo bench --bench burndown`
# with BURNDOWN_ROUNDS=1 BURNDOWN_JOBS=$PEER_JOBS: plain `ack` with 32 handlers, the same with
# `AckMode::Deferred`, and `next_batch` + `ack_all`; each beside its raw loop and pgbench), then
# one run of graphile-worker (`graphile-run.mjs`) over the same number of jobs. The best of
# each column over the rounds, and each library path / graphile-worker, are printed at the end.
#
# graphile-worker is installed with npm (pinned: GRAPHILE_VERSION, default 0.18.0) into a
# scratch folder (PEER_DIR, default $TMPDIR/sqlbroker-peer-graphile), not into the repository.
# Its settings (its performance guide's batching options; each can be overridden):
#   CONCURRENCY=32      concurrent jobs (as the library's 32 handlers)
#   LOCAL_QUEUE=2000    jobs fetched and locked per fetch (localQueue.size)
#   COMPLETE_DELAY=10   completions batched over 10 ms (completeJobBatchDelay; -1 = off)
# (the best of a sweep here: concurrency 16/32/64, localQueue 100-4000, delay 0/10/50 ms;
# BENCHMARKS.md has it)
#   POLL_MS=2000        pollInterval (jobs are all queued before it starts; LISTEN wakes it)
# Server: SQLBROKER_PG_URL (default postgres://postgres@127.0.0.1:5432/test). Needs `node`
# (20 or later) and `npm`; skips with a message when they are missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${PEER_ROUNDS:-3}
JOBS=${PEER_JOBS:-60000}
VERSION=${GRAPHILE_VERSION:-0.18.0}
DIR=${PEER_DIR:-${TMPDIR:-/tmp}/sqlbroker-peer-graphile}
PG_URL=${SQLBROKER_PG_URL:-postgres://postgres@127.0.0.1:5432/test}

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIPPED: the graphile-worker peer needs node and npm (neither is on PATH here)"
    exit 0
fi

mkdir -p "$DIR"
if [ "$(cd "$DIR" && node -p "require('./node_modules/graphile-worker/package.json').version" 2>/dev/null)" != "$VERSION" ]; then
    echo "installing graphile-worker@$VERSION and pg into $DIR"
    (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "graphile-worker@$VERSION" pg >/dev/null)
fi
cp benches/peer/graphile-run.mjs "$DIR/"

echo "building the burn-down bench"
cargo bench --bench burndown --no-run >/dev/null 2>&1 || cargo bench --bench burndown --no-run

CELLS="postgres/lease_h32/ postgres/lease_d32/ postgres/lease_all/"
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
echo "graphile-worker $VERSION (node $(node --version)): concurrency ${CONCURRENCY:-32}," \
    "localQueue.size ${LOCAL_QUEUE:-2000}, completeJobBatchDelay ${COMPLETE_DELAY:-10}," \
    "pollInterval ${POLL_MS:-2000}; $JOBS jobs per run; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    # Library cells: `<cell> <threads> <jobs> <library/s> <settle> <raw/s> <l/raw> <pgbench/s> ..`
    # shellcheck disable=SC2086
    BURNDOWN_ROUNDS=1 BURNDOWN_JOBS=$JOBS SQLBROKER_PG_URL=$PG_URL \
        cargo bench --bench burndown -- $CELLS 2>/dev/null |
        awk -v r="$round" '$1 ~ /^postgres\/lease_(h32|d32|all)\// {
            split($1, id, "/"); print r, id[2], $4; print r, "raw_" id[2], $6
            if ($8 != "-") print r, "pgbench_" id[2], $8 }' | tee -a "$RESULTS"
    rate=$(cd "$DIR" && PEER_PG_URL=$PG_URL JOBS=$JOBS node graphile-run.mjs | awk '$1 == "graphile" { print $3 }')
    echo "$round graphile $rate" | tee -a "$RESULTS"
done

echo
echo "best of $ROUNDS rounds, jobs/s; each library path / graphile-worker and / pgbench and"
echo "the raw loop of its own cell (best over best):"
awk '{ if ($3 > best[$2]) best[$2] = $3 }
    END {
        g = best["graphile"]
        printf "%-10s %9s %9s %9s %9s %9s %9s\n", "path", "library", "graphile", "l/graph",
            "pgbench", "l/pgb", "l/raw"
        n = split("lease_h32 lease_d32 lease_all", k, " ")
        for (i = 1; i <= n; i++) if (k[i] in best) {
            p = best["pgbench_" k[i]]; r = best["raw_" k[i]]
            printf "%-10s %9.0f %9.0f %8.2fx %9.0f %8.2fx %8.2fx\n", k[i], best[k[i]], g,
                best[k[i]] / g, p, (p > 0 ? best[k[i]] / p : 0), (r > 0 ? best[k[i]] / r : 0)
        }
    }' "$RESULTS"
echo "lease_h32: plain ack(), durable; lease_d32: plain ack(), AckMode::Deferred; lease_all:"
echo "next_batch + ack_all (32, 32 and 4 handler threads; 4 claim workers, batch 100). pgbench:"
echo "the lease protocol by hand (benches/pgbench/pg-lease100.sql, 4 clients) run beside each"
echo "cell; raw: the library's own statements by hand in Rust (4 connections)."
