-- Events a projection passed over (ADR 0032, `OnError::Skip`). A row is
-- written in the transaction that moves the projection's checkpoint past
-- the event, and deleted in the transaction that re-applies it: a skipped
-- event is listed until it is re-applied, and re-applied at most once (a
-- second re-apply waits on the row's lock, then deletes nothing).
-- Keyed by the projection's name (not a generation's storage name); a
-- reset of the projection deletes its rows.
CREATE TABLE outbox_skipped (
    projection text COLLATE "C" NOT NULL,
    stream     text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    error      text NOT NULL,
    skipped_at bigint NOT NULL,
    PRIMARY KEY (projection, stream, seq)
);
