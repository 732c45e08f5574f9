//! The append: its statements and its body, run on the engine's writer
//! inside a transaction, by the journal's append (`journal.rs`) and by an
//! append inside the application's own transaction (`journal_tx.rs`).

use std::collections::HashMap;

use outbox_core::spi::plan_append;
use outbox_core::{AppendRequest, Appended, Partitioning, PayloadHash, Result, Seq, StreamId, Timestamp};
use rusqlite::{Connection, params};

use crate::engine::engine_error;

/// What the append body needs besides the batch, computed off the writer
/// thread where it can be: every event's payload hash, in order, and each
/// request's partition.
pub(crate) fn append_inputs(
    batch: &[AppendRequest],
    partitioning: &Partitioning,
) -> (Vec<PayloadHash>, Vec<i64>) {
    let hashes = batch
        .iter()
        .flat_map(|r| r.events.iter().map(|e| PayloadHash::of(&e.payload)))
        .collect();
    let partitions = batch
        .iter()
        .map(|r| i64::from(partitioning.of(&r.stream).get()))
        .collect();
    (hashes, partitions)
}

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stream's version: its last seq, from the events' `(stream, seq)`
/// index; NULL for a stream with no events.
pub(crate) const READ_VERSION: &str = "SELECT max(seq) FROM events WHERE stream = ?1";

/// One event.
pub(crate) const INSERT_EVENT: &str = "INSERT INTO events (stream, seq, event_type, intent, payload, \
     payload_hash, recorded_at, correlation_id, causation_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// One event's outbox row, pending and due at `?4` (the append's time), in
/// partition `?5`.
pub(crate) const INSERT_ROW: &str = "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, \
     next_attempt_at, last_error, updated_at, partition_no) VALUES (?1, ?2, ?3, 'pending', 0, ?4, NULL, ?4, ?5)";

/// The stream's outbox head: new rows are behind any existing ones, so an
/// existing head stays.
pub(crate) const INSERT_HEAD: &str = "INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (stream) DO NOTHING";

/// The append itself, inside the engine's transaction: checks every
/// expected version first (nothing is written on a conflict), then writes
/// one statement per event (two when enqueued) and one per stream's outbox
/// head, all prepared once and reused. The events are the versions: no
/// other table repeats a stream's last seq.
pub(crate) fn append_body(
    conn: &Connection,
    batch: &[AppendRequest],
    hashes: &[PayloadHash],
    partitions: &[i64],
    enqueue: bool,
) -> Result<Vec<Appended>> {
    let err = |e| engine_error("appending events", e);
    let mut current: HashMap<&StreamId, u64> = HashMap::new();
    {
        let mut read_version = conn.prepare_cached(READ_VERSION).map_err(&err)?;
        for req in batch {
            if !current.contains_key(&req.stream) {
                let h: Option<i64> = read_version
                    .query_row([req.stream.as_str()], |r| r.get(0))
                    .map_err(&err)?;
                current.insert(&req.stream, u64::try_from(h.unwrap_or(0)).unwrap_or(0));
            }
        }
    }
    let plan = plan_append(batch, |s| current[s])?;

    let now = crate::clock::now(conn).map_err(&err)?;
    let mut insert_event = conn.prepare_cached(INSERT_EVENT).map_err(&err)?;
    let mut insert_row = conn.prepare_cached(INSERT_ROW).map_err(&err)?;
    let mut insert_head = conn.prepare_cached(INSERT_HEAD).map_err(&err)?;
    let mut out = Vec::with_capacity(batch.len());
    let mut hashes = hashes.iter();
    for ((req, &first), &partition) in batch.iter().zip(&plan.firsts).zip(partitions) {
        let mut first_global = None;
        for (i, e) in req.events.iter().enumerate() {
            let seq = seq_i64(first + i as u64);
            let hash = hashes.next().expect("one hash per event");
            insert_event
                .execute(params![
                    req.stream.as_str(),
                    seq,
                    e.event_type.as_str(),
                    e.intent.as_str(),
                    e.payload.as_slice(),
                    hash.0.as_slice(),
                    now,
                    e.metadata.correlation_id.as_deref(),
                    e.metadata.causation_id.as_deref(),
                ])
                .map_err(&err)?;
            first_global.get_or_insert(conn.last_insert_rowid());
            if enqueue {
                insert_row
                    .execute(params![
                        req.stream.as_str(),
                        seq,
                        e.event_type.as_str(),
                        now,
                        partition
                    ])
                    .map_err(&err)?;
            }
        }
        if enqueue {
            insert_head
                .execute(params![req.stream.as_str(), seq_i64(first), now, partition])
                .map_err(&err)?;
        }
        let last = first + req.events.len() as u64 - 1;
        out.push(Appended {
            stream: req.stream.clone(),
            first_seq: Seq::new(first)?,
            last_seq: Seq::new(last)?,
            first_global_position: u64::try_from(first_global.unwrap_or(0)).unwrap_or(0),
            recorded_at: Timestamp::from_millis(now),
        });
    }
    Ok(out)
}
