-- Worker heartbeats (the WorkerRegistry port): who is working, on which host
-- and in which mode. An entry ages out at expires_at unless beaten again.
-- Times are integer milliseconds since the Unix epoch, by SQLite's clock;
-- mode is Mode::as_str().

CREATE TABLE outbox_workers (
    id         TEXT    PRIMARY KEY,
    host       TEXT    NOT NULL,
    pid        INTEGER NOT NULL,
    mode       TEXT    NOT NULL,
    started_at INTEGER NOT NULL,
    last_beat  INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
