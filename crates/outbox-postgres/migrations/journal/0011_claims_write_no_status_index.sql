-- Appends, claims and abandons write no index entry of the rows' status
-- (ADR 0041; the SQLite journal made the same change in its migrations
-- 0003 and 0011).
--
-- Every appended row took an entry in the index led by its status, every
-- claim moved that entry (pending to processing) and added one to the
-- partial index of processing rows, and every completion left both behind
-- for vacuum: two more index writes per row on the hot path, for readers
-- that are inspection. Only failed and dead rows keep an index by due time
-- (few, and read in that order: retries, requeue_dead, listings); an
-- abandon finds a stream's processing rows by its key, before its first
-- pending row; counts and listings of pending or processing rows scan.
DROP INDEX outbox_by_status;
DROP INDEX outbox_processing;
CREATE INDEX outbox_failed ON outbox (next_attempt_at, stream, seq) WHERE status = 'failed';
CREATE INDEX outbox_dead ON outbox (next_attempt_at, stream, seq) WHERE status = 'dead';
