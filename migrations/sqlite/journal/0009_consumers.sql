-- Consumers the database knows (ADR 0032): every projection and sink a
-- deployment runs, registered by its workers at start and every heartbeat.
-- A worker that does not run a registered projection leaves it a consumer
-- state for the work it completes; a consumer no worker has registered
-- lately has no live worker.

CREATE TABLE outbox_consumers (
    consumer    TEXT    NOT NULL PRIMARY KEY,
    kind        TEXT    NOT NULL CHECK (kind IN ('projection', 'sink')),
    version     TEXT    NOT NULL,
    first_seen  INTEGER NOT NULL,
    last_seen   INTEGER NOT NULL,
    last_worker TEXT    NOT NULL,
    -- Paused by an operator or its error policy (`stop`): no worker applies
    -- it; every worker leaves it a state on each stream it completes.
    paused      INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1))
) WITHOUT ROWID;
