//! The transactional append on the caller's own `sqlx` connection
//! ([`SqliteJournal::append_in`](crate::SqliteJournal::append_in)): the one
//! journal write that does not run on the engine, because it joins the
//! caller's transaction. The same statements as the engine's append.

use std::collections::HashMap;

use outbox_core::spi::plan_append;
use outbox_core::{
    AppendOptions, AppendRequest, Appended, Partitioning, PayloadHash, Result, Seq, StreamId, Timestamp,
};
use sqlx::SqliteConnection;

use crate::clock::Clock;
use crate::db::storage;
use crate::statements::{INSERT_EVENT, INSERT_HEAD, INSERT_ROW, READ_VERSION, UPSERT_STREAM};

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The append itself, inside a transaction: checks every expected version
/// first (nothing is written on a conflict), then writes.
pub(crate) async fn append_tx(
    conn: &mut SqliteConnection,
    batch: &[AppendRequest],
    options: AppendOptions,
    partitioning: &Partitioning,
    clock: Clock,
) -> Result<Vec<Appended>> {
    let err = |e| storage("appending events", e);
    let mut current: HashMap<&StreamId, u64> = HashMap::new();
    for req in batch {
        if !current.contains_key(&req.stream) {
            let h: Option<i64> = sqlx::query_scalar(READ_VERSION)
                .bind(req.stream.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(err)?;
            current.insert(&req.stream, u64::try_from(h.unwrap_or(0)).unwrap_or(0));
        }
    }
    let plan = plan_append(batch, |s| current[s])?;
    // The caller's own connection may not have the clock view: the query
    // is the view's expression itself.
    let now: i64 = sqlx::query_scalar(crate::clock::now_query(clock))
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    let mut out = Vec::with_capacity(batch.len());
    for (req, &first) in batch.iter().zip(&plan.firsts) {
        let partition = i64::from(partitioning.of(&req.stream).get());
        let mut first_global = None;
        for (i, e) in req.events.iter().enumerate() {
            let seq = seq_i64(first + i as u64);
            let done = sqlx::query(INSERT_EVENT)
                .bind(req.stream.as_str())
                .bind(seq)
                .bind(e.event_type.as_str())
                .bind(e.intent.as_str())
                .bind(e.payload.as_slice())
                .bind(PayloadHash::of(&e.payload).0.to_vec())
                .bind(now)
                .bind(e.metadata.correlation_id.as_deref())
                .bind(e.metadata.causation_id.as_deref())
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            first_global.get_or_insert(done.last_insert_rowid());
            if options.enqueues() {
                sqlx::query(INSERT_ROW)
                    .bind(req.stream.as_str())
                    .bind(seq)
                    .bind(e.event_type.as_str())
                    .bind(now)
                    .bind(partition)
                    .execute(&mut *conn)
                    .await
                    .map_err(err)?;
            }
        }
        if options.enqueues() {
            sqlx::query(INSERT_HEAD)
                .bind(req.stream.as_str())
                .bind(seq_i64(first))
                .bind(now)
                .bind(partition)
                .execute(&mut *conn)
                .await
                .map_err(err)?;
        }
        out.push(Appended {
            stream: req.stream.clone(),
            first_seq: Seq::new(first)?,
            last_seq: Seq::new(first + req.events.len() as u64 - 1)?,
            first_global_position: u64::try_from(first_global.unwrap_or(0)).unwrap_or(0),
            recorded_at: Timestamp::from_millis(now),
        });
    }
    for (stream, version) in &plan.after {
        sqlx::query(UPSERT_STREAM)
            .bind(stream.as_str())
            .bind(seq_i64(*version))
            .execute(&mut *conn)
            .await
            .map_err(err)?;
    }
    Ok(out)
}
