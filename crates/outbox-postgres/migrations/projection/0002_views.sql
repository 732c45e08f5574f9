-- Backend-neutral projections (ViewProjection): named tables of JSON
-- documents, namespaced by projection. One row per (projection, table, key);
-- the value is the document's JSON text exactly as serialized (text, not
-- jsonb, which would reorder keys), so equal states have byte-identical
-- digests on every backend. COLLATE "C" orders keys bytewise, as SQLite and
-- the memory adapter do.
CREATE TABLE outbox_views (
    projection text COLLATE "C" NOT NULL,
    tbl        text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      text NOT NULL,
    PRIMARY KEY (projection, tbl, key)
);
