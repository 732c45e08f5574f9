-- Claims flip rows between 'pending' and 'processing', and abandons flip
-- them back. An index led by status and ordered by due time put each flip
-- on a random page of a large backlog: two index writes per claimed row, so
-- a claim cost more the larger the backlog. Only failed and dead rows (few,
-- and looked up by due time: retries, requeue_dead, listings) keep such an
-- index now; counts and listings of pending or processing rows scan the
-- table, which is inspection, not the hot path.
DROP INDEX outbox_by_status;

CREATE INDEX outbox_failed ON outbox (next_attempt_at, stream, seq) WHERE status = 'failed';

CREATE INDEX outbox_dead ON outbox (next_attempt_at, stream, seq) WHERE status = 'dead';
