-- Partitions (ADR 0022). Every outbox row and every stream's head carries
-- its stream's partition, computed at append by the journal's partitioner;
-- the count and the partitioner's name live in outbox_journal_meta
-- ('partitions', 'partitioner'), written when the journal is first opened by
-- a build that knows partitions (rows enqueued before then are given their
-- partitions in the same transaction). Workers lease whole partitions and
-- claim the due heads inside them: an index seek per partition on
-- outbox_heads_by_partition.

ALTER TABLE outbox ADD COLUMN partition_no integer NOT NULL DEFAULT 0;

ALTER TABLE outbox_heads ADD COLUMN partition_no integer NOT NULL DEFAULT 0;

CREATE INDEX outbox_heads_by_partition ON outbox_heads (partition_no, due_at, stream)
    WHERE due_at IS NOT NULL;

-- One row per partition ever leased; never deleted, so epochs never
-- decrease; a released lease has no owner.
CREATE TABLE outbox_partition_leases (
    partition_no integer PRIMARY KEY,
    owner        text    COLLATE "C",
    epoch        bigint  NOT NULL,
    expires_at   bigint  NOT NULL
);
