-- Rows applied alone (ADR 0029): a claim that held the row ended without a
-- result before anything showed which row was at fault, so the row is claimed
-- by itself from then on (1), and an attempt of its own that begins (2, set
-- right before its apply) and never ends is charged to it by the next claim.
-- Cleared by a requeue.

ALTER TABLE outbox ADD COLUMN alone smallint NOT NULL DEFAULT 0;
