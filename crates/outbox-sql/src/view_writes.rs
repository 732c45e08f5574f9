//! Write-behind view documents: a batch's puts and deletes reach the
//! database together, right before its checkpoints move.
//!
//! On SQLite an apply transaction is the only writer of its file, so the
//! document writes of a whole batch can wait in memory and reach the
//! database as one statement for the puts and one for the deletes, right
//! before the checkpoints move in the same transaction. Reads see the
//! pending writes first, so an applier reads its own writes as before; scans
//! and clears write the pending ones out first. Where writers run
//! concurrently (Postgres, [`Dialect::locks_rows`]) the puts wait too: the
//! flush first locks every document it writes whose key this transaction
//! has not locked yet (one statement, in key order), then reads them (the
//! digest's old hashes, under the locks) and writes them in one more, so a
//! batch costs two round trips, as one document did when each was written
//! at once.
//!
//! It also keeps the transaction's share of every projection's running
//! digest (ADR 0019): the hash of each document as the database holds it
//! (`base`, learnt from reads and writes), and per projection the change
//! this transaction makes, written once, at commit ([`ViewWrites::flush_digests`]).

use std::collections::{BTreeMap, HashMap};

use outbox_core::{DocumentHash, ProjectionName, Result, RunningDigest, Seq, StreamId};

use crate::{Arg, Conn, Dialect, LockedDocuments};

type Slot = (String, String, String);

/// Documents written in a transaction and not yet sent to the database
/// (`Some(value)` to put, `None` to delete), and the transaction's changes
/// to running digests.
#[derive(Debug, Default)]
pub struct ViewWrites {
    pending: BTreeMap<Slot, Option<String>>,
    /// The hash of a document as the database holds it now (`None`: no
    /// document), where this transaction knows it. Where writers run
    /// concurrently, only documents whose key this transaction has locked.
    base: HashMap<Slot, Option<DocumentHash>>,
    /// Per projection: the change to its running digest, and whether its
    /// documents were cleared (the running digest then starts over, also an
    /// untracked one).
    changes: BTreeMap<String, (RunningDigest, bool)>,
    /// Per projection: the last event applied to it in this transaction
    /// (`ViewStorage::view_applying`).
    last_applied: HashMap<String, (String, i64)>,
}

/// The most documents kept in memory before they are written out.
const MAX_PENDING: usize = 1024;

/// [`RECORD_DIGEST`] for a transaction that cleared the projection's
/// documents: an untracked running digest (NULL lanes, documents that
/// predate running digests) starts at zero, a tracked one takes the change
/// (minus what the clear deleted), and the last event is this
/// transaction's (none for a reset).
const RESTART_DIGEST: &str = "INSERT INTO outbox_view_digests AS d \
     (projection, d0, d1, d2, d3, d4, d5, d6, d7, documents, last_stream, last_seq, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, {now}) \
     ON CONFLICT (projection) DO UPDATE SET \
     d0 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d0 + excluded.d0) % 4294967296 END, \
     d1 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d1 + excluded.d1) % 4294967296 END, \
     d2 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d2 + excluded.d2) % 4294967296 END, \
     d3 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d3 + excluded.d3) % 4294967296 END, \
     d4 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d4 + excluded.d4) % 4294967296 END, \
     d5 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d5 + excluded.d5) % 4294967296 END, \
     d6 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d6 + excluded.d6) % 4294967296 END, \
     d7 = CASE WHEN d.d0 IS NULL THEN 0 ELSE (d.d7 + excluded.d7) % 4294967296 END, \
     documents = CASE WHEN d.d0 IS NULL THEN 0 ELSE d.documents + excluded.documents END, \
     last_stream = excluded.last_stream, last_seq = excluded.last_seq, updated_at = excluded.updated_at";

/// Adds a change (`$2`..`$9` lanes, `$10` documents) to the running digest
/// of projection `$1`, made by event (`$11`, `$12`) when known. Lanes add
/// modulo 2^32, so integers never overflow; the lanes of an untracked
/// projection (NULL) stay NULL.
const RECORD_DIGEST: &str = "INSERT INTO outbox_view_digests AS d \
     (projection, d0, d1, d2, d3, d4, d5, d6, d7, documents, last_stream, last_seq, updated_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, {now}) \
     ON CONFLICT (projection) DO UPDATE SET \
     d0 = (d.d0 + excluded.d0) % 4294967296, d1 = (d.d1 + excluded.d1) % 4294967296, \
     d2 = (d.d2 + excluded.d2) % 4294967296, d3 = (d.d3 + excluded.d3) % 4294967296, \
     d4 = (d.d4 + excluded.d4) % 4294967296, d5 = (d.d5 + excluded.d5) % 4294967296, \
     d6 = (d.d6 + excluded.d6) % 4294967296, d7 = (d.d7 + excluded.d7) % 4294967296, \
     documents = d.documents + excluded.documents, \
     last_stream = COALESCE(excluded.last_stream, d.last_stream), \
     last_seq = COALESCE(excluded.last_seq, d.last_seq), \
     updated_at = excluded.updated_at";

fn slot(projection: &ProjectionName, table: &str, key: &str) -> Slot {
    (projection.as_str().to_owned(), table.to_owned(), key.to_owned())
}

impl ViewWrites {
    /// A pending write of the document: `Some(Some(value))` a put,
    /// `Some(None)` a delete, `None` when there is none.
    pub fn get(&self, projection: &ProjectionName, table: &str, key: &str) -> Option<Option<&str>> {
        self.pending
            .get(&slot(projection, table, key))
            .map(|v| v.as_deref())
    }

    /// Records a put; whether enough is pending to write it out now.
    pub fn put(&mut self, projection: &ProjectionName, table: &str, key: &str, value: &str) -> bool {
        let s = slot(projection, table, key);
        self.pending.insert(s, Some(value.to_owned()));
        self.pending.len() >= MAX_PENDING
    }

    /// Turns a pending put or delete into a delete; whether the document
    /// existed, or `None` when nothing was pending for it (the caller then
    /// deletes in the database).
    pub fn delete(&mut self, projection: &ProjectionName, table: &str, key: &str) -> Option<bool> {
        let s = slot(projection, table, key);
        Some(self.pending.get_mut(&s)?.take().is_some())
    }

    /// Records a delete of a document known to exist (a single writer's:
    /// it is written out with the other pending writes).
    pub fn defer_delete(&mut self, projection: &ProjectionName, table: &str, key: &str) {
        self.pending.insert(slot(projection, table, key), None);
    }

    /// Whether no document write is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The event now applied to `projection` (the last one of the
    /// transaction becomes the running digest's `last_event`).
    pub fn applying(&mut self, projection: &ProjectionName, stream: &StreamId, seq: Seq) {
        self.last_applied.insert(
            projection.as_str().to_owned(),
            (
                stream.as_str().to_owned(),
                i64::try_from(seq.get()).unwrap_or(i64::MAX),
            ),
        );
    }

    /// Whether the database's version of the document is known (and, where
    /// writers run concurrently, its key locked by this transaction).
    pub fn knows(&self, projection: &ProjectionName, table: &str, key: &str) -> bool {
        self.base.contains_key(&slot(projection, table, key))
    }

    /// The hash of the database's version of the document, if known.
    pub fn known(&self, projection: &ProjectionName, table: &str, key: &str) -> Option<Option<DocumentHash>> {
        self.base.get(&slot(projection, table, key)).copied()
    }

    /// Notes the database's version of a document, just read.
    pub fn read(&mut self, projection: &ProjectionName, table: &str, key: &str, value: Option<&str>) {
        self.base.insert(
            slot(projection, table, key),
            value.map(|v| DocumentHash::of(table, key, v)),
        );
    }

    /// Records a write the database has made: the document that was there
    /// (`old`) replaced by `new` (`None`: deleted). `locked`: whether the
    /// key is this transaction's now (always true for a single writer).
    pub fn wrote(
        &mut self,
        projection: &ProjectionName,
        table: &str,
        key: &str,
        old: Option<DocumentHash>,
        new: Option<&str>,
        locked: bool,
    ) {
        self.record(slot(projection, table, key), old, new, locked);
    }

    fn record(&mut self, s: Slot, old: Option<DocumentHash>, new: Option<&str>, locked: bool) {
        let new = new.map(|v| DocumentHash::of(&s.1, &s.2, v));
        let projection = s.0.clone();
        if locked {
            self.base.insert(s, new);
        } else {
            self.base.remove(&s);
        }
        if old == new {
            return;
        }
        self.changes
            .entry(projection)
            .or_default()
            .0
            .replace(old.as_ref(), new.as_ref());
    }

    /// Records that `projection`'s documents were cleared: the ones in
    /// `deleted` (as the database deleted them) leave its running digest,
    /// which then starts over (an untracked one at zero). Everything known
    /// or pending about its documents is forgotten.
    pub fn cleared(&mut self, projection: &ProjectionName, deleted: &[DocumentHash]) {
        let p = projection.as_str();
        self.pending.retain(|(q, _, _), _| q != p);
        self.base.retain(|(q, _, _), _| q != p);
        let entry = self.changes.entry(p.to_owned()).or_default();
        for h in deleted {
            entry.0.remove(h);
        }
        entry.1 = true;
    }

    /// Writes each projection's running digest change: one statement per
    /// projection whose documents this transaction changed (none when it
    /// changed nothing). Call after the last document write, right before
    /// the commit.
    pub async fn flush_digests(&mut self, dialect: &Dialect, tx: &mut (dyn Conn + '_)) -> Result<()> {
        let digests = self.take_digests();
        for st in digests.statements(dialect) {
            tx.execute(st.what, &st.sql, &st.args).await?;
        }
        Ok(())
    }

    /// The running digest changes, taken for the caller to write
    /// ([`flush_digests`](Self::flush_digests) without the writing: a
    /// store that sends several statements at once). Nothing is left to
    /// flush afterwards.
    pub fn take_digests(&mut self) -> DigestWrites {
        let changes = std::mem::take(&mut self.changes);
        let rows = changes
            .into_iter()
            .filter(|(_, (change, cleared))| !change.is_empty() || *cleared)
            .map(|(projection, (change, cleared))| {
                let last = self.last_applied.get(&projection).cloned();
                DigestRow {
                    lanes: change.lanes(),
                    documents: change.documents(),
                    projection,
                    cleared,
                    last,
                }
            })
            .collect();
        DigestWrites { rows }
    }

    /// Writes the pending documents out: one statement for every put, one
    /// for every delete, after one reading the documents they replace whose
    /// hash is not known yet (for the running digests). Where writers run
    /// concurrently, see `flush_locked`. Empty afterwards, also
    /// on an error (the transaction is then rolled back by its owner).
    pub async fn flush(&mut self, dialect: &Dialect, tx: &mut (dyn Conn + '_)) -> Result<()> {
        if let Some(locked) = dialect.locked_documents() {
            return self.flush_locked(dialect, locked, tx).await;
        }
        let writes = self.prepare_flush(dialect, tx).await?;
        for st in writes.statements(dialect) {
            tx.execute(st.what, &st.sql, &st.args).await?;
        }
        Ok(())
    }

    /// [`flush`](Self::flush) where writers run concurrently: the keys
    /// this transaction has not locked yet are locked first (one
    /// statement, in key order: `locked.lock`); then one statement
    /// (`locked.upsert`) reads the documents they hold (its snapshot comes
    /// after the locks, so it sees what the writers waited for committed)
    /// and upserts every put, returning which it inserted; then the
    /// deletes. Two round trips for a batch
    /// of puts, as one put took before they were deferred.
    ///
    /// Deletes and clears take no document lock (ADR 0019): a put whose
    /// document such a writer deleted after this transaction read it
    /// inserts it anew and replaces nothing, so the digest change takes
    /// nothing out for it (the deleter did).
    async fn flush_locked(
        &mut self,
        dialect: &Dialect,
        locked: LockedDocuments,
        tx: &mut (dyn Conn + '_),
    ) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let unknown: Vec<(&str, &str, &str)> = pending
            .keys()
            .filter(|s| !self.base.contains_key(*s))
            .map(|(p, t, k)| (p.as_str(), t.as_str(), k.as_str()))
            .collect();
        let (mut puts, mut deletes) = (Vec::new(), Vec::new());
        for ((p, t, k), v) in &pending {
            match v {
                Some(v) => puts.push((p.as_str(), t.as_str(), k.as_str(), v.as_str())),
                None => deletes.push((p.as_str(), t.as_str(), k.as_str())),
            }
        }
        let any_unknown = !unknown.is_empty();
        let unknown = crate::json_text(&unknown)?;
        if any_unknown {
            tx.fetch("locking view documents", locked.lock, &[Arg::Text(&unknown)])
                .await?;
        }
        let puts = crate::json_text(&puts)?;
        let rows = tx
            .fetch(
                "writing view documents",
                &dialect.sql(locked.upsert),
                &[Arg::Text(&unknown), Arg::Text(&puts)],
            )
            .await?;
        let (mut found, mut inserted) = (HashMap::new(), std::collections::HashSet::new());
        for r in &rows {
            let (kind, s) = (r.text(0)?, (r.text(1)?, r.text(2)?, r.text(3)?));
            match kind.as_str() {
                "old" => {
                    let v = r.opt_text(4)?.unwrap_or_default();
                    found.insert(s.clone(), DocumentHash::of(&s.1, &s.2, &v));
                }
                "inserted" => {
                    inserted.insert(s);
                }
                _ => {}
            }
        }
        if !deletes.is_empty() {
            let writes = DocumentWrites {
                puts: None,
                deletes: Some(crate::json_text(&deletes)?),
            };
            for st in writes.statements(dialect) {
                tx.execute(st.what, &st.sql, &st.args).await?;
            }
        }
        for (s, v) in pending {
            let old = match self.base.get(&s) {
                Some(known) => *known,
                None => found.get(&s).copied(),
            };
            let old = if inserted.contains(&s) { None } else { old };
            self.record(s, old, v.as_deref(), true);
        }
        Ok(())
    }

    /// [`flush`](Self::flush) up to the writing: reads the documents the
    /// pending writes replace whose hash is not known yet, records the
    /// digest changes, and returns the writes for the caller to send.
    /// Nothing is pending afterwards, also on an error.
    pub async fn prepare_flush(
        &mut self,
        dialect: &Dialect,
        tx: &mut (dyn Conn + '_),
    ) -> Result<DocumentWrites> {
        if self.pending.is_empty() {
            return Ok(DocumentWrites::default());
        }
        let pending = std::mem::take(&mut self.pending);
        let unknown: Vec<(&str, &str, &str)> = pending
            .keys()
            .filter(|s| !self.base.contains_key(*s))
            .map(|(p, t, k)| (p.as_str(), t.as_str(), k.as_str()))
            .collect();
        if !unknown.is_empty() {
            let unknown = crate::json_text(&unknown)?;
            let what = "reading the view documents a batch replaces";
            // One row holding them all: a driver that hands rows over one by
            // one (SQLite's) then makes one handoff, not one per document.
            let rows = tx
                .fetch(
                    what,
                    &dialect.sql(&format!(
                        "SELECT {} FROM outbox_views WHERE (projection, tbl, key) IN \
                         (SELECT value ->> 0, value ->> 1, value ->> 2 FROM {{rows}})",
                        dialect.json_group("projection, tbl, key, value")
                    )),
                    &[Arg::Text(&unknown)],
                )
                .await?;
            let documents: Vec<(String, String, String, String)> = match rows.first() {
                Some(r) => crate::decode_json(what, &r.text(0)?)?,
                None => Vec::new(),
            };
            let mut found = HashMap::with_capacity(documents.len());
            for (p, t, k, v) in documents {
                let h = DocumentHash::of(&t, &k, &v);
                found.insert((p, t, k), h);
            }
            for s in pending.keys() {
                if !self.base.contains_key(s) {
                    self.base.insert(s.clone(), found.get(s).copied());
                }
            }
        }
        for (s, v) in &pending {
            let old = self.base.get(s).copied().flatten();
            self.record(s.clone(), old, v.as_deref(), true);
        }
        let mut puts = Vec::new();
        let mut deletes = Vec::new();
        for ((p, t, k), v) in &pending {
            match v {
                Some(v) => puts.push((p.as_str(), t.as_str(), k.as_str(), v.as_str())),
                None => deletes.push((p.as_str(), t.as_str(), k.as_str())),
            }
        }
        Ok(DocumentWrites {
            puts: crate::json_text_unless_empty(&puts)?,
            deletes: crate::json_text_unless_empty(&deletes)?,
        })
    }
}

/// A statement ready to send: its text in the dialect's placeholders, its
/// arguments, and what it does (for errors).
#[derive(Debug)]
pub struct Statement<'a> {
    /// What it does, for errors ("writing view documents").
    pub what: &'static str,
    /// The text, placeholders numbered from 1.
    pub sql: String,
    /// The arguments, in placeholder order.
    pub args: Vec<Arg<'a>>,
}

/// The document writes of a flush ([`ViewWrites::prepare_flush`]): at most
/// one statement for the puts and one for the deletes.
#[derive(Debug, Default)]
pub struct DocumentWrites {
    puts: Option<String>,
    deletes: Option<String>,
}

impl DocumentWrites {
    /// The statements, in order (none when nothing was pending).
    pub fn statements(&self, dialect: &Dialect) -> Vec<Statement<'_>> {
        let mut out = Vec::with_capacity(2);
        if let Some(rows) = &self.puts {
            out.push(Statement {
                what: "writing view documents",
                sql: dialect.sql(
                    "INSERT INTO outbox_views (projection, tbl, key, value) \
                     SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM {rows} WHERE true \
                     ON CONFLICT (projection, tbl, key) DO UPDATE SET value = excluded.value",
                ),
                args: vec![Arg::Text(rows)],
            });
        }
        if let Some(rows) = &self.deletes {
            out.push(Statement {
                what: "deleting view documents",
                sql: dialect.sql(
                    "DELETE FROM outbox_views WHERE (projection, tbl, key) IN \
                     (SELECT value ->> 0, value ->> 1, value ->> 2 FROM {rows})",
                ),
                args: vec![Arg::Text(rows)],
            });
        }
        out
    }
}

/// One projection's running digest change.
#[derive(Debug)]
struct DigestRow {
    projection: String,
    cleared: bool,
    lanes: [i64; outbox_core::RUNNING_DIGEST_LANES],
    documents: i64,
    last: Option<(String, i64)>,
}

/// The running digest changes of a transaction
/// ([`ViewWrites::take_digests`]): one statement per projection changed.
#[derive(Debug, Default)]
pub struct DigestWrites {
    rows: Vec<DigestRow>,
}

impl DigestWrites {
    /// The statements, one per projection whose digest changed.
    pub fn statements(&self, dialect: &Dialect) -> Vec<Statement<'_>> {
        self.rows
            .iter()
            .map(|r| {
                let mut args = Vec::with_capacity(12);
                args.push(Arg::Text(&r.projection));
                args.extend(r.lanes.iter().map(|l| Arg::Int(*l)));
                args.push(Arg::Int(r.documents));
                args.push(Arg::OptText(r.last.as_ref().map(|(s, _)| s.as_str())));
                args.push(Arg::OptInt(r.last.as_ref().map(|(_, q)| *q)));
                Statement {
                    what: "recording a running digest",
                    sql: dialect.sql(if r.cleared { RESTART_DIGEST } else { RECORD_DIGEST }),
                    args,
                }
            })
            .collect()
    }
}
