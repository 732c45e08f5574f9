-- Generations of view projections (ADR 0021). One row per projection that
-- ever had a second generation; without a row, generation 1 (stored under
-- the projection's own name) is live. live_storage is where the live
-- generation's documents, checkpoints and running digest are kept
-- (`name` for generation 1, `name@g<n>` after). epoch rises with every
-- swap: an apply's checkpoint compare-and-set holds (and share-locks this
-- row) only while the epoch it resolved at its start is still the row's; a
-- swap locks the row for update. building: the generation being built
-- (NULL when none), its code version and how far it has read the journal
-- (global position). last_generation: the highest number given out.
CREATE TABLE outbox_generations (
    projection        text COLLATE "C" PRIMARY KEY,
    live              integer NOT NULL,
    live_storage      text COLLATE "C" NOT NULL,
    live_version      integer NOT NULL,
    epoch             bigint NOT NULL,
    building          integer,
    building_version  integer,
    building_position bigint NOT NULL DEFAULT 0,
    last_generation   integer NOT NULL,
    updated_at        bigint NOT NULL
);
