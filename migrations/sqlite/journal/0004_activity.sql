-- What the workers did, per minute (the WorkerRegistry port's activity):
-- events applied, failures recorded and rows dead-lettered, one row per
-- (minute, worker) so workers never write the same row. minute is the start
-- of the minute in integer milliseconds since the Unix epoch, by SQLite's
-- clock. The monitor sums the last hour; `prune` deletes old minutes.

CREATE TABLE outbox_activity (
    minute  INTEGER NOT NULL,
    worker  TEXT    NOT NULL,
    applied INTEGER NOT NULL DEFAULT 0,
    failed  INTEGER NOT NULL DEFAULT 0,
    dead    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, worker)
) WITHOUT ROWID;
