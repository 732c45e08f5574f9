-- Running digests of backend-neutral projections (ADR 0019): per
-- projection, the sum modulo 2^32, lane by lane, of the SHA-256 (as eight
-- 32-bit lanes d0..d7) of every document of outbox_views, and their count.
-- Every apply transaction that changes documents adds its change here before
-- it commits (the row lock orders concurrent applies), so `outbox report`
-- shows it without a scan; `outbox verify` recomputes it. No row: no
-- documents. NULL lanes: the documents predate running digests (rows made by
-- this migration); a rebuild starts one. last_stream/last_seq: the event
-- whose apply last changed the documents.
CREATE TABLE outbox_view_digests (
    projection  text COLLATE "C" PRIMARY KEY,
    d0          bigint,
    d1          bigint,
    d2          bigint,
    d3          bigint,
    d4          bigint,
    d5          bigint,
    d6          bigint,
    d7          bigint,
    documents   bigint NOT NULL,
    last_stream text COLLATE "C",
    last_seq    bigint,
    updated_at  bigint
);

INSERT INTO outbox_view_digests (projection, documents)
SELECT projection, count(*) FROM outbox_views GROUP BY projection;
