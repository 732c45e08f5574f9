-- Appends write two B-tree pages fewer per commit (ADR 0040).
--
-- A stream's version is the last seq in the events' own (stream, seq)
-- index, read as max(seq): the `streams` table that repeated it is gone.
--
-- A global position is the rowid's next value (largest + 1) instead of an
-- AUTOINCREMENT counter, whose `sqlite_sequence` row every append read and
-- wrote. The two differ only when the largest position is deleted, and the
-- journal never deletes an event; an append rolled back was never visible,
-- so its position being taken again is unseen either way.
--
-- The table is rebuilt (SQLite cannot drop AUTOINCREMENT in place): this
-- migration copies every event once, in one transaction, and needs free
-- disk space for a second copy of the events while it runs.

CREATE TABLE events_lean (
    global_position INTEGER PRIMARY KEY,
    stream          TEXT    NOT NULL,
    seq             INTEGER NOT NULL CHECK (seq >= 1),
    event_type      TEXT    NOT NULL,
    intent          TEXT    NOT NULL CHECK (intent IN ('apply', 'audit_only')),
    payload         BLOB    NOT NULL,
    payload_hash    BLOB    NOT NULL,
    recorded_at     INTEGER NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    UNIQUE (stream, seq)
);

INSERT INTO events_lean (global_position, stream, seq, event_type, intent, payload, payload_hash,
                         recorded_at, correlation_id, causation_id)
SELECT global_position, stream, seq, event_type, intent, payload, payload_hash,
       recorded_at, correlation_id, causation_id
FROM events ORDER BY global_position;

DROP TABLE events;
ALTER TABLE events_lean RENAME TO events;
DROP TABLE streams;
