//! What differs between the SQL dialects in the shared statements.

/// A SQL dialect as the shared statements need it. Statements are written
/// with `$1`, `$2`, ... placeholders and `{now}` for the database clock (in
/// integer milliseconds); [`Dialect::sql`] renders them.
#[derive(Clone, Debug)]
pub struct Dialect {
    numbered_question_marks: bool,
    now: String,
    lock_stream: Option<&'static str>,
    lock_admission: Option<&'static str>,
    refresh_head: &'static [&'static str],
    json_rows: &'static str,
    /// The aggregate of one JSON array per row, `{}` standing for the columns.
    json_group: &'static str,
    locked_documents: Option<LockedDocuments>,
    feed: Option<Feed>,
}

/// How the journal is read in the order its events became visible, where
/// that is not the order of their global positions (Postgres takes a
/// position before its transaction commits; ADR 0030). Keys are
/// transaction ids (`events.txid`).
#[derive(Clone, Copy, Debug)]
pub struct Feed {
    /// Returns the horizon (the oldest transaction id still open, or the
    /// next one) and the key of the `$2`-th event above key `$1` below the
    /// horizon (`NULL` when there are fewer), both as integers; and 1 when
    /// the cursor `$1` or a stored key is at or above the next transaction
    /// id, which no committed transaction of this server can have: the keys
    /// come from another server (a logical restore), else 0.
    pub bound: &'static str,
    /// The events with a key above `$1` and at or below `$2`, in key order,
    /// each with its key as a last column.
    pub page: &'static str,
    /// How many committed events lie at or above the horizon (held back
    /// by an open transaction), counted up to `$1`.
    pub held_back: &'static str,
}

/// How view documents are written where writers run concurrently
/// (Postgres): [`ViewWrites::flush`](crate::view_writes::ViewWrites::flush)
/// locks the keys, then reads and upserts them in one statement.
#[derive(Clone, Copy, Debug)]
pub struct LockedDocuments {
    /// Locks the documents whose `[projection, table, key]` rows are the
    /// JSON array `$1`, in that order.
    pub lock: &'static str,
    /// Returns the documents of the `[projection, table, key]` rows `$1` as
    /// they are (`old` rows, with their value), and upserts the
    /// `[projection, table, key, value]` rows `$2` (a row per document,
    /// `inserted` or `updated`).
    pub upsert: &'static str,
}

impl Dialect {
    /// SQLite: `?N` placeholders; writers are serialized by `BEGIN
    /// IMMEDIATE`, so no row locks. `now` is the clock expression.
    pub fn sqlite(now: impl Into<String>) -> Self {
        Dialect {
            numbered_question_marks: true,
            now: now.into(),
            lock_stream: None,
            lock_admission: None,
            json_rows: "json_each($1)",
            json_group: "json_group_array(json_array({}))",
            locked_documents: None,
            feed: None,
            refresh_head: &[
                "INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
                 SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END, partition_no \
                 FROM outbox WHERE stream = $1 ORDER BY seq LIMIT 1 \
                 ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
                 partition_no = excluded.partition_no",
                "DELETE FROM outbox_heads WHERE stream = $1 \
                 AND NOT EXISTS (SELECT 1 FROM outbox WHERE stream = $1)",
            ],
        }
    }

    /// Postgres: `$N` placeholders; a transaction that changes a stream's
    /// outbox rows first locks the stream's version row, so the head row is
    /// never recomputed from a stale snapshot. `now` is the clock expression.
    pub fn postgres(now: impl Into<String>) -> Self {
        Dialect {
            numbered_question_marks: false,
            now: now.into(),
            lock_stream: Some("SELECT 1 FROM streams WHERE stream = $1 FOR NO KEY UPDATE"),
            lock_admission: Some(
                "SELECT pg_advisory_xact_lock(hashtextextended('outbox.admit_run.' || current_schema() || '.' || $1, 0))",
            ),
            json_rows: "json_array_elements($1::json)",
            json_group: "COALESCE(json_agg(json_build_array({})), '[]')::text",
            feed: Some(Feed {
                bound: "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, \
                        (SELECT e.txid::text::bigint FROM events e \
                         WHERE e.txid > ($1::bigint)::text::xid8 \
                         AND e.txid < pg_snapshot_xmin(pg_current_snapshot()) \
                         ORDER BY e.txid, e.global_position OFFSET $2 - 1 LIMIT 1), \
                        CASE WHEN ($1::bigint)::text::xid8 >= pg_snapshot_xmax(pg_current_snapshot()) \
                             OR (SELECT txid FROM events ORDER BY txid DESC LIMIT 1) \
                                >= pg_snapshot_xmax(pg_current_snapshot()) \
                        THEN 1 ELSE 0 END",
                page: concat!(
                    "SELECT ",
                    crate::event_columns!(),
                    ", txid::text::bigint FROM events WHERE txid > ($1::bigint)::text::xid8 \
                     AND txid <= ($2::bigint)::text::xid8 ORDER BY txid, global_position"
                ),
                held_back: "SELECT count(*) FROM (SELECT 1 FROM events \
                            WHERE txid >= pg_snapshot_xmin(pg_current_snapshot()) LIMIT $1) h",
            }),
            // The view documents' keys, as `LOCK_DOCUMENT` locks one, in
            // the order given.
            locked_documents: Some(LockedDocuments {
                lock: "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || chr(31) || (j.value ->> 0) \
                       || chr(31) || (j.value ->> 1) || chr(31) || (j.value ->> 2), 0)) \
                       FROM json_array_elements($1::json) WITH ORDINALITY AS j(value, n) ORDER BY j.n",
                upsert: "WITH old AS (SELECT v.projection, v.tbl, v.key, v.value FROM outbox_views v \
                         WHERE (v.projection, v.tbl, v.key) IN (SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2 \
                         FROM json_array_elements($1::json) j)), \
                         up AS (INSERT INTO outbox_views (projection, tbl, key, value) \
                         SELECT j.value ->> 0, j.value ->> 1, j.value ->> 2, j.value ->> 3 \
                         FROM json_array_elements($2::json) j \
                         WHERE true ON CONFLICT (projection, tbl, key) DO UPDATE SET value = excluded.value \
                         RETURNING projection, tbl, key, xmax = 0 AS inserted) \
                         SELECT 'old', projection, tbl, key, value FROM old \
                         UNION ALL SELECT CASE WHEN inserted THEN 'inserted' ELSE 'updated' END, \
                         projection, tbl, key, NULL FROM up",
            }),
            refresh_head: &[
                "WITH first AS (SELECT stream, seq, CASE WHEN status = 'dead' THEN NULL ELSE next_attempt_at END AS due, \
                                partition_no FROM outbox WHERE stream = $1 ORDER BY seq LIMIT 1), \
                      up AS (INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
                             SELECT stream, seq, due, partition_no FROM first \
                             ON CONFLICT (stream) DO UPDATE SET head_seq = excluded.head_seq, due_at = excluded.due_at, \
                             partition_no = excluded.partition_no) \
                 DELETE FROM outbox_heads WHERE stream = $1 AND NOT EXISTS (SELECT 1 FROM first)",
            ],
        }
    }

    /// The select-list item that returns every row of a query as one JSON
    /// text: an array with one `[column, ...]` array per row (`[]` for
    /// none), of the comma-separated `columns`. Decode it with
    /// [`decode_json`](crate::decode_json).
    pub fn json_group(&self, columns: &str) -> String {
        self.json_group.replace("{}", columns)
    }

    /// Renders a statement: `{now}` becomes the clock expression, `{rows}`
    /// the rows (`value` column) of the JSON array bound at `$1`, and, on
    /// SQLite, `$N` becomes `?N` (SQLite numbers `$N` parameters by first
    /// appearance, not by N).
    pub fn sql(&self, template: &str) -> String {
        let text = template
            .replace("{now}", &self.now)
            .replace("{rows}", self.json_rows);
        if !self.numbered_question_marks {
            return text;
        }
        let mut out = String::with_capacity(text.len());
        let mut chars = text.chars().peekable();
        let mut quoted = false;
        while let Some(c) = chars.next() {
            if c == '\'' {
                quoted = !quoted;
            }
            if c == '$' && !quoted && chars.peek().is_some_and(char::is_ascii_digit) {
                out.push('?');
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Whether writers run concurrently and take row locks (Postgres), rather
    /// than being serialized by the database (SQLite's `BEGIN IMMEDIATE`).
    pub fn locks_rows(&self) -> bool {
        self.lock_stream.is_some()
    }

    /// How the journal is read in visibility order, where that is not the
    /// order of global positions (`None`: positions are taken in commit
    /// order, as on SQLite's one writer).
    pub fn feed(&self) -> Option<Feed> {
        self.feed
    }

    /// How view documents are locked and written where writers run
    /// concurrently.
    pub fn locked_documents(&self) -> Option<LockedDocuments> {
        self.locked_documents
    }

    /// The statement locking a stream (`$1`) before its outbox rows change,
    /// if the dialect needs one.
    pub fn lock_stream(&self) -> Option<&'static str> {
        self.lock_stream
    }

    /// The statement serializing run admissions for a projection (`$1`)
    /// until the transaction ends, if the dialect needs one (Postgres: a
    /// transaction-scoped advisory lock, so a concurrent loser waits for the
    /// winner's commit and then inserts nothing, consuming no identity
    /// value; SQLite serializes writers already).
    pub fn lock_admission(&self) -> Option<&'static str> {
        self.lock_admission
    }

    /// The statements recomputing a stream's (`$1`) head row from its first
    /// outbox row, or removing it when the stream has none.
    pub fn refresh_head(&self) -> &'static [&'static str] {
        self.refresh_head
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_placeholders_and_the_clock() {
        let s = Dialect::sqlite("NOW()");
        assert_eq!(
            s.sql("SELECT '$1', $2 + {now} WHERE x = $10"),
            "SELECT '$1', ?2 + NOW() WHERE x = ?10"
        );
        let p = Dialect::postgres("now_ms()");
        assert_eq!(p.sql("SELECT $1 + {now}"), "SELECT $1 + now_ms()");
        assert!(p.lock_stream().is_some() && s.lock_stream().is_none());
    }
}
