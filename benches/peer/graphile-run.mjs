// One timed burn-down of graphile-worker (the peer): `JOBS` jobs queued in a schema of their
// own, then worked by one worker process with its tuned settings until every job is done and
// the worker stopped (its batched completions written). Prints `graphile <jobs> <jobs/s>`.
//
// Environment: PEER_PG_URL, JOBS (default 60000), CONCURRENCY (32), LOCAL_QUEUE (2000),
// COMPLETE_DELAY (10 ms of completions batched; -1 turns batching off), POLL_MS (2000).
import { Logger, run, runMigrations } from "graphile-worker";
import pg from "pg";

const env = (k, d) => (process.env[k] === undefined ? d : process.env[k]);
const connectionString = env("PEER_PG_URL", "postgres://postgres@127.0.0.1:5432/test");
const jobs = Number(env("JOBS", "60000"));
const concurrency = Number(env("CONCURRENCY", "32"));
const localQueue = Number(env("LOCAL_QUEUE", "2000"));
const completeDelay = Number(env("COMPLETE_DELAY", "10"));
const pollInterval = Number(env("POLL_MS", "2000"));
const schema = `sqlbroker_peer_${process.pid}`;

const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});
const preset = {
  worker: {
    connectionString,
    schema,
    concurrentJobs: concurrency,
    maxPoolSize: concurrency + 2,
    pollInterval,
    localQueue: localQueue > 1 ? { size: localQueue } : undefined,
    completeJobBatchDelay: completeDelay,
    failJobBatchDelay: completeDelay,
    preparedStatements: true,
    logger,
  },
};

const pool = new pg.Pool({ connectionString, max: 2 });
let runner;
try {
  await runMigrations({ preset });
  // Queued untimed, in one statement (as the library's side publishes before its clock).
  await pool.query(
    `select ${schema}.add_jobs(array(
       select json_populate_record(null::${schema}.job_spec,
              json_build_object('identifier', 'job', 'payload', '{}'::json))
       from generate_series(1, $1)))`,
    [jobs],
  );
  let done = 0;
  let finish;
  const finished = new Promise((r) => (finish = r));
  const started = process.hrtime.bigint();
  runner = await run({
    preset,
    noHandleSignals: true,
    // Errors only: a log line per job would be most of the peer's work.
    logger,
    taskList: {
      job: async () => {
        done += 1;
        if (done === jobs) finish();
      },
    },
  });
  await finished;
  // Batched completions are written by the stop.
  await runner.stop();
  runner = undefined;
  const secs = Number(process.hrtime.bigint() - started) / 1e9;
  const left = await pool.query(`select count(*)::int as n from ${schema}._private_jobs`);
  if (left.rows[0].n !== 0) throw new Error(`${left.rows[0].n} jobs left after the run`);
  console.log(`graphile ${jobs} ${(jobs / secs).toFixed(0)}`);
} finally {
  if (runner) await runner.stop().catch(() => {});
  await pool.query(`drop schema if exists ${schema} cascade`).catch(() => {});
  await pool.end();
}
