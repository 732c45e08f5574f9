-- Running digests of backend-neutral projections (ADR 0019): per
-- projection, the sum modulo 2^32, lane by lane, of the SHA-256 (as eight
-- 32-bit lanes d0..d7) of every document of outbox_views, and their count.
-- Every apply transaction that changes documents adds its change here before
-- it commits, so `outbox report` shows it without a scan; `outbox verify`
-- recomputes it. No row: no documents. NULL lanes: the documents predate
-- running digests (rows made by this migration); a rebuild starts one.
-- last_stream/last_seq: the event whose apply last changed the documents.
CREATE TABLE outbox_view_digests (
    projection  TEXT NOT NULL PRIMARY KEY,
    d0          INTEGER,
    d1          INTEGER,
    d2          INTEGER,
    d3          INTEGER,
    d4          INTEGER,
    d5          INTEGER,
    d6          INTEGER,
    d7          INTEGER,
    documents   INTEGER NOT NULL,
    last_stream TEXT,
    last_seq    INTEGER,
    updated_at  INTEGER
) WITHOUT ROWID;

INSERT INTO outbox_view_digests (projection, documents)
SELECT projection, count(*) FROM outbox_views GROUP BY projection;
