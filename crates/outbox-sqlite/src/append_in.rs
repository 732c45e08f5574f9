//! The transactional append on the caller's own `sqlx` connection
//! ([`SqliteJournal::append_in`](crate::SqliteJournal::append_in)): the one
//! journal write that does not run on the engine, because it joins the
//! caller's transaction.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use outbox_core::{AppendOptions, AppendRequest, Appended, Error, PayloadHash, Result, Seq, StreamId, Timestamp};
use sqlx::{AssertSqlSafe, SqliteConnection};

use crate::db::{now_ms, storage};

fn seq_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn now(conn: &mut SqliteConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar(concat!("SELECT ", now_ms!()))
        .fetch_one(&mut *conn)
        .await
}

/// The largest number of events inserted by one statement.
const CHUNK: usize = 64;

/// `INSERT INTO events` statements for 1, 2, 4, ..., 64 rows, so a batch of
/// any size uses at most seven distinct (cached) statements.
static EVENT_INSERTS: LazyLock<Vec<Arc<str>>> = LazyLock::new(|| {
    (0..=CHUNK.trailing_zeros())
        .map(|k| {
            let rows = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?)"; 1 << k].join(", ");
            Arc::from(format!(
                "INSERT INTO events (stream, seq, event_type, intent, payload, payload_hash, recorded_at, \
                 correlation_id, causation_id) VALUES {rows}"
            ))
        })
        .collect()
});

/// Splits `n` into chunk sizes: full chunks, then the binary digits of the rest.
fn chunks(n: usize) -> impl Iterator<Item = usize> {
    let full = n / CHUNK;
    let rest = n % CHUNK;
    std::iter::repeat_n(CHUNK, full).chain(
        (0..CHUNK.trailing_zeros())
            .rev()
            .map(|k| 1usize << k)
            .filter(move |b| rest & b != 0),
    )
}

/// The append itself, inside a transaction: checks every expected version
/// first (nothing is written on a conflict), then writes.
pub(crate) async fn append_tx(
    conn: &mut SqliteConnection,
    batch: &[AppendRequest],
    options: AppendOptions,
) -> Result<Vec<Appended>> {
    let err = |e| storage("appending events", e);
    let mut start: HashMap<&StreamId, u64> = HashMap::new();
    let mut heads: HashMap<&StreamId, u64> = HashMap::new();
    for req in batch {
        let actual = match heads.get(&req.stream) {
            Some(h) => *h,
            None => {
                let h: Option<i64> = sqlx::query_scalar("SELECT head FROM streams WHERE stream = ?1")
                    .bind(req.stream.as_str())
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(err)?;
                let h = u64::try_from(h.unwrap_or(0)).unwrap_or(0);
                start.insert(&req.stream, h);
                h
            }
        };
        if !req.expected.matches(actual) {
            return Err(req.expected.conflict(&req.stream, actual));
        }
        let next = actual + req.events.len() as u64;
        if next > Seq::MAX.get() {
            return Err(Error::invalid(format_args!(
                "stream {} would exceed the largest seq",
                req.stream
            )));
        }
        heads.insert(&req.stream, next);
    }

    let now = now(conn).await.map_err(err)?;
    let mut out = Vec::with_capacity(batch.len());
    for req in batch {
        let head = start.get_mut(&req.stream).expect("read above");
        let first = *head + 1;
        let mut first_global = None;
        let mut i = 0usize;
        for n in chunks(req.events.len()) {
            let sql = Arc::clone(&EVENT_INSERTS[n.trailing_zeros() as usize]);
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for (j, e) in req.events[i..i + n].iter().enumerate() {
                q = q
                    .bind(req.stream.as_str())
                    .bind(seq_i64(first + (i + j) as u64))
                    .bind(e.event_type.as_str())
                    .bind(e.intent.as_str())
                    .bind(e.payload.as_slice())
                    .bind(PayloadHash::of(&e.payload).0.to_vec())
                    .bind(now)
                    .bind(e.metadata.correlation_id.as_deref())
                    .bind(e.metadata.causation_id.as_deref());
            }
            let done = q.execute(&mut *conn).await.map_err(err)?;
            // AUTOINCREMENT under the write lock: one statement's rows get
            // consecutive positions ending at last_insert_rowid.
            first_global.get_or_insert(done.last_insert_rowid() - n as i64 + 1);
            i += n;
        }
        let last = first + req.events.len() as u64 - 1;
        if options.enqueues() {
            sqlx::query(
                "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, next_attempt_at, \
                 last_error, updated_at) \
                 SELECT stream, seq, event_type, 'pending', 0, ?4, NULL, ?4 FROM events \
                 WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3",
            )
            .bind(req.stream.as_str())
            .bind(seq_i64(first))
            .bind(seq_i64(last))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
            // New rows are behind any existing ones: an existing head stays.
            sqlx::query(
                "INSERT INTO outbox_heads (stream, head_seq, due_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (stream) DO NOTHING",
            )
            .bind(req.stream.as_str())
            .bind(seq_i64(first))
            .bind(now)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        }
        *head = last;
        out.push(Appended {
            stream: req.stream.clone(),
            first_seq: Seq::new(first)?,
            last_seq: Seq::new(last)?,
            first_global_position: u64::try_from(first_global.unwrap_or(0)).unwrap_or(0),
            recorded_at: Timestamp::from_millis(now),
        });
    }
    for (stream, head) in &start {
        sqlx::query(
            "INSERT INTO streams (stream, head) VALUES (?1, ?2) \
             ON CONFLICT (stream) DO UPDATE SET head = excluded.head",
        )
        .bind(stream.as_str())
        .bind(seq_i64(*head))
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    }
    Ok(out)
}

