#!/usr/bin/env bash
# The peers in the project's benches, in one alternating run: the library's lease burn-down
# cells against River's Rust client (`riverqueue`), apalis (`apalis-postgres`), fang and awa,
# each through its own public API at its documented throughput settings, and graphile-worker
# (Node.js) beside them when node and npm are on PATH. All on the same PostgreSQL server.
#
#   benches/peer/rust-peers.sh                         # 3 rounds; 60,000 jobs (fang 20,000)
#   PEER_ROUNDS=2 PEER_PEERS="river apalis" benches/peer/rust-peers.sh
#
# Each round: one burn-down run of the library's lease cells, exactly as graphile.sh runs them
# (`cargo bench --bench burndown` with BURNDOWN_ROUNDS=1 BURNDOWN_JOBS=$PEER_JOBS: plain `ack`
# with 32 handlers durable (`lease_h32`) and with `AckMode::Deferred` (`lease_d32`), and
# `next_batch` + `ack_all` (`lease_all`)), then one run of each peer over the same number of
# no-op jobs: published untimed by the peer's own (bulk, where it has one) insert, then worked
# until the peer's own tables show every job finished. The best of each over the rounds and
# each library path / each peer are printed as one table at the end.
#
# The Rust peers are the scratch crates of benches/peer/rust/ (one package per peer, each with
# pinned versions and its own Cargo.lock, not part of the sqlbroker package): copied to a
# scratch folder (PEER_DIR, default $TMPDIR/sqlbroker-peer-rust) and built there with
# `cargo build --release` (target dir $PEER_DIR/target). A peer that does not build is left
# out with a SKIPPED line and its build log. Each run works in a database of its own on the
# server, `sqlbroker_peer_<peer>_<pid>`, created before and dropped after (see common.rs).
# graphile-worker is installed with npm into GRAPHILE_DIR (default
# $TMPDIR/sqlbroker-peer-graphile) as graphile.sh does, and run with graphile.sh's settings.
#
# Each peer's settings and why are in the header of its src/main.rs (and in BENCHMARKS.md);
# each can be overridden through the environment variables named there, which this script
# passes on. Here:
#   PEER_ROUNDS=3          rounds
#   PEER_JOBS=60000        jobs per run, library and peers
#   PEER_FANG_JOBS=20000   fang's jobs per run: its fetch sorts every waiting task (no index
#                          on its ORDER BY), so its rate falls as the table grows and 60,000
#                          takes over ten minutes a run here; its rate is at this count
#   PEER_PEERS="river apalis fang awa graphile"   which peers
#   FANG_MODE=blocking     fang's blocking queue (Diesel, threads); `async` is 10x slower here
# Server: SQLBROKER_PG_URL (default postgres://postgres@127.0.0.1:5432/test). Needs cargo (the
# peers' crates need Rust 1.95 for riverqueue), libpq (Debian: libpq-dev, for fang's
# Diesel migrations), and for graphile-worker node (20 or later) and npm.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${PEER_ROUNDS:-3}
JOBS=${PEER_JOBS:-60000}
FANG_JOBS=${PEER_FANG_JOBS:-20000}
PEERS=${PEER_PEERS:-river apalis fang awa graphile}
DIR=${PEER_DIR:-${TMPDIR:-/tmp}/sqlbroker-peer-rust}
GDIR=${GRAPHILE_DIR:-${TMPDIR:-/tmp}/sqlbroker-peer-graphile}
GVERSION=${GRAPHILE_VERSION:-0.18.0}
PG_URL=${SQLBROKER_PG_URL:-postgres://postgres@127.0.0.1:5432/test}
export FANG_MODE=${FANG_MODE:-blocking}

mkdir -p "$DIR/src"
# A fresh copy of the sources (the target dir is kept between runs).
rm -rf "$DIR/src"
cp -r benches/peer/rust "$DIR/src"

RUN=()
for peer in $PEERS; do
    case $peer in
    graphile)
        if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
            echo "SKIPPED: graphile-worker needs node and npm (not on PATH here)"
            continue
        fi
        mkdir -p "$GDIR"
        if [ "$(cd "$GDIR" && node -p "require('./node_modules/graphile-worker/package.json').version" 2>/dev/null)" != "$GVERSION" ]; then
            echo "installing graphile-worker@$GVERSION and pg into $GDIR"
            if ! (cd "$GDIR" && npm install --no-audit --no-fund --loglevel=error "graphile-worker@$GVERSION" pg >/dev/null); then
                echo "SKIPPED: graphile-worker did not install"
                continue
            fi
        fi
        cp benches/peer/graphile-run.mjs "$GDIR/"
        RUN+=(graphile)
        ;;
    river | apalis | fang | awa)
        echo "building the $peer peer in $DIR"
        log="$DIR/build-$peer.log"
        if (cd "$DIR/src/$peer" && CARGO_TARGET_DIR="$DIR/target" cargo build --release >"$log" 2>&1); then
            RUN+=("$peer")
        else
            echo "SKIPPED: the $peer peer did not build (last lines of $log):"
            tail -n 15 "$log" | sed 's/^/    /'
        fi
        ;;
    *) echo "unknown peer '$peer' (river apalis fang awa graphile)" >&2; exit 2 ;;
    esac
done

echo "building the burn-down bench"
cargo bench --bench burndown --no-run >/dev/null 2>&1 || cargo bench --bench burndown --no-run

CELLS="postgres/lease_h32/ postgres/lease_d32/ postgres/lease_all/"
RESULTS=$(mktemp)
SETTINGS=$(mktemp)
echo "- -" >"$SETTINGS" # (never empty: the summary reads it first)
trap 'rm -f "$RESULTS" "$SETTINGS"' EXIT
echo "peers: ${RUN[*]:-none}; $ROUNDS rounds; $JOBS jobs per run (fang $FANG_JOBS);" \
    "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    # Library cells: `<cell> <threads> <jobs> <library/s> <settle> <raw/s> ..`
    # shellcheck disable=SC2086
    BURNDOWN_ROUNDS=1 BURNDOWN_JOBS=$JOBS SQLBROKER_PG_URL=$PG_URL \
        cargo bench --bench burndown -- $CELLS 2>/dev/null |
        awk -v r="$round" '$1 ~ /^postgres\/lease_(h32|d32|all)\// {
            split($1, id, "/"); print r, id[2], $3, $4 }' | tee -a "$RESULTS"
    for peer in "${RUN[@]}"; do
        line=""
        case $peer in
        graphile)
            line=$(cd "$GDIR" && PEER_PG_URL=$PG_URL JOBS=$JOBS node graphile-run.mjs |
                awk -v c="${CONCURRENCY:-32}" '$1 == "graphile" { print $0, "concurrency=" c }') || true
            [ -n "$line" ] && line="$line,localQueue=${LOCAL_QUEUE:-2000},completeJobBatchDelay=${COMPLETE_DELAY:-10}ms"
            ;;
        fang) line=$(PEER_PG_URL=$PG_URL JOBS=$FANG_JOBS "$DIR/target/release/peer-$peer" | grep "^$peer ") || true ;;
        *) line=$(PEER_PG_URL=$PG_URL JOBS=$JOBS "$DIR/target/release/peer-$peer" | grep "^$peer ") || true ;;
        esac
        if [ -z "$line" ]; then
            echo "$round $peer: the run failed (left out of this round)"
            continue
        fi
        # `<peer> <jobs> <jobs/s> <settings>`
        echo "$line" | awk -v r="$round" '{ print r, $1, $2, $3 }' | tee -a "$RESULTS"
        echo "$line" | awk '{ print $1, $4 }' >>"$SETTINGS"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "best of $ROUNDS rounds, jobs/s; each library path / the peer (best over best):"
awk 'FNR == NR { if (!($1 in set)) set[$1] = $2; next }
    { if ($4 > best[$2]) { best[$2] = $4; jobs[$2] = $3 } }
    END {
        h = best["lease_h32"]; d = best["lease_d32"]; a = best["lease_all"]
        printf "%-10s %7s %9s %9s %9s %9s  %s\n", "peer", "jobs", "jobs/s", "h32/peer",
            "d32/peer", "all/peer", "settings"
        n = split("lease_h32 lease_d32 lease_all", k, " ")
        for (i = 1; i <= n; i++) if (k[i] in best)
            printf "%-10s %7d %9.0f %9s %9s %9s  %s\n", k[i], jobs[k[i]], best[k[i]], "", "", "",
                "the library"
        m = split("river apalis fang awa graphile", p, " ")
        for (i = 1; i <= m; i++) if (p[i] in best) {
            b = best[p[i]]
            printf "%-10s %7d %9.0f %8.2fx %8.2fx %8.2fx  %s\n", p[i], jobs[p[i]], b, h / b,
                d / b, a / b, set[p[i]]
        }
    }' "$SETTINGS" "$RESULTS"
echo "lease_h32: plain ack(), durable; lease_d32: plain ack(), AckMode::Deferred; lease_all:"
echo "next_batch + ack_all (32, 32 and 4 handler threads; 4 claim workers, batch 100)."
