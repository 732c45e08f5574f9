-- Sinks read the journal in the order its events became visible (ADR 0030):
-- a global position is taken before its transaction commits, so an event can
-- become visible after a later position was read. Each event records the id
-- of the transaction that wrote it; a sink's scan cursor is such a key, and a
-- scan never reads past the oldest transaction still open.

ALTER TABLE events ADD COLUMN txid xid8;

-- Events written before this migration get keys below this transaction's
-- id, in global-position order, spread over that range: every one of them
-- was written by a transaction that began before this one, so a key holds
-- no more events than such a transaction wrote on average, and a page (which
-- never splits a key) stays small.
WITH bounds AS (
    SELECT min(global_position) AS lo, max(global_position) AS hi,
           pg_current_xact_id()::text::bigint AS x
    FROM events
)
UPDATE events e
SET txid = (1 + ((e.global_position - b.lo) * greatest(b.x - 2, 1)) / (b.hi - b.lo + 1))::text::xid8
FROM bounds b;

-- Each scan cursor moves to the key of its position less one (the events
-- sharing that key are read again; a sink's per-stream checkpoints keep that
-- from publishing anything twice), and never above the oldest transaction
-- open now, which may still write events with a lower id than this one.
WITH bounds AS (
    SELECT min(global_position) AS lo, max(global_position) AS hi,
           pg_current_xact_id()::text::bigint AS x,
           pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS horizon
    FROM events
)
UPDATE outbox_sink_cursors c
SET position = CASE
    WHEN b.lo IS NULL OR c.position < b.lo THEN 0
    ELSE least(
        (1 + ((least(c.position, b.hi) - b.lo) * greatest(b.x - 2, 1)) / (b.hi - b.lo + 1))
            - CASE WHEN c.position >= b.hi THEN 0 ELSE 1 END,
        b.horizon - 1)
END
FROM bounds b;

ALTER TABLE events ALTER COLUMN txid SET DEFAULT pg_current_xact_id();
ALTER TABLE events ALTER COLUMN txid SET NOT NULL;

CREATE INDEX events_by_txid ON events (txid, global_position);
