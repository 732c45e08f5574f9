-- The outbox projection database: per (projection, stream) checkpoints and
-- per stream watermarks. Projection tables are created by each projection's
-- setup. Times are integer milliseconds since the Unix epoch, by SQLite's clock.

CREATE TABLE outbox_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE outbox_checkpoints (
    projection   TEXT    NOT NULL,
    stream       TEXT    NOT NULL,
    last_applied INTEGER NOT NULL CHECK (last_applied >= 0),
    updated_at   INTEGER NOT NULL,
    PRIMARY KEY (projection, stream)
) WITHOUT ROWID;

CREATE TABLE outbox_watermarks (
    stream          TEXT    PRIMARY KEY,
    applied_through INTEGER NOT NULL CHECK (applied_through >= 0),
    updated_at      INTEGER NOT NULL
) WITHOUT ROWID;
