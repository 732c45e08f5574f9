-- The outbox projection database (one schema): per (projection, stream)
-- checkpoints, per stream watermarks and replay runs. Projection tables are
-- created by each projection's setup. Times are integer milliseconds since the
-- Unix epoch, by the database's clock.

-- Role marker and the test clock offset (the name carries the role, so a
-- journal and a projection store may share one schema).
CREATE TABLE outbox_projection_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- The exactly-once record. An apply locks its rows (SELECT ... FOR UPDATE)
-- and advances them by compare-and-set in the transaction of the projection's
-- writes.
CREATE TABLE outbox_checkpoints (
    projection   text   COLLATE "C" NOT NULL,
    stream       text   COLLATE "C" NOT NULL,
    last_applied bigint NOT NULL CHECK (last_applied >= 0),
    updated_at   bigint NOT NULL,
    PRIMARY KEY (projection, stream)
);

CREATE TABLE outbox_watermarks (
    stream          text   COLLATE "C" PRIMARY KEY,
    applied_through bigint NOT NULL CHECK (applied_through >= 0),
    updated_at      bigint NOT NULL
);

-- Replay and rebuild runs (the RunStore port).
CREATE TABLE outbox_runs (
    id               bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text    NOT NULL CHECK (kind IN ('catch_up', 'rebuild')),
    projection       text    COLLATE "C" NOT NULL,
    state            text    NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'cancelled')),
    until_position   bigint,
    processed        bigint  NOT NULL DEFAULT 0,
    last_stream      text    COLLATE "C",
    last_seq         bigint,
    error_code       text,
    error_message    text,
    cancel_requested boolean NOT NULL DEFAULT false,
    owner            text    COLLATE "C" NOT NULL,
    lease_expires_at bigint  NOT NULL,
    created_at       bigint  NOT NULL,
    updated_at       bigint  NOT NULL
);

-- At most one active run per projection, enforced by the database: of two
-- concurrent admissions (from any processes) exactly one inserts; the other
-- waits for it on this index and then sees it.
CREATE UNIQUE INDEX outbox_runs_active ON outbox_runs (projection) WHERE state IN ('queued', 'running');
