-- When a row first failed (a recorded failure or an unfinished attempt),
-- kept through its retries and cleared by a requeue, so the monitor shows how
-- long a blocked stream has been failing. Rows already failed or dead when
-- this migration runs get their last failure time (a lower bound).

ALTER TABLE outbox ADD COLUMN first_failed_at INTEGER;

UPDATE outbox SET first_failed_at = updated_at WHERE status IN ('failed', 'dead');
