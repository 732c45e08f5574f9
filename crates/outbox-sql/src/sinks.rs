//! [`SinkStore`](outbox_core::SinkStore) on the shared statements: sink
//! checkpoints with their failures, and scan cursors (ADR 0023). Sinks
//! publish over a network, so these run through [`Database`] on every
//! adapter (one statement or a short transaction each).

use outbox_core::spi::{
    duration_millis, journal_undecodable, truncate_error, validate_advance, validate_failing, validate_limit,
};
use outbox_core::{
    Error, EventJournal, FailureDecision, FailureOutcome, FeedPage, MAX_PAGE, Partition, Result, RetryPolicy,
    Seq, SinkName, SinkStatus, SinkStream, SinkSummary, StreamId, Timestamp,
};

use crate::{Arg, Database, Row};

const COLUMNS: &str = "sink, stream, seq, status, attempt_count, next_attempt_at, last_error, updated_at";

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn decode(r: &Row) -> Result<SinkStream> {
    let bad = |e: &dyn std::fmt::Display| journal_undecodable("sink state", e.to_string());
    Ok(SinkStream {
        sink: SinkName::new(r.text(0)?).map_err(|e| bad(&e))?,
        stream: StreamId::new(r.text(1)?).map_err(|e| bad(&e))?,
        seq: u64::try_from(r.int(2)?).map_err(|e| bad(&e))?,
        status: r.text(3)?.parse().map_err(|e: Error| bad(&e))?,
        attempt_count: u32::try_from(r.int(4)?).map_err(|e| bad(&e))?,
        next_attempt_at: Timestamp::from_millis(r.int(5)?),
        last_error: r.opt_text(6)?,
        updated_at: Timestamp::from_millis(r.int(7)?),
    })
}

/// [`SinkStore::sink_states`](outbox_core::SinkStore::sink_states): one
/// primary-key read per stream, in one snapshot.
pub async fn sink_states(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    streams: &[StreamId],
) -> Result<Vec<SinkStream>> {
    let what = "reading sink checkpoints";
    let sql = db.dialect().sql(&format!(
        "SELECT {COLUMNS} FROM outbox_sink_streams WHERE sink = $1 AND stream = $2"
    ));
    let mut tx = db.snapshot().await?;
    let mut out = Vec::with_capacity(streams.len());
    for s in streams {
        let row = tx
            .fetch_optional(what, &sql, &[Arg::Text(sink.as_str()), Arg::Text(s.as_str())])
            .await?;
        out.push(match row {
            Some(r) => decode(&r)?,
            None => SinkStream::new(sink, s),
        });
    }
    tx.commit(what).await?;
    Ok(out)
}

/// [`SinkStore::advance_sink`](outbox_core::SinkStore::advance_sink), in
/// one transaction, every statement guarded by the stored seq (absent
/// counts as 0).
///
/// With `more`, the stream stays due (status `failed`, due now, its
/// failure record kept) until the catch-up reaches its end. Without it, a
/// stream becomes `ok` only if it was `ok` (the common case, one
/// statement) or the advance reaches the stream's version: while a stream
/// is not `ok` the scan cursors pass over its events, so a deliverer that
/// read it `ok` before it failed (a stalled or overlapping worker) must not
/// declare it caught up; it stays `failed` and due now (or `dead`), its
/// checkpoint moved. That comparison holds the stream's lock where appends
/// take one (Postgres): an event committing meanwhile either counts in the
/// version or commits after this advance, when a scan that reads it also
/// reads the new state.
pub async fn advance_sink(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    stream: &StreamId,
    partition: Partition,
    from: u64,
    to: Seq,
    more: bool,
) -> Result<bool> {
    validate_advance(from, to, more)?;
    let what = "advancing a sink checkpoint";
    let d = db.dialect();
    let args = [
        Arg::Text(sink.as_str()),
        Arg::Text(stream.as_str()),
        Arg::Int(i64::from(partition.get())),
        Arg::Int(int(from)),
        Arg::Int(to.as_i64()),
    ];
    let mut tx = db.begin().await?;
    let n = if more {
        let sql = if from == 0 {
            "INSERT INTO outbox_sink_streams (sink, stream, partition_no, seq, status, attempt_count, \
             next_attempt_at, last_error, updated_at) VALUES ($1, $2, $3, $5, 'failed', 0, {now}, NULL, {now}) \
             ON CONFLICT (sink, stream) DO UPDATE SET seq = excluded.seq, status = 'failed', \
             next_attempt_at = excluded.next_attempt_at, updated_at = excluded.updated_at, \
             partition_no = excluded.partition_no WHERE outbox_sink_streams.seq = $4"
        } else {
            "UPDATE outbox_sink_streams SET seq = $5, status = 'failed', next_attempt_at = {now}, \
             updated_at = {now}, partition_no = $3 WHERE sink = $1 AND stream = $2 AND seq = $4"
        };
        tx.execute(what, &d.sql(sql), &args).await?
    } else {
        // No state yet reads as `ok` at 0.
        let mut n = if from == 0 {
            tx.execute(
                what,
                &d.sql(
                    "INSERT INTO outbox_sink_streams (sink, stream, partition_no, seq, status, attempt_count, \
                     next_attempt_at, last_error, updated_at) VALUES ($1, $2, $3, $5, 'ok', 0, {now}, NULL, {now}) \
                     ON CONFLICT (sink, stream) DO NOTHING",
                ),
                &args,
            )
            .await?
        } else {
            0
        };
        if n == 0 {
            n = tx
                .execute(
                    what,
                    &d.sql(
                        "UPDATE outbox_sink_streams SET seq = $5, attempt_count = 0, last_error = NULL, \
                         updated_at = {now}, partition_no = $3 \
                         WHERE sink = $1 AND stream = $2 AND seq = $4 AND status = 'ok'",
                    ),
                    &args,
                )
                .await?;
        }
        if n == 0 {
            crate::journal::lock_stream(db, &mut *tx, stream.as_str()).await?;
            let caught = "$5 >= COALESCE((SELECT max(seq) FROM events WHERE stream = $2), 0)";
            let sql = "UPDATE outbox_sink_streams SET seq = $5, \
                 status = CASE WHEN {caught} THEN 'ok' ELSE status END, \
                 attempt_count = CASE WHEN {caught} THEN 0 ELSE attempt_count END, \
                 last_error = CASE WHEN {caught} THEN NULL ELSE last_error END, \
                 next_attempt_at = CASE WHEN {caught} OR status <> 'failed' THEN next_attempt_at ELSE {now} END, \
                 updated_at = {now}, partition_no = $3 WHERE sink = $1 AND stream = $2 AND seq = $4"
                .replace("{caught}", caught);
            n = tx.execute(what, &d.sql(&sql), &args).await?;
        }
        n
    };
    tx.commit(what).await?;
    Ok(n > 0)
}

/// [`SinkStore::hold_sink`](outbox_core::SinkStore::hold_sink): an upsert
/// that changes only an `ok` state, and the state read back, in one
/// transaction.
pub async fn hold_sink(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    stream: &StreamId,
    partition: Partition,
    at: u64,
) -> Result<SinkStream> {
    let what = "holding a consumer's stream";
    let d = db.dialect();
    let keys = [Arg::Text(sink.as_str()), Arg::Text(stream.as_str())];
    let mut tx = db.begin().await?;
    tx.execute(
        what,
        &d.sql(
            "INSERT INTO outbox_sink_streams (sink, stream, partition_no, seq, status, attempt_count, \
             next_attempt_at, last_error, updated_at) VALUES ($1, $2, $3, $4, 'failed', 0, {now}, NULL, {now}) \
             ON CONFLICT (sink, stream) DO UPDATE SET seq = excluded.seq, status = 'failed', attempt_count = 0, \
             next_attempt_at = excluded.next_attempt_at, last_error = NULL, updated_at = excluded.updated_at, \
             partition_no = excluded.partition_no WHERE outbox_sink_streams.status = 'ok'",
        ),
        &[
            keys[0],
            keys[1],
            Arg::Int(i64::from(partition.get())),
            Arg::Int(int(at)),
        ],
    )
    .await?;
    let row = tx
        .fetch_optional(
            what,
            &d.sql(&format!(
                "SELECT {COLUMNS} FROM outbox_sink_streams WHERE sink = $1 AND stream = $2"
            )),
            &keys,
        )
        .await?
        .ok_or_else(|| Error::Storage {
            message: "holding a consumer's stream left no state".into(),
            temporary: false,
            source: None,
        })?;
    let state = decode(&row)?;
    tx.commit(what).await?;
    Ok(state)
}

/// [`SinkStore::fail_sink`](outbox_core::SinkStore::fail_sink): the state
/// read (locked on Postgres) and written in one transaction.
pub async fn fail_sink(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    stream: &StreamId,
    partition: Partition,
    seq: Seq,
    error: &str,
    policy: &RetryPolicy,
) -> Result<FailureOutcome> {
    let what = "recording a sink failure";
    let d = db.dialect();
    let lock = if d.locks_rows() { " FOR UPDATE" } else { "" };
    let mut tx = db.begin().await?;
    let keys = [Arg::Text(sink.as_str()), Arg::Text(stream.as_str())];
    let current = tx
        .fetch_optional(
            what,
            &d.sql(&format!(
                "SELECT seq, attempt_count FROM outbox_sink_streams WHERE sink = $1 AND stream = $2{lock}"
            )),
            &keys,
        )
        .await?;
    let (checkpoint, attempts) = match current {
        Some(r) => (
            u64::try_from(r.int(0)?).unwrap_or(0),
            u32::try_from(r.int(1)?).unwrap_or(0),
        ),
        None => (0, 0),
    };
    validate_failing(sink, stream, checkpoint, seq)?;
    let attempt = attempts.saturating_add(1);
    let (status, delay) = match policy.decide(attempt) {
        FailureDecision::DeadLetter => (SinkStatus::Dead, 0),
        FailureDecision::Retry(delay) => (SinkStatus::Failed, duration_millis(delay)),
    };
    let row = tx
        .fetch_optional(
            what,
            &d.sql(
                "INSERT INTO outbox_sink_streams (sink, stream, partition_no, seq, status, attempt_count, \
                 next_attempt_at, last_error, updated_at) VALUES ($1, $2, $3, $4, $5, $6, {now} + $7, $8, {now}) \
                 ON CONFLICT (sink, stream) DO UPDATE SET status = excluded.status, \
                 attempt_count = excluded.attempt_count, next_attempt_at = excluded.next_attempt_at, \
                 last_error = excluded.last_error, updated_at = excluded.updated_at, \
                 partition_no = excluded.partition_no \
                 RETURNING next_attempt_at",
            ),
            &[
                keys[0],
                keys[1],
                Arg::Int(i64::from(partition.get())),
                Arg::Int(int(checkpoint)),
                Arg::Text(status.as_str()),
                Arg::Int(i64::from(attempt)),
                Arg::Int(delay),
                Arg::Text(truncate_error(error)),
            ],
        )
        .await?
        .ok_or_else(|| Error::Storage {
            message: "recording a sink failure returned no row".into(),
            temporary: false,
            source: None,
        })?;
    tx.commit(what).await?;
    Ok(match status {
        SinkStatus::Dead => FailureOutcome::Dead { attempt },
        _ => FailureOutcome::Retry {
            attempt,
            next_attempt_at: Timestamp::from_millis(row.int(0)?),
        },
    })
}

/// [`SinkStore::due_sink_streams`](outbox_core::SinkStore::due_sink_streams):
/// a range of the partial index on failed streams per partition.
pub async fn due_sink_streams(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    partitions: &[Partition],
    limit: usize,
) -> Result<Vec<SinkStream>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let sql = db.dialect().sql(&format!(
        "SELECT {COLUMNS} FROM outbox_sink_streams WHERE sink = $1 AND partition_no = $2 \
         AND status = 'failed' AND next_attempt_at <= {{now}} ORDER BY next_attempt_at, stream LIMIT $3"
    ));
    let mut conn = db.read().await?;
    let mut out = Vec::new();
    for p in partitions {
        let rows = conn
            .fetch(
                "listing due sink streams",
                &sql,
                &[
                    Arg::Text(sink.as_str()),
                    Arg::Int(i64::from(p.get())),
                    Arg::Int(limit as i64),
                ],
            )
            .await?;
        for r in &rows {
            out.push(decode(r)?);
        }
    }
    out.sort_by(|a, b| (a.next_attempt_at, &a.stream).cmp(&(b.next_attempt_at, &b.stream)));
    out.truncate(limit);
    Ok(out)
}

/// [`SinkStore::sink_streams`](outbox_core::SinkStore::sink_streams).
pub async fn sink_streams(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    status: Option<SinkStatus>,
    limit: usize,
) -> Result<Vec<SinkStream>> {
    let limit = Arg::Int(validate_limit(limit, MAX_PAGE)? as i64);
    let (sql, args) = match status {
        // The status as a literal (from the closed set of names): the
        // failed streams' partial index is matched by the text, as in
        // `journal::list_statement`.
        Some(s) => (
            format!(
                "SELECT {COLUMNS} FROM outbox_sink_streams WHERE sink = $1 AND status = '{}' ORDER BY stream LIMIT $2",
                s.as_str()
            ),
            vec![Arg::Text(sink.as_str()), limit],
        ),
        None => (
            format!("SELECT {COLUMNS} FROM outbox_sink_streams WHERE sink = $1 ORDER BY stream LIMIT $2"),
            vec![Arg::Text(sink.as_str()), limit],
        ),
    };
    let mut conn = db.read().await?;
    let rows = conn
        .fetch("listing sink streams", &db.dialect().sql(&sql), &args)
        .await?;
    rows.iter().map(decode).collect()
}

/// [`SinkStore::requeue_sink`](outbox_core::SinkStore::requeue_sink).
pub async fn requeue_sink(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    stream: &StreamId,
) -> Result<SinkStream> {
    let what = "requeueing a sink stream";
    let d = db.dialect();
    let keys = [Arg::Text(sink.as_str()), Arg::Text(stream.as_str())];
    let mut tx = db.begin().await?;
    let row = tx
        .fetch_optional(
            what,
            &d.sql(&format!(
                "UPDATE outbox_sink_streams SET status = 'failed', attempt_count = 0, next_attempt_at = {{now}}, \
                 updated_at = {{now}} WHERE sink = $1 AND stream = $2 AND status <> 'ok' RETURNING {COLUMNS}"
            )),
            &keys,
        )
        .await?;
    let out = match row {
        Some(r) => decode(&r)?,
        None => {
            let exists = tx
                .fetch_optional(
                    what,
                    &d.sql("SELECT status FROM outbox_sink_streams WHERE sink = $1 AND stream = $2"),
                    &keys,
                )
                .await?;
            return Err(match exists {
                Some(_) => Error::InvalidState(format!(
                    "sink {sink} is not failing on stream {stream}: nothing to requeue"
                )),
                None => Error::NotFound(format!("sink {sink} has no state for stream {stream}")),
            });
        }
    };
    tx.commit(what).await?;
    Ok(out)
}

/// [`SinkFeed::sink_cursors`](outbox_core::SinkFeed::sink_cursors).
pub async fn sink_cursors(db: &(impl Database + ?Sized), sink: &SinkName) -> Result<Vec<(Partition, u64)>> {
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "reading sink cursors",
            &db.dialect()
                .sql("SELECT partition_no, position FROM outbox_sink_cursors WHERE sink = $1 ORDER BY partition_no"),
            &[Arg::Text(sink.as_str())],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let p = u16::try_from(r.int(0)?).map_err(|e| journal_undecodable("sink cursor", e))?;
            let pos = u64::try_from(r.int(1)?).map_err(|e| journal_undecodable("sink cursor", e))?;
            Ok((Partition::new(p), pos))
        })
        .collect()
}

/// [`SinkFeed::advance_sink_cursor`](outbox_core::SinkFeed::advance_sink_cursor).
pub async fn advance_sink_cursor(
    db: &(impl Database + ?Sized),
    sink: &SinkName,
    partition: Partition,
    from: u64,
    to: u64,
) -> Result<bool> {
    outbox_core::spi::validate_cursor_move(from, to)?;
    let what = "advancing a sink cursor";
    let sql = if from == 0 {
        "INSERT INTO outbox_sink_cursors (sink, partition_no, position) VALUES ($1, $2, $4) \
         ON CONFLICT (sink, partition_no) DO UPDATE SET position = excluded.position \
         WHERE outbox_sink_cursors.position = $3"
    } else {
        "UPDATE outbox_sink_cursors SET position = $4 WHERE sink = $1 AND partition_no = $2 AND position = $3"
    };
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            what,
            &db.dialect().sql(sql),
            &[
                Arg::Text(sink.as_str()),
                Arg::Int(i64::from(partition.get())),
                Arg::Int(int(from)),
                Arg::Int(int(to)),
            ],
        )
        .await?;
    tx.commit(what).await?;
    Ok(n > 0)
}

/// Each sink's states: (sink, streams, failed, dead, tag 0).
const SINK_STATES: &str = "SELECT sink, count(*), sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), \
     sum(CASE WHEN status = 'dead' THEN 1 ELSE 0 END), 0 FROM outbox_sink_streams GROUP BY sink";
/// Each sink's cursors: (sink, lowest position, partitions, NULL, tag 1).
const SINK_CURSORS: &str =
    "SELECT sink, min(position), count(*), NULL, 1 FROM outbox_sink_cursors GROUP BY sink";

/// [`SinkStore::sinks`](outbox_core::SinkStore::sinks).
pub async fn sinks(db: &(impl Database + ?Sized)) -> Result<Vec<SinkSummary>> {
    let what = "summarising sinks";
    let (states, cursors, held_back) = match db.dialect().feed() {
        // Positions in commit order (SQLite): nothing is held back, and
        // the states and cursors come in one statement, one snapshot, one
        // round trip (the monitor reads this on every page).
        None => {
            let mut conn = db.read().await?;
            let rows = conn
                .fetch(what, &format!("{SINK_STATES} UNION ALL {SINK_CURSORS}"), &[])
                .await?;
            drop(conn);
            let (states, cursors): (Vec<Row>, Vec<Row>) =
                rows.into_iter().partition(|r| r.int(4).is_ok_and(|tag| tag == 0));
            (states, cursors, 0)
        }
        Some(feed) => {
            let mut tx = db.snapshot().await?;
            let states = tx.fetch(what, SINK_STATES, &[]).await?;
            let cursors = tx.fetch(what, SINK_CURSORS, &[]).await?;
            let held_back = tx
                .fetch_optional(
                    what,
                    feed.held_back,
                    &[Arg::Int(SinkSummary::HELD_BACK_CAP as i64)],
                )
                .await?
                .map_or(Ok(0), |r| r.int(0))?;
            tx.commit(what).await?;
            (states, cursors, held_back)
        }
    };
    let mut out: std::collections::BTreeMap<String, SinkSummary> = std::collections::BTreeMap::new();
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let held_back = n(held_back);
    for r in &states {
        let name = r.text(0)?;
        let sink = SinkName::new(name.clone()).map_err(|e| journal_undecodable("sink state", e))?;
        out.insert(
            name,
            SinkSummary {
                sink,
                streams: n(r.int(1)?),
                failed: n(r.opt_int(2)?.unwrap_or(0)),
                dead: n(r.opt_int(3)?.unwrap_or(0)),
                position: 0,
                held_back,
            },
        );
    }
    for r in &cursors {
        let name = r.text(0)?;
        let sink = SinkName::new(name.clone()).map_err(|e| journal_undecodable("sink cursor", e))?;
        let entry = out.entry(name).or_insert(SinkSummary {
            sink,
            streams: 0,
            failed: 0,
            dead: 0,
            position: 0,
            held_back,
        });
        entry.position = n(r.int(1)?);
    }
    Ok(out.into_values().collect())
}

/// Why the feed refuses to read a journal whose keys are another server's:
/// a logical restore into a new server keeps the stored transaction ids,
/// which the new server's own may stay below for a long time, so a cursor
/// above every new event would skip them all.
pub const FOREIGN_KEYS: &str = "the journal's events or sink cursors carry transaction ids of another Postgres \
     server (restored from a logical dump?): the sinks cannot read it in commit order until it is re-keyed \
     with `outbox sinks rekey` (see the runbook, \"Sinks\"); nothing is published meanwhile, nothing is lost";

/// [`SinkFeed::read_feed`](outbox_core::SinkFeed::read_feed). Where the
/// dialect takes global positions in commit order, the feed is
/// `read_global` and its keys are positions. Otherwise (Postgres) the keys
/// are transaction ids: the page ends below the oldest transaction still
/// open, so what commits later has a key above the page's `next`; and it
/// never splits one transaction's events, so `next` can be that
/// transaction's id (ADR 0030). Keys of another server are refused
/// ([`FOREIGN_KEYS`]).
pub async fn read_feed<J: EventJournal + ?Sized>(
    journal: &J,
    db: &(impl Database + ?Sized),
    after: u64,
    limit: usize,
) -> Result<FeedPage> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let Some(feed) = db.dialect().feed() else {
        let events = journal.read_global(after, limit).await?;
        let next = events.last().map_or(after, |e| e.global_position);
        return Ok(FeedPage {
            events: events.into_iter().map(|e| (e.global_position, e)).collect(),
            next,
        });
    };
    let what = "reading the journal in visibility order";
    let mut conn = db.read().await?;
    let bound = conn
        .fetch_optional(
            what,
            &db.dialect().sql(feed.bound),
            &[Arg::Int(int(after)), Arg::Int(int(limit as u64))],
        )
        .await?
        .ok_or_else(|| {
            Error::storage(
                format!("{what}: no horizon"),
                "the bound statement returned no row",
            )
        })?;
    if bound.int(2)? != 0 {
        return Err(Error::InvalidState(FOREIGN_KEYS.into()));
    }
    let key = |v: i64| u64::try_from(v).map_err(|e| journal_undecodable("feed key", e));
    let horizon = key(bound.int(0)?)?;
    let upper = match bound.opt_int(1)? {
        Some(cut) => key(cut)?,
        None => horizon.saturating_sub(1),
    };
    if upper <= after {
        return Ok(FeedPage {
            events: Vec::new(),
            next: after,
        });
    }
    let rows = conn
        .fetch(
            what,
            &db.dialect().sql(feed.page),
            &[Arg::Int(int(after)), Arg::Int(int(upper))],
        )
        .await?;
    let mut events = Vec::with_capacity(rows.len());
    for r in &rows {
        events.push((key(r.int(10)?)?, crate::journal::decode_any_event(r)?));
    }
    Ok(FeedPage { events, next: upper })
}
