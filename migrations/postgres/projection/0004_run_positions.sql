-- Replay runs walk the journal in global-position order (ADR 0020):
-- since_position is a catch-up's lower bound (events at or before it are
-- taken as already reflected), cursor_position the global position the run
-- has committed through (NULL before its first committed page).
ALTER TABLE outbox_runs
    ADD COLUMN since_position  bigint,
    ADD COLUMN cursor_position bigint;
