-- The journal clock's offset (ADR 0006, amended 2026-11-28): 0 in every
-- production schema, as an IMMUTABLE SQL function the planner inlines and
-- folds to a constant, so no statement reads the meta table for it. Only a
-- store opened with the test clock (feature `test-util`) replaces it, in its
-- own test schema, by one that reads the offset tests store in
-- outbox_journal_meta.
CREATE FUNCTION outbox_journal_clock_offset_ms() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 0::bigint';

-- The append (0008) reads the clock through it. Unchanged otherwise.
CREATE OR REPLACE FUNCTION outbox_append(
    s text[], k bigint[], t text[], i text[], p bytea[], h bytea[], c text[], ca text[],
    names text[], counts bigint[], expected bigint[], parts integer[],
    enqueue boolean, channel text, max_seq bigint)
RETURNS TABLE (out_stream text, out_seq bigint, out_position bigint, out_at bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    locked integer;
    heads bigint[];
    now_ms bigint;
BEGIN
    -- Lock the version rows in stream order (the column's "C" collation, as
    -- every writer locks them); create missing ones at 0 in the same order
    -- (a concurrent creator makes this wait for its commit, then do
    -- nothing) and lock those.
    SELECT count(*) INTO locked FROM (
        SELECT 1 FROM streams v WHERE v.stream = ANY (names) ORDER BY v.stream FOR NO KEY UPDATE) l;
    IF locked < cardinality(names) THEN
        INSERT INTO streams (stream, head)
        SELECT u.n, 0 FROM unnest(names) AS u(n) ORDER BY u.n COLLATE "C"
        ON CONFLICT (stream) DO NOTHING;
        PERFORM 1 FROM streams v WHERE v.stream = ANY (names) ORDER BY v.stream FOR NO KEY UPDATE;
    END IF;
    -- A fresh snapshot: the versions as the locks left them.
    SELECT array_agg(v.head ORDER BY u.o) INTO heads
    FROM unnest(names) WITH ORDINALITY AS u(n, o) JOIN streams v ON v.stream = u.n;
    IF EXISTS (
        SELECT 1 FROM unnest(heads, expected, counts) AS x(hd, ex, n)
        WHERE (x.ex IS NOT NULL AND x.hd <> x.ex) OR x.hd > max_seq - x.n) THEN
        RETURN QUERY SELECT u.n, u.hd, NULL::bigint, NULL::bigint FROM unnest(names, heads) AS u(n, hd);
        RETURN;
    END IF;
    -- The journal clock, read after the locks (so a stream's events are
    -- recorded in seq order).
    now_ms := floor(extract(epoch from clock_timestamp()) * 1000)::bigint
          + outbox_journal_clock_offset_ms();
    -- Events, outbox rows, heads and versions in one statement. A head row
    -- is inserted only for a stream that has none in this statement's
    -- snapshot: every writer that inserts or deletes head rows holds the
    -- stream's lock, so a head seen is a head that stays, and a head row a
    -- claim is holding (an uncommitted UPDATE) is not waited for, as an ON
    -- CONFLICT check would.
    RETURN QUERY
    WITH x AS (SELECT * FROM unnest(names, heads, counts, parts) AS x(n, hd, cnt, pn)),
    e AS (
        INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at,
                            correlation_id, causation_id)
        SELECT u.s, x.hd + u.k, u.t, u.i, u.p, u.h, now_ms, u.c, u.ca
        FROM unnest(s, k, t, i, p, h, c, ca) WITH ORDINALITY AS u(s, k, t, i, p, h, c, ca, o)
        JOIN x ON x.n = u.s
        ORDER BY u.o
        RETURNING events.global_position, events.stream, events.seq),
    o AS (
        INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, last_error,
                            updated_at, partition_no)
        SELECT u.s, x.hd + u.k, u.t, 'pending', 0, now_ms, NULL, now_ms, x.pn
        FROM unnest(s, k, t) AS u(s, k, t) JOIN x ON x.n = u.s
        WHERE enqueue),
    hd AS (
        INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no)
        SELECT x.n, x.hd + 1, now_ms, x.pn FROM x
        WHERE enqueue AND x.cnt > 0
          AND NOT EXISTS (SELECT 1 FROM outbox_heads oh WHERE oh.stream = x.n)
        ON CONFLICT (stream) DO NOTHING),
    st AS (UPDATE streams SET head = x.hd + x.cnt FROM x WHERE streams.stream = x.n),
    nt AS (SELECT pg_notify(channel, '') WHERE enqueue AND channel IS NOT NULL)
    SELECT e.stream, e.seq, e.global_position, now_ms FROM e, (SELECT count(*) FROM nt) AS notified;
END
$fn$;
