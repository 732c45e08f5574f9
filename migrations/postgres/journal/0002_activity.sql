-- What the workers did, per minute (the WorkerRegistry port's activity):
-- events applied, failures recorded and rows dead-lettered, one row per
-- (minute, worker) so concurrent workers never contend for one row. minute
-- is the start of the minute in integer milliseconds since the Unix epoch,
-- by the database's clock. The monitor sums the last hour; `prune` deletes
-- old minutes.

CREATE TABLE outbox_activity (
    minute  bigint NOT NULL,
    worker  text   COLLATE "C" NOT NULL,
    applied bigint NOT NULL DEFAULT 0,
    failed  bigint NOT NULL DEFAULT 0,
    dead    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, worker)
);
