-- Generations of view projections (ADR 0021). One row per projection that
-- ever had a second generation; without a row, generation 1 (stored under
-- the projection's own name) is live. live_storage is where the live
-- generation's documents, checkpoints and running digest are kept
-- (`name` for generation 1, `name@g<n>` after). epoch rises with every
-- swap: an apply's checkpoint compare-and-set holds only while the epoch it
-- resolved at its start is still the row's. building: the generation being
-- built (NULL when none), its code version and how far it has read the
-- journal (global position). last_generation: the highest number given out.
CREATE TABLE outbox_generations (
    projection        TEXT NOT NULL PRIMARY KEY,
    live              INTEGER NOT NULL,
    live_storage      TEXT NOT NULL,
    live_version      INTEGER NOT NULL,
    epoch             INTEGER NOT NULL,
    building          INTEGER,
    building_version  INTEGER,
    building_position INTEGER NOT NULL DEFAULT 0,
    last_generation   INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
) WITHOUT ROWID;
