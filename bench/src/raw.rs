//! The raw engine loop: the same work as the outbox, written directly
//! against SQLite's C API through rusqlite, on a schema of the same shape
//! (events, outbox rows keyed by (stream, seq), stream heads, leases; a
//! projection file with checkpoints and one row per stream).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use outbox_core::PayloadHash;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::fixture::payload;

const JOURNAL_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    global_position INTEGER PRIMARY KEY AUTOINCREMENT,
    stream      TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    event_type  TEXT    NOT NULL,
    payload     BLOB    NOT NULL,
    hash        BLOB    NOT NULL,
    recorded_at INTEGER NOT NULL,
    UNIQUE (stream, seq)
);
CREATE TABLE IF NOT EXISTS streams (
    stream TEXT PRIMARY KEY,
    head   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    stream          TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    status          TEXT    NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    stream     TEXT PRIMARY KEY,
    owner      TEXT,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;
";

const PROJECTION_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS checkpoints (
    stream TEXT PRIMARY KEY,
    last   INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rows (
    stream TEXT PRIMARY KEY,
    value  TEXT NOT NULL
) WITHOUT ROWID;
";

/// Opens `path` as the outbox does: WAL, synchronous=FULL.
pub(crate) fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    ensure!(mode.eq_ignore_ascii_case("wal"), "journal_mode is {mode}");
    // Statement journals in memory, as the outbox's connections keep them.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF; PRAGMA temp_store = MEMORY;")?;
    conn.set_prepared_statement_cache_capacity(64);
    // As the outbox's engine does: cached statements with a bound LIMIT are
    // not parsed and planned again at every new binding.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The raw journal.
pub(crate) struct Journal {
    pub(crate) conn: Connection,
    next_payload: u64,
}

impl Journal {
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let conn = open(&dir.join("raw-journal.db"))?;
        conn.execute_batch(JOURNAL_SCHEMA)?;
        Ok(Journal {
            conn,
            next_payload: 0,
        })
    }

    /// One transaction: for each `(stream, n)`, read the head, insert `n`
    /// event rows and `n` outbox rows, upsert the head.
    pub(crate) fn append(&mut self, requests: &[(&str, u64)]) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut head_q = tx.prepare_cached("SELECT head FROM streams WHERE stream = ?1")?;
            let mut ins_event = tx.prepare_cached(
                "INSERT INTO events (stream, seq, event_type, payload, hash, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut ins_outbox = tx.prepare_cached(
                "INSERT INTO outbox (stream, seq, status, next_attempt_at) VALUES (?1, ?2, 'pending', ?3)",
            )?;
            let mut upsert_head = tx.prepare_cached(
                "INSERT INTO streams (stream, head) VALUES (?1, ?2) ON CONFLICT (stream) DO UPDATE SET head = excluded.head",
            )?;
            let now = now_ms();
            for &(stream, n) in requests {
                let head: i64 = head_q.query_row([stream], |r| r.get(0)).optional()?.unwrap_or(0);
                for k in 1..=n as i64 {
                    let p = payload(self.next_payload);
                    self.next_payload += 1;
                    let hash = PayloadHash::of(&p);
                    ins_event.execute(params![stream, head + k, "bench_event", p, &hash.0[..], now])?;
                    ins_outbox.execute(params![stream, head + k, now])?;
                }
                upsert_head.execute(params![stream, head + n as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Claim cost, the outbox's four calls on one stream's head: take the
    /// lease, mark the head run of up to `max` rows processing, put them
    /// back, release the lease; one transaction each. Returns rows claimed.
    pub(crate) fn claim_cycle(&mut self, stream: &str, max: i64) -> Result<usize> {
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let epoch: i64 = tx.prepare_cached(
            "INSERT INTO leases (stream, owner, epoch, expires_at) VALUES (?1, 'bench', 1, ?2 + 30000)
             ON CONFLICT (stream) DO UPDATE SET owner = 'bench', epoch = epoch + 1, expires_at = excluded.expires_at
             WHERE leases.owner IS NULL OR leases.expires_at <= ?2 OR leases.owner = 'bench'
             RETURNING epoch",
        )?
        .query_row(params![stream, now], |r| r.get(0))?;
        tx.commit()?;

        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let claimed = {
            let owner: Option<String> = tx
                .prepare_cached(
                    "SELECT owner FROM leases WHERE stream = ?1 AND epoch = ?2 AND expires_at > ?3",
                )?
                .query_row(params![stream, epoch, now], |r| r.get(0))
                .optional()?
                .flatten();
            ensure!(owner.as_deref() == Some("bench"), "raw lease lost");
            claim_run(&tx, stream, now, max)?.len()
        };
        tx.commit()?;

        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "UPDATE outbox SET status = 'pending' WHERE stream = ?1 AND status = 'processing'",
        )?
        .execute([stream])?;
        tx.commit()?;

        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "UPDATE leases SET owner = NULL WHERE stream = ?1 AND epoch = ?2 AND owner = 'bench'",
        )?
        .execute(params![stream, epoch])?;
        tx.commit()?;
        Ok(claimed)
    }
}

/// The raw projection file.
pub(crate) struct Projection {
    pub(crate) conn: Connection,
}

impl Projection {
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let conn = open(&dir.join("raw-projection.db"))?;
        conn.execute_batch(PROJECTION_SCHEMA)?;
        Ok(Projection { conn })
    }

    /// The oracle: each stream's row is at its head.
    pub(crate) fn verify(&self, streams: &[String], heads: &[u64]) -> Result<()> {
        let mut st = self.conn.prepare("SELECT value FROM rows WHERE stream = ?1")?;
        for (s, &head) in streams.iter().zip(heads) {
            let v: Option<String> = st.query_row([s], |r| r.get(0)).optional()?;
            let want = doc(head as i64, crate::fixture::PAYLOAD_BYTES);
            ensure!(
                v.as_deref() == Some(want.as_str()),
                "RAW ORACLE FAILED: stream {s}: appended {head}, row {v:?}"
            );
        }
        Ok(())
    }
}

fn doc(seq: i64, bytes: usize) -> String {
    format!("{{\"seq\":{seq},\"bytes\":{bytes}}}")
}

/// Marks the head run of `stream` (at most `max` pending, due rows)
/// processing; returns its seqs in order.
fn claim_run(tx: &Connection, stream: &str, now: i64, max: i64) -> Result<Vec<i64>> {
    let mut st = tx.prepare_cached(
        "UPDATE outbox SET status = 'processing' WHERE stream = ?1 AND seq IN
           (SELECT seq FROM outbox WHERE stream = ?1 AND status = 'pending' AND next_attempt_at <= ?2
            ORDER BY seq LIMIT ?3)
         RETURNING seq",
    )?;
    let rows = st.query_map(params![stream, now, max], |r| r.get::<_, i64>(0))?;
    let mut v = rows.collect::<rusqlite::Result<Vec<i64>>>()?;
    v.sort_unstable();
    Ok(v)
}

/// The events `first..=last` of `stream`: (seq, payload).
fn load_run(conn: &Connection, stream: &str, first: i64, last: i64) -> Result<Vec<(i64, Vec<u8>)>> {
    let mut st = conn.prepare_cached(
        "SELECT seq, payload FROM events WHERE stream = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
    )?;
    let rows = st.query_map(params![stream, first, last], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let events: Vec<(i64, Vec<u8>)> = rows.collect::<rusqlite::Result<_>>()?;
    ensure!(
        events.len() as i64 == last - first + 1,
        "raw: events missing for {stream}"
    );
    Ok(events)
}

/// Applies a run inside the projection transaction: checkpoint
/// compare-and-set, one upsert per event.
fn apply_run(tx: &Connection, stream: &str, events: &[(i64, Vec<u8>)]) -> Result<()> {
    let (first, last) = (events[0].0, events[events.len() - 1].0);
    let cas = tx
        .prepare_cached("UPDATE checkpoints SET last = ?1 WHERE stream = ?2 AND last = ?3")?
        .execute(params![last, stream, first - 1])?;
    if cas == 0 {
        ensure!(first == 1, "raw: checkpoint of {stream} is not at {}", first - 1);
        tx.prepare_cached("INSERT INTO checkpoints (stream, last) VALUES (?1, ?2)")?
            .execute(params![stream, last])?;
    }
    let mut up = tx.prepare_cached(
        "INSERT INTO rows (stream, value) VALUES (?1, ?2) ON CONFLICT (stream) DO UPDATE SET value = excluded.value",
    )?;
    for (seq, payload) in events {
        up.execute(params![stream, doc(*seq, payload.len())])?;
    }
    Ok(())
}

/// Deletes the claimed rows of `stream` through `last` (the ack).
fn ack(tx: &Connection, stream: &str, last: i64) -> Result<()> {
    tx.prepare_cached("DELETE FROM outbox WHERE stream = ?1 AND seq <= ?2 AND status = 'processing'")?
        .execute(params![stream, last])?;
    Ok(())
}

/// Whether `stream` still has rows after a run of `n` of at most `batch`.
fn has_more(j: &Journal, stream: &str, n: usize, batch: i64) -> Result<bool> {
    if n as i64 == batch {
        return Ok(true);
    }
    Ok(j.conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM outbox WHERE stream = ?1)")?
        .query_row([stream], |r| r.get(0))?)
}

/// Drains every pending row, streams round robin, at most `batch` rows per
/// stream per turn: claim (journal txn), read the events, apply with a
/// checkpoint compare-and-set (projection txn), delete (journal txn).
/// Returns the events applied.
pub(crate) fn drain(j: &mut Journal, p: &mut Projection, streams: &[String], batch: i64) -> Result<u64> {
    let mut live: Vec<&str> = streams.iter().map(String::as_str).collect();
    let mut applied = 0u64;
    while !live.is_empty() {
        let mut still = Vec::with_capacity(live.len());
        for stream in live {
            let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let seqs = claim_run(&tx, stream, now_ms(), batch)?;
            tx.commit()?;
            let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
                continue;
            };
            let events = load_run(&j.conn, stream, first, last)?;
            let tx = p.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            apply_run(&tx, stream, &events)?;
            tx.commit()?;
            let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            ack(&tx, stream, last)?;
            tx.commit()?;
            applied += events.len() as u64;
            if has_more(j, stream, events.len(), batch)? {
                still.push(stream);
            }
        }
        live = still;
    }
    Ok(applied)
}

/// Drains every pending row in sweeps, the outbox's default shape: one
/// journal transaction claims the head runs (at most `batch` rows each) of
/// the next live streams, round robin, until `max_streams` streams or
/// `sweep_rows` rows; the events are read; one projection transaction
/// applies every run with its checkpoint compare-and-set; one journal
/// transaction deletes them all. Returns the events applied.
pub(crate) fn drain_sweep(
    j: &mut Journal,
    p: &mut Projection,
    streams: &[String],
    batch: i64,
    sweep_rows: i64,
    max_streams: usize,
) -> Result<u64> {
    let mut live: std::collections::VecDeque<&str> = streams.iter().map(String::as_str).collect();
    let mut applied = 0u64;
    while !live.is_empty() {
        let now = now_ms();
        let mut taken: Vec<(&str, Vec<i64>)> = Vec::new();
        let mut rows = 0i64;
        let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        while taken.len() < max_streams && rows < sweep_rows {
            let Some(stream) = live.pop_front() else { break };
            let seqs = claim_run(&tx, stream, now, batch.min(sweep_rows - rows))?;
            if !seqs.is_empty() {
                rows += seqs.len() as i64;
                taken.push((stream, seqs));
            }
        }
        tx.commit()?;
        let mut runs = Vec::with_capacity(taken.len());
        for (stream, seqs) in &taken {
            runs.push(load_run(&j.conn, stream, seqs[0], seqs[seqs.len() - 1])?);
        }
        let tx = p.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for ((stream, _), events) in taken.iter().zip(&runs) {
            apply_run(&tx, stream, events)?;
        }
        tx.commit()?;
        let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for (stream, seqs) in &taken {
            ack(&tx, stream, seqs[seqs.len() - 1])?;
        }
        tx.commit()?;
        for (stream, seqs) in taken {
            applied += seqs.len() as u64;
            if has_more(j, stream, seqs.len(), batch)? {
                live.push_back(stream);
            }
        }
    }
    Ok(applied)
}
