-- Rows applied alone (ADR 0029): a claim that held the row ended without a
-- result before anything showed which row was at fault, so the row is claimed
-- by itself from then on (1), and an attempt of its own that begins (2, set
-- right before its apply) and never ends is charged to it by the next claim.
-- Cleared by a requeue.

ALTER TABLE outbox ADD COLUMN alone smallint NOT NULL DEFAULT 0;

-- Attempts that ended without a result were counted by the claim before this
-- migration; such a row's message now says it was recorded, so that no claim
-- after it reports (and counts) the same attempt again.
UPDATE outbox
SET last_error = 'the apply ended without a result: its worker crashed, was killed or stalled past its lease while applying this row alone'
WHERE last_error = 'a worker claimed this row and stopped before finishing it (crashed, killed or stalled past its lease)';
