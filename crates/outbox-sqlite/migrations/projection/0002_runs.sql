-- Replay and rebuild runs (catch-up and rebuild jobs), persisted so that any
-- process can list them, cancel them and refuse a second run on the same
-- projection. Times are integer milliseconds since the Unix epoch, by SQLite's clock.

CREATE TABLE outbox_runs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    kind             TEXT    NOT NULL CHECK (kind IN ('catch_up', 'rebuild')),
    projection       TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    until_position   INTEGER,
    processed        INTEGER NOT NULL DEFAULT 0,
    last_stream      TEXT,
    last_seq         INTEGER,
    error_code       TEXT,
    error_message    TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    owner            TEXT    NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- At most a handful of active runs: admission seeks them by projection.
CREATE INDEX outbox_runs_active ON outbox_runs (projection) WHERE state IN ('queued', 'running');
