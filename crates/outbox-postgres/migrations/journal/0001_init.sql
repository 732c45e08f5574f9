-- The outbox journal database (one schema): events, stream versions, outbox
-- rows, outbox heads (one per stream with rows), stream leases and worker
-- heartbeats. Times are integer milliseconds since the Unix epoch, by the
-- database's clock. Identifiers use the "C" collation so that ordering by
-- stream id is byte order, the same as every other adapter.

-- Role marker and the test clock offset. The table name carries the role, so
-- a journal and a projection store may share one schema.
CREATE TABLE outbox_journal_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE events (
    global_position bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream          text    COLLATE "C" NOT NULL,
    seq             bigint  NOT NULL CHECK (seq >= 1),
    event_type      text    NOT NULL,
    intent          text    NOT NULL CHECK (intent IN ('apply', 'audit_only')),
    payload         bytea   NOT NULL,
    payload_hash    bytea   NOT NULL,
    recorded_at     bigint  NOT NULL,
    correlation_id  text,
    causation_id    text,
    UNIQUE (stream, seq)
);

-- The stream version: the expected-version check, stream_heads paging, and
-- the per-stream lock every transaction that changes a stream's outbox rows
-- takes first (SELECT ... FOR NO KEY UPDATE), so the head row below is never
-- computed from a stale snapshot.
CREATE TABLE streams (
    stream text   COLLATE "C" PRIMARY KEY,
    head   bigint NOT NULL CHECK (head >= 0)
);

CREATE TABLE outbox (
    stream          text    COLLATE "C" NOT NULL,
    seq             bigint  NOT NULL,
    event_type      text    NOT NULL,
    status          text    NOT NULL CHECK (status IN ('pending', 'processing', 'failed', 'dead')),
    attempt_count   integer NOT NULL DEFAULT 0,
    next_attempt_at bigint  NOT NULL,
    last_error      text,
    updated_at      bigint  NOT NULL,
    PRIMARY KEY (stream, seq)
);

-- list(status) / requeue_dead / summary order.
CREATE INDEX outbox_by_status ON outbox (status, next_attempt_at, stream, seq);

-- The few rows being processed, per stream: abandon seeks them.
CREATE INDEX outbox_processing ON outbox (stream, seq) WHERE status = 'processing';

-- One row per stream that has outbox rows: its head (lowest outstanding seq)
-- and when the head is due (NULL while the head is dead). Maintained in the
-- same transaction as every change to the stream's rows, so due_streams is an
-- index seek on due_at whatever the backlog.
CREATE TABLE outbox_heads (
    stream   text   COLLATE "C" PRIMARY KEY,
    head_seq bigint NOT NULL,
    due_at   bigint
);

CREATE INDEX outbox_heads_by_due ON outbox_heads (due_at, stream) WHERE due_at IS NOT NULL;

-- Never deleted, so epochs never decrease; a released lease has no owner.
CREATE TABLE stream_leases (
    stream     text   COLLATE "C" PRIMARY KEY,
    owner      text   COLLATE "C",
    epoch      bigint NOT NULL,
    expires_at bigint NOT NULL
);

-- Worker heartbeats (the WorkerRegistry port); mode is Mode::as_str().
CREATE TABLE outbox_workers (
    id         text   COLLATE "C" PRIMARY KEY,
    host       text   NOT NULL,
    pid        bigint NOT NULL,
    mode       text   NOT NULL,
    started_at bigint NOT NULL,
    last_beat  bigint NOT NULL,
    expires_at bigint NOT NULL
);
