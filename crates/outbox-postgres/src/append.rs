//! The append (ADR 0042): one statement in autocommit, which locks the
//! streams' version rows by bumping them, checks the expected versions
//! against what it locked and writes every event, outbox row and head, or
//! refuses with an error and writes nothing. Only a refused batch calls the
//! `outbox_append` function (ADR 0031), whose answer carries the streams'
//! versions that [`plan_append`] names the conflict from.

use std::collections::HashMap;

use outbox_core::spi::{journal_undecodable, plan_append};
use outbox_core::{
    AppendOptions, AppendRequest, Appended, Error, ExpectedVersion, Partitioning, PayloadHash, Result, Seq,
    StreamId, Timestamp,
};
use sqlx::{Connection as _, PgConnection};

use crate::db::storage;

/// The append as one statement. `$1`..`$9` hold one entry per event (its
/// stream, its place among its stream's events in the batch from 1, type,
/// intent, payload, payload hash, correlation and causation ids, and the
/// index of its stream in `$10` from 1); `$10`..`$13` one per stream, in
/// byte order, distinct (its name, its event count, the version it must
/// have before the batch or NULL for any, its partition); `$14` whether
/// outbox rows are written; `$15` the channel to notify at commit, if any;
/// `$16` the largest seq.
///
/// - `up` locks the version rows in stream order by bumping them (an
///   upsert's conflict locks the newest version of the row, waiting for a
///   holder's commit, and updates that version; a missing row is created).
///   Every writer of a stream's outbox rows or head locks that row first,
///   in the same order, so appends and workers do not deadlock.
/// - `now` reads the versions before the batch from what `up` returned,
///   after every lock was granted. A version that is not the one expected,
///   or a stream that would pass the largest seq, calls
///   `outbox_append_refused()`, whose error (SQLSTATE `OB001`) ends the
///   statement with nothing written. Then it reads the journal clock, once,
///   so a stream's events are recorded in seq order.
/// - `e` and `o` write the events (in batch order, so positions follow it)
///   and their outbox rows at seq = version before + place.
/// - `hd` inserts a head for each stream that has none. The statement's
///   snapshot was taken before the lock waits, so it may still show a head
///   that the worker which held the lock has deleted since; the existence
///   check therefore reads with `FOR KEY SHARE`, which finds the newest
///   version of the row or none (a deleted row is not returned) and does
///   not wait for a claim that is moving the head's due time (a no-key
///   update). A head inserted since the snapshot is not seen, and the
///   insert's `ON CONFLICT DO NOTHING` leaves it as it is. `xs` is
///   materialized so that no existence check runs before `now`, that is
///   before every lock was granted.
pub(crate) const APPEND: &str = r#"WITH x AS (SELECT * FROM unnest($10::text[], $11::bigint[], $12::bigint[], $13::integer[])
        WITH ORDINALITY AS x(n, cnt, ex, pn, o)),
up AS (INSERT INTO streams AS v (stream, head) SELECT x.n, x.cnt FROM x ORDER BY x.n COLLATE "C"
       ON CONFLICT (stream) DO UPDATE SET head = v.head + excluded.head
       RETURNING v.stream, v.head),
hs AS (SELECT array_agg(up.head - x.cnt ORDER BY x.o) AS heads,
              bool_or((x.ex IS NOT NULL AND up.head - x.cnt <> x.ex) OR up.head - x.cnt > $16 - x.cnt) AS refused
       FROM x JOIN up ON up.stream = x.n),
now AS (SELECT hs.heads, CASE WHEN hs.refused THEN outbox_append_refused()
               ELSE floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint + outbox_journal_clock_offset_ms()
               END AS ms
        FROM hs),
e AS (INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at,
                          correlation_id, causation_id)
      SELECT u.s, now.heads[u.x] + u.k, u.t, u.i, u.p, u.h, now.ms, u.c, u.ca
      FROM now, unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[],
                       $8::text[], $9::integer[]) WITH ORDINALITY AS u(s, k, t, i, p, h, c, ca, x, o)
      ORDER BY u.o
      RETURNING events.global_position, events.stream, events.seq),
o AS (INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, last_error,
                          updated_at, partition_no)
      SELECT u.s, now.heads[u.x] + u.k, u.t, 'pending', 0, now.ms, NULL, now.ms, ($13::integer[])[u.x]
      FROM now, unnest($1::text[], $2::bigint[], $3::text[], $9::integer[]) AS u(s, k, t, x)
      WHERE $14),
xs AS MATERIALIZED (SELECT x.n, x.pn, now.heads[x.o] AS hd, now.ms FROM now, x WHERE x.cnt > 0),
hd AS (INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no)
       SELECT xs.n, xs.hd + 1, xs.ms, xs.pn FROM xs
       WHERE $14 AND NOT EXISTS (SELECT 1 FROM outbox_heads oh WHERE oh.stream = xs.n FOR KEY SHARE)
       ON CONFLICT (stream) DO NOTHING),
nt AS (SELECT pg_notify($15, '') WHERE $14 AND $15 IS NOT NULL)
SELECT e.stream, e.seq, e.global_position, now.ms FROM now, e WHERE (SELECT count(*) FROM nt) >= 0"#;

/// The SQLSTATE of `outbox_append_refused()` (journal migration 0012).
const REFUSED: &str = "OB001";

/// The SQLSTATE of a bigint overflow: a stream's version bumped past the
/// largest seq, which the function's check reports as the conflict it is.
const OUT_OF_RANGE: &str = "22003";

/// The fallback: one call of the schema's `outbox_append` function (journal
/// migration 0008, ADR 0031), which locks the streams in order, checks the
/// versions and either writes the batch or returns every stream's version.
pub(crate) const APPEND_CALL: &str = "SELECT out_stream, out_seq, out_position, out_at FROM outbox_append(\
     $1::text[], $2::bigint[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[], $8::text[], \
     $9::text[], $10::bigint[], $11::bigint[], $12::integer[], $13::boolean, $14::text, $15::bigint)";

/// A row of either statement: stream, seq, and the event's position and
/// time (both NULL in the function's answer to a refused batch, whose seq
/// is then the stream's version).
pub(crate) type Row = (String, i64, Option<i64>, Option<i64>);

/// Either statement, being bound.
type Query<'q> = sqlx::query::QueryAs<'q, sqlx::Postgres, Row, sqlx::postgres::PgArguments>;

/// One batch as the statements' arrays.
pub(crate) struct Args<'a> {
    batch: &'a [AppendRequest],
    s: Vec<&'a str>,
    k: Vec<i64>,
    t: Vec<&'a str>,
    i: Vec<&'a str>,
    p: Vec<&'a [u8]>,
    h: Vec<Vec<u8>>,
    c: Vec<Option<&'a str>>,
    ca: Vec<Option<&'a str>>,
    x: Vec<i32>,
    names: Vec<&'a str>,
    counts: Vec<i64>,
    expected: Vec<Option<i64>>,
    parts: Vec<i32>,
    enqueue: bool,
    notify: Option<&'a str>,
}

impl<'a> Args<'a> {
    /// Each stream's expected version is sent as the version it must have
    /// before the batch (the batch's earlier events of that stream
    /// subtracted), or none for [`ExpectedVersion::Any`]; requests of one
    /// stream that cannot all hold are sent as -1, which no stream has.
    /// `notify` is the channel to notify at commit (`append_in`).
    pub(crate) fn new(
        batch: &'a [AppendRequest],
        options: AppendOptions,
        notify: Option<&'a str>,
        partitioning: &Partitioning,
    ) -> Result<Self> {
        check_text(batch)?;
        let mut names: Vec<&str> = batch.iter().map(|r| r.stream.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        let total: usize = batch.iter().map(|r| r.events.len()).sum();
        let mut counts = vec![0i64; names.len()];
        let mut expected: Vec<Option<Option<i64>>> = vec![None; names.len()];
        let mut a = Args {
            batch,
            s: Vec::with_capacity(total),
            k: Vec::with_capacity(total),
            t: Vec::with_capacity(total),
            i: Vec::with_capacity(total),
            p: Vec::with_capacity(total),
            h: Vec::with_capacity(total),
            c: Vec::with_capacity(total),
            ca: Vec::with_capacity(total),
            x: Vec::with_capacity(total),
            names: Vec::new(),
            counts: Vec::new(),
            expected: Vec::new(),
            parts: Vec::new(),
            enqueue: options.enqueues(),
            notify: notify.filter(|_| options.enqueues()),
        };
        for req in batch {
            let at = names
                .binary_search(&req.stream.as_str())
                .map_err(|_| journal_undecodable("append batch", "a stream missing from its names"))?;
            let before = counts[at];
            let wanted = match req.expected {
                ExpectedVersion::Any => None,
                ExpectedVersion::NoStream => Some(0i64.saturating_sub(before)),
                ExpectedVersion::Exact(v) => Some(seq_i64(v).saturating_sub(before)),
            };
            if let Some(w) = wanted {
                let w = if w < 0 { -1 } else { w };
                expected[at] = Some(match expected[at] {
                    Some(Some(prev)) if prev != w => Some(-1),
                    _ => Some(w),
                });
            }
            let index = i32::try_from(at + 1)
                .map_err(|_| journal_undecodable("append batch", "more streams than an array holds"))?;
            for (j, e) in req.events.iter().enumerate() {
                a.s.push(req.stream.as_str());
                a.k.push(before + 1 + j as i64);
                a.t.push(e.event_type.as_str());
                a.i.push(e.intent.as_str());
                a.p.push(e.payload.as_slice());
                a.h.push(PayloadHash::of(&e.payload).0.to_vec());
                a.c.push(e.metadata.correlation_id.as_deref());
                a.ca.push(e.metadata.causation_id.as_deref());
                a.x.push(index);
            }
            counts[at] = before + req.events.len() as i64;
        }
        a.parts = names
            .iter()
            .map(|n| StreamId::new(*n).map(|id| i32::from(partitioning.of(&id).get())))
            .collect::<Result<_>>()?;
        a.expected = expected.into_iter().map(Option::flatten).collect();
        a.names = names;
        a.counts = counts;
        Ok(a)
    }

    /// The one statement.
    pub(crate) async fn write(&self, conn: &mut PgConnection) -> sqlx::Result<Vec<Row>> {
        let q = self.events(sqlx::query_as(APPEND)).bind(&self.x);
        self.streams(q).fetch_all(conn).await
    }

    /// The function, for a batch the statement refused.
    async fn call(&self, conn: &mut PgConnection) -> sqlx::Result<Vec<Row>> {
        self.streams(self.events(sqlx::query_as(APPEND_CALL)))
            .fetch_all(conn)
            .await
    }

    /// Binds the per-event arrays both statements start with.
    fn events<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        q.bind(&self.s)
            .bind(&self.k)
            .bind(&self.t)
            .bind(&self.i)
            .bind(&self.p)
            .bind(&self.h)
            .bind(&self.c)
            .bind(&self.ca)
    }

    /// Binds the per-stream arrays and flags both statements end with.
    fn streams<'q>(&'q self, q: Query<'q>) -> Query<'q> {
        q.bind(&self.names)
            .bind(&self.counts)
            .bind(&self.expected)
            .bind(&self.parts)
            .bind(self.enqueue)
            .bind(self.notify)
            .bind(Seq::MAX.as_i64())
    }

    /// Appends on a connection in autocommit: the statement, and the
    /// function only when the statement refused the batch (it wrote
    /// nothing then).
    pub(crate) async fn append(&self, conn: &mut PgConnection) -> Result<Vec<Appended>> {
        let rows = match self.write(conn).await {
            Err(e) if refused(&e) => self.call(conn).await,
            other => other,
        }
        .map_err(|e| storage("appending events", e))?;
        self.appended(&rows)
    }

    /// Appends inside the caller's transaction, under a savepoint: on any
    /// error the batch has written nothing and the transaction is usable.
    pub(crate) async fn append_in(&self, conn: &mut PgConnection) -> Result<Vec<Appended>> {
        let savepoint = |e| storage("starting a savepoint", e);
        let err = |e| storage("appending events", e);
        {
            let mut sp = conn.begin().await.map_err(savepoint)?;
            match self.write(&mut sp).await {
                Ok(rows) => {
                    let out = self.appended(&rows)?;
                    sp.commit()
                        .await
                        .map_err(|e| storage("releasing a savepoint", e))?;
                    return Ok(out);
                }
                Err(e) if refused(&e) => sp
                    .rollback()
                    .await
                    .map_err(|e| storage("rolling back to a savepoint", e))?,
                Err(e) => return Err(err(e)),
            }
        }
        let mut sp = conn.begin().await.map_err(savepoint)?;
        let rows = self.call(&mut sp).await.map_err(err)?;
        let out = self.appended(&rows)?;
        sp.commit()
            .await
            .map_err(|e| storage("releasing a savepoint", e))?;
        Ok(out)
    }

    /// What the batch's requests appended, from the rows either statement
    /// returned; a refused batch becomes the conflict [`plan_append`] names
    /// from the streams' versions, as on every backend.
    pub(crate) fn appended(&self, rows: &[Row]) -> Result<Vec<Appended>> {
        let refused = rows.iter().any(|r| r.2.is_none());
        // Each stream's version before the batch: as found (refused), or
        // its first new seq less one.
        let mut before: HashMap<&str, u64> = HashMap::with_capacity(self.names.len());
        let mut positions: HashMap<(&str, i64), (i64, i64)> = HashMap::with_capacity(rows.len());
        for (stream, seq, global, at) in rows {
            let version = if refused { *seq } else { seq - 1 };
            let version = u64::try_from(version).unwrap_or(0);
            before
                .entry(stream.as_str())
                .and_modify(|v| *v = (*v).min(version))
                .or_insert(version);
            if let (Some(g), Some(a)) = (global, at) {
                positions.insert((stream.as_str(), *seq), (*g, *a));
            }
        }
        let plan = plan_append(self.batch, |s| before.get(s.as_str()).copied().unwrap_or(0))?;
        if refused {
            return Err(journal_undecodable(
                "append result",
                "the journal refused a batch whose versions match",
            ));
        }
        let mut out = Vec::with_capacity(self.batch.len());
        for (req, &first) in self.batch.iter().zip(&plan.firsts) {
            let (global, at) = positions
                .get(&(req.stream.as_str(), seq_i64(first)))
                .copied()
                .ok_or_else(|| journal_undecodable("append result", "an inserted event was not returned"))?;
            out.push(Appended {
                stream: req.stream.clone(),
                first_seq: Seq::new(first)?,
                last_seq: Seq::new(first + req.events.len() as u64 - 1)?,
                first_global_position: u64::try_from(global).unwrap_or(0),
                recorded_at: Timestamp::from_millis(at),
            });
        }
        Ok(out)
    }
}

/// Whether the statement refused the batch (and so wrote nothing).
fn refused(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(d) => d.code().is_some_and(|c| c == REFUSED || c == OUT_OF_RANGE),
        _ => false,
    }
}

/// Refuses a batch with text Postgres cannot hold (NUL) in its metadata.
pub(crate) fn check_text(batch: &[AppendRequest]) -> Result<()> {
    for req in batch {
        for e in &req.events {
            if let Some(c) = &e.metadata.correlation_id {
                no_nul("a correlation id", c)?;
            }
            if let Some(c) = &e.metadata.causation_id {
                no_nul("a causation id", c)?;
            }
        }
    }
    Ok(())
}

/// Postgres text cannot hold NUL.
fn no_nul(what: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        Err(Error::invalid(format_args!("{what} contains a NUL character")))
    } else {
        Ok(())
    }
}

/// A seq or version as Postgres' bigint (every seq fits: [`Seq::MAX`]).
fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
