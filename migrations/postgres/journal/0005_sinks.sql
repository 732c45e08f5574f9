-- Sinks (ADR 0023): publishers beside the projections. A sink reads the
-- journal by global position; per (sink, stream) it keeps the last seq
-- delivered (or passed over by its policy) with the failure state of the
-- next one, and per (sink, partition) how far it has scanned.

CREATE TABLE outbox_sink_streams (
    sink            text    COLLATE "C" NOT NULL,
    stream          text    COLLATE "C" NOT NULL,
    partition_no    integer NOT NULL,
    seq             bigint  NOT NULL CHECK (seq >= 0),
    status          text    NOT NULL CHECK (status IN ('ok', 'failed', 'dead')),
    attempt_count   integer NOT NULL DEFAULT 0,
    next_attempt_at bigint  NOT NULL,
    last_error      text,
    updated_at      bigint  NOT NULL,
    PRIMARY KEY (sink, stream)
);

-- The retries: failed streams by partition and due time.
CREATE INDEX outbox_sink_failed ON outbox_sink_streams (sink, partition_no, next_attempt_at)
    WHERE status = 'failed';

CREATE TABLE outbox_sink_cursors (
    sink         text    COLLATE "C" NOT NULL,
    partition_no integer NOT NULL,
    position     bigint  NOT NULL,
    PRIMARY KEY (sink, partition_no)
);
