-- The outbox journal database: events, stream versions, outbox rows, outbox
-- heads (one per stream with rows) and stream leases. Times are integer
-- milliseconds since the Unix epoch, by SQLite's clock.

CREATE TABLE outbox_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE events (
    global_position INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT    NOT NULL,
    seq             INTEGER NOT NULL CHECK (seq >= 1),
    event_type      TEXT    NOT NULL,
    intent          TEXT    NOT NULL CHECK (intent IN ('apply', 'audit_only')),
    payload         BLOB    NOT NULL,
    payload_hash    BLOB    NOT NULL,
    recorded_at     INTEGER NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    UNIQUE (stream, seq)
);

-- The stream version: the expected-version check and stream_heads paging.
CREATE TABLE streams (
    stream TEXT    PRIMARY KEY,
    head   INTEGER NOT NULL CHECK (head >= 1)
) WITHOUT ROWID;

CREATE TABLE outbox (
    stream          TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    event_type      TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('pending', 'processing', 'failed', 'dead')),
    attempt_count   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;

-- list(status) / requeue_dead / summary order.
CREATE INDEX outbox_by_status ON outbox (status, next_attempt_at, stream, seq);

-- The few rows being processed, per stream: abandon seeks them instead of
-- walking a stream's whole backlog.
CREATE INDEX outbox_processing ON outbox (stream, seq) WHERE status = 'processing';

-- One row per stream that has outbox rows: its head (lowest outstanding
-- seq) and when the head is due (NULL while the head is dead). Maintained in
-- the same transaction as every change to the stream's rows, so due_streams
-- is an index seek on due_at whatever the backlog.
CREATE TABLE outbox_heads (
    stream   TEXT    PRIMARY KEY,
    head_seq INTEGER NOT NULL,
    due_at   INTEGER
) WITHOUT ROWID;

CREATE INDEX outbox_heads_by_due ON outbox_heads (due_at, stream) WHERE due_at IS NOT NULL;

-- Never deleted, so epochs never decrease; a released lease has no owner.
CREATE TABLE stream_leases (
    stream     TEXT    PRIMARY KEY,
    owner      TEXT,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
