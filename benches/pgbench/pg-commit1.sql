-- One row, one commit: a claim and its delete in one statement, committed alone. No per-job
-- durable ack can do less (a durable ack of one row is at least one commit); run from as many
-- clients as handler threads, it measures the bound "commit latency x handlers".
DELETE FROM jobs WHERE id = (SELECT id FROM jobs WHERE run_at <= now() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED);
