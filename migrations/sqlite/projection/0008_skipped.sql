-- Events a projection passed over (ADR 0032, `OnError::Skip`). A row is
-- written in the transaction that moves the projection's checkpoint past
-- the event, and deleted in the transaction that re-applies it: a skipped
-- event is listed until it is re-applied, and re-applied at most once.
-- Keyed by the projection's name (not a generation's storage name); a
-- reset of the projection deletes its rows.
CREATE TABLE outbox_skipped (
    projection TEXT NOT NULL,
    stream     TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    error      TEXT NOT NULL,
    skipped_at INTEGER NOT NULL,
    PRIMARY KEY (projection, stream, seq)
) WITHOUT ROWID;
