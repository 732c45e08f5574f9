-- Sinks read the journal in the order its events became visible (ADR 0030):
-- a global position is taken before its transaction commits, so an event can
-- become visible after a later position was read. Each event records the id
-- of the transaction that wrote it; a sink's scan cursor is a transaction id,
-- and a scan never reads past the oldest transaction still open.
--
-- Events written before this migration get the id 1 (below every real
-- transaction id). A cursor that had scanned every one of them moves to 1;
-- any other cursor restarts at 0 and scans them again (a sink's per-stream
-- checkpoints keep that from publishing anything twice).

ALTER TABLE events ADD COLUMN txid xid8 NOT NULL DEFAULT '1';
ALTER TABLE events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

CREATE INDEX events_by_txid ON events (txid, global_position);

UPDATE outbox_sink_cursors
SET position = CASE
    WHEN position >= (SELECT coalesce(max(global_position), 0) FROM events) THEN 1
    ELSE 0
END;
