-- The lease protocol by hand, batched, from a claim cursor: each client claims past the
-- largest id it claimed (:last), from the head again when a claim finds fewer than 100 rows
-- and every 100th transaction (rows left behind the cursor: expired leases, late commits).
-- Run with -D last=0 -D n=0 (backlog.sh does).
\set n :n + 1
\if :n % 100 = 0
\set last 0
\endif
WITH c AS (UPDATE jobs SET locked_until = now() + interval '30 seconds', attempt = attempt + 1
            WHERE id IN (SELECT id FROM jobs WHERE id > :last AND run_at <= now()
                         AND (locked_until IS NULL OR locked_until < now())
                         ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
            RETURNING id, locked_until)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(min(locked_until), now()) AS token,
       count(*) AS got, coalesce(max(id), 0) AS top FROM c \gset
\if :got < 100
\set last 0
\else
\set last :top
\endif
DELETE FROM jobs WHERE id = ANY(':ids'::bigint[]) AND locked_until = ':token'::timestamptz;
