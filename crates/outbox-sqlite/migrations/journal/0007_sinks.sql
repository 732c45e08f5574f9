-- Sinks (ADR 0023): publishers beside the projections. A sink reads the
-- journal by global position; per (sink, stream) it keeps the last seq
-- delivered (or passed over by its policy) with the failure state of the
-- next one, and per (sink, partition) how far it has scanned.

CREATE TABLE outbox_sink_streams (
    sink            TEXT    NOT NULL,
    stream          TEXT    NOT NULL,
    partition_no    INTEGER NOT NULL,
    seq             INTEGER NOT NULL CHECK (seq >= 0),
    status          TEXT    NOT NULL CHECK (status IN ('ok', 'failed', 'dead')),
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (sink, stream)
) WITHOUT ROWID;

-- The retries: failed streams by partition and due time.
CREATE INDEX outbox_sink_failed ON outbox_sink_streams (sink, partition_no, next_attempt_at)
    WHERE status = 'failed';

CREATE TABLE outbox_sink_cursors (
    sink         TEXT    NOT NULL,
    partition_no INTEGER NOT NULL,
    position     INTEGER NOT NULL,
    PRIMARY KEY (sink, partition_no)
) WITHOUT ROWID;
