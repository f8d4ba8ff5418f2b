// One run of pg-boss (the peer) for one cell of pgboss.sh, in a schema of its own
// (`pgboss_bench_<pid>`, created by pg-boss's start() and dropped at the end, also on failure).
// Each cell has two sides, run one after the other in this process, the feature's first (SWAP=1:
// plain first; pgboss.sh alternates it by round, as it alternates this process with the
// library's bench); each side has its own queue (`partition: true`, a table
// of its own, as each library side has its own table).
//
//   node pgboss-run.mjs group   # per-tenant limit: `JOBS` no-op jobs over 10 groups t0..t9,
//                               # worked with `groupConcurrency: GROUP_LIMIT`, then without it.
//                               # Prints `pgboss group <jobs> <jobs/s>` and `pgboss plain ..`.
//   node pgboss-run.mjs fanin   # fan-in: `JOBS` no-op jobs and one callback job that depends
//                               # on all of them (`flow()` + `dependsOn`), then the same jobs
//                               # without the callback. Prints
//                               # `pgboss flow <jobs> <jobs/s> <delay ms>` and
//                               # `pgboss fanplain <jobs> <jobs/s>`.
//
// Jobs are published untimed (insert() in chunks, or one flow() call). The clock starts just
// before work() and stops at the last job's `completed_on`; both are read from the server's
// clock, so pg-boss's completions (written after the handler returns) are inside the timing
// and its shutdown is not. The callback's delay is from the last of its parents'
// `completed_on` to the callback reaching the handler (this host's wall clock; the server is
// on the same host).
//
// Environment (pgboss.sh says why each value): PEER_PG_URL, JOBS (20000), GROUP_LIMIT (1000),
// TENANTS (10), BATCH_SIZE (1000), LOCAL_CONCURRENCY (4), POLL_SECONDS (0.5), BURST (1:
// burstWhenBatchFull), FLOW_SECONDS (1: flowIntervalSeconds), PARTITION (1), POOL_MAX (10),
// SWAP (0).
import { PgBoss } from "pg-boss";
import pg from "pg";

const env = (k, d) => (process.env[k] === undefined ? d : process.env[k]);
const cell = process.argv[2];
if (cell !== "group" && cell !== "fanin") {
  console.error("usage: node pgboss-run.mjs group|fanin");
  process.exit(2);
}
const connectionString = env("PEER_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
const jobs = Number(env("JOBS", "20000"));
const groupLimit = Number(env("GROUP_LIMIT", "1000"));
const tenants = Number(env("TENANTS", "10"));
const batchSize = Number(env("BATCH_SIZE", "1000"));
const localConcurrency = Number(env("LOCAL_CONCURRENCY", "4"));
const pollingIntervalSeconds = Number(env("POLL_SECONDS", "0.5"));
const burstWhenBatchFull = env("BURST", "1") === "1";
const flowIntervalSeconds = Number(env("FLOW_SECONDS", "1"));
const partition = env("PARTITION", "1") === "1";
const max = Number(env("POOL_MAX", "10"));
const swap = env("SWAP", "0") === "1";
const schema = `pgboss_bench_${process.pid}`;

const pool = new pg.Pool({ connectionString, max: 2 });
const boss = new PgBoss({
  connectionString,
  schema,
  max,
  // The flow resolver (fan-in) runs under supervise; cron is not used.
  supervise: true,
  schedule: false,
  flowIntervalSeconds,
});
boss.on("error", (e) => console.error("pg-boss error:", e.message ?? e));

const now = () => performance.timeOrigin + performance.now(); // wall clock, ms
const dbNow = async () =>
  Number((await pool.query("select extract(epoch from clock_timestamp()) * 1000 as t")).rows[0].t);
const workOptions = (extra) => ({
  batchSize,
  localConcurrency,
  pollingIntervalSeconds,
  burstWhenBatchFull,
  ...extra,
});

// The last `completed_on` (ms) and the count of completed jobs in `queue` (the callback aside).
async function finished(queue) {
  const { rows } = await pool.query(
    `select count(*)::int as n, extract(epoch from max(completed_on)) * 1000 as last
     from ${schema}.job where name = $1 and state = 'completed' and not (data ? 'callback')`,
    [queue],
  );
  return { n: rows[0].n, last: Number(rows[0].last) };
}

// Works `queue` until `total` jobs have been handled and `until()` holds (or, with `until`,
// 60 s after the `total`th job: a callback that never comes ends the run), then stops its
// workers, waiting for their completions. Returns the start (server clock, ms).
async function burn(queue, total, options, onJob, until) {
  let done = 0;
  let finish;
  let timer;
  const over = new Promise((r) => (finish = r));
  const started = await dbNow();
  await boss.work(queue, options, async (batch) => {
    for (const job of batch) onJob(job);
    done += batch.length;
    if (done >= total && (!until || until())) finish();
    else if (done >= total && until && !timer) timer = setTimeout(finish, 60_000);
  });
  await over;
  clearTimeout(timer);
  await boss.offWork(queue, { wait: true });
  return started;
}

async function publishGrouped(queue) {
  await boss.createQueue(queue, { partition });
  for (let i = 0; i < jobs; i += 1000) {
    const chunk = [];
    for (let j = i; j < Math.min(i + 1000, jobs); j++) {
      chunk.push({ data: { n: j }, group: { id: `t${j % tenants}` } });
    }
    await boss.insert(queue, chunk);
  }
}

async function groupSide(queue, limited) {
  await publishGrouped(queue);
  const started = await burn(
    queue,
    jobs,
    workOptions(limited ? { groupConcurrency: groupLimit } : {}),
    () => {},
  );
  const { n, last } = await finished(queue);
  if (n !== jobs) throw new Error(`${queue}: ${n} of ${jobs} jobs completed`);
  return jobs / ((last - started) / 1000);
}

async function faninSide(queue, callback) {
  await boss.createQueue(queue, { partition });
  if (callback) {
    const flow = [];
    for (let j = 0; j < jobs; j++) flow.push({ ref: `j${j}`, name: queue, data: { n: j } });
    flow.push({
      ref: "callback",
      name: queue,
      data: { callback: true },
      dependsOn: flow.map((f) => f.ref),
    });
    await boss.flow(flow);
  } else {
    for (let i = 0; i < jobs; i += 1000) {
      const chunk = [];
      for (let j = i; j < Math.min(i + 1000, jobs); j++) chunk.push({ data: { n: j } });
      await boss.insert(queue, chunk);
    }
  }
  let cbAt;
  const started = await burn(
    queue,
    jobs,
    workOptions({}),
    (job) => {
      if (job.data?.callback) cbAt = now();
    },
    callback ? () => cbAt !== undefined : undefined,
  );
  const { n, last } = await finished(queue);
  if (n !== jobs) throw new Error(`${queue}: ${n} of ${jobs} jobs completed`);
  const rate = jobs / ((last - started) / 1000);
  return { rate, delay: cbAt === undefined ? undefined : cbAt - last };
}

// Stopped by a signal (a timeout, ^C): the schema is dropped all the same.
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.once(signal, async () => {
    console.error(`pgboss-run ${cell}: ${signal}, dropping ${schema}`);
    await boss.stop({ graceful: false, timeout: 2000 }).catch(() => {});
    await pool.query(`drop schema if exists ${schema} cascade`).catch(() => {});
    process.exit(130);
  });
}

let failed = false;
try {
  await boss.start();
  if (cell === "group") {
    let limited, plain;
    if (swap) {
      plain = await groupSide("plain", false);
      limited = await groupSide("grouped", true);
    } else {
      limited = await groupSide("grouped", true);
      plain = await groupSide("plain", false);
    }
    console.log(`pgboss group ${jobs} ${limited.toFixed(0)}`);
    console.log(`pgboss plain ${jobs} ${plain.toFixed(0)}`);
  } else {
    let flow, plain;
    if (swap) {
      plain = await faninSide("fanplain", false);
      flow = await faninSide("fanin", true);
    } else {
      flow = await faninSide("fanin", true);
      plain = await faninSide("fanplain", false);
    }
    const { rate, delay } = flow;
    if (delay === undefined) throw new Error("the callback did not run within 60 s");
    console.log(`pgboss flow ${jobs} ${rate.toFixed(0)} ${delay.toFixed(1)}`);
    console.log(`pgboss fanplain ${jobs} ${plain.rate.toFixed(0)}`);
  }
} catch (e) {
  failed = true;
  console.error(`pgboss-run ${cell}: ${e.stack ?? e}`);
} finally {
  await boss.stop({ graceful: false, timeout: 5000 }).catch(() => {});
  await pool.query(`drop schema if exists ${schema} cascade`).catch(() => {});
  await pool.end();
}
process.exit(failed ? 1 : 0);
