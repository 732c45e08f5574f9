-- Backend-neutral projections (ViewProjection): named tables of JSON
-- documents, namespaced by projection. One row per (projection, table, key);
-- the value is the document's JSON text exactly as serialized, so equal
-- states have byte-identical digests on every backend. Keys compare
-- bytewise (SQLite's BINARY collation), the same order as the other adapters.
CREATE TABLE outbox_views (
    projection TEXT NOT NULL,
    tbl        TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (projection, tbl, key)
) WITHOUT ROWID;
