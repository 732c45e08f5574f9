//! The raw engine loop: what a careful engineer writes by hand, directly
//! against SQLite's C API through rusqlite, for the outbox's guarantee and
//! nothing more (issue 43): an event and its outbox row in one transaction,
//! the stream's version checked against its unique index; a claim that
//! takes a stream's first rows only when its first row is free (one
//! statement, with the lease's end and a retry's due time in one column);
//! the apply with a checkpoint compare-and-set (one statement) and the
//! projection's own writes; the claimed rows deleted. No statement exists
//! here because of the outbox's design (no versions table, no payload hash,
//! no lease table), and the durability is the outbox's on every commit:
//! appends and projection commits at `synchronous = FULL`, claims and
//! deletes at `NORMAL` (a lost claim or delete is redone and the checkpoint
//! refuses the second apply, as the outbox's ADR 0027 argues for its own).

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, ensure};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::fixture::payload;

const JOURNAL_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    position    INTEGER PRIMARY KEY,
    stream      TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    event_type  TEXT    NOT NULL,
    payload     BLOB    NOT NULL,
    recorded_at INTEGER NOT NULL,
    UNIQUE (stream, seq)
);
CREATE TABLE IF NOT EXISTS outbox (
    stream       TEXT    NOT NULL,
    seq          INTEGER NOT NULL,
    available_at INTEGER NOT NULL,
    PRIMARY KEY (stream, seq)
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

/// How long a claim holds its rows (the lease), in ms.
const CLAIM_MS: i64 = 30_000;

/// Opens `path` in WAL mode at `synchronous = FULL` (the outbox's default).
pub(crate) fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    ensure!(mode.eq_ignore_ascii_case("wal"), "journal_mode is {mode}");
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF; PRAGMA temp_store = MEMORY;")?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Sets the connection's durability for the transactions that follow.
fn durability(conn: &Connection, full: bool) -> Result<()> {
    conn.execute_batch(if full {
        "PRAGMA synchronous = FULL"
    } else {
        "PRAGMA synchronous = NORMAL"
    })?;
    Ok(())
}

/// The raw journal.
pub(crate) struct Journal {
    pub(crate) conn: Connection,
    next_payload: u64,
    /// Whether the connection is at `FULL` now (appends) or `NORMAL`
    /// (claims and deletes).
    full: bool,
}

impl Journal {
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let conn = open(&dir.join("raw-journal.db"))?;
        conn.execute_batch(JOURNAL_SCHEMA)?;
        Ok(Journal {
            conn,
            next_payload: 0,
            full: true,
        })
    }

    fn set_full(&mut self, full: bool) -> Result<()> {
        if self.full != full {
            durability(&self.conn, full)?;
            self.full = full;
        }
        Ok(())
    }

    /// One transaction: for each `(stream, n)`, check the stream's version
    /// (its last seq, read from the unique index) and insert `n` events and
    /// their `n` outbox rows.
    pub(crate) fn append(&mut self, requests: &[(&str, u64)]) -> Result<()> {
        self.set_full(true)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        {
            let mut version = tx.prepare_cached("SELECT max(seq) FROM events WHERE stream = ?1")?;
            let mut ins_event = tx.prepare_cached(
                "INSERT INTO events (stream, seq, event_type, payload, recorded_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut ins_outbox =
                tx.prepare_cached("INSERT INTO outbox (stream, seq, available_at) VALUES (?1, ?2, ?3)")?;
            let now = now_ms();
            for &(stream, n) in requests {
                let version: i64 = version
                    .query_row([stream], |r| r.get::<_, Option<i64>>(0))?
                    .unwrap_or(0);
                for k in 1..=n as i64 {
                    let p = payload(self.next_payload);
                    self.next_payload += 1;
                    ins_event.execute(params![stream, version + k, "bench_event", p, now])?;
                    ins_outbox.execute(params![stream, version + k, now])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Claim cost: claim up to `max` rows of `stream`'s version, then give
    /// them back; one relaxed transaction each. Returns rows claimed.
    pub(crate) fn claim_cycle(&mut self, stream: &str, max: i64) -> Result<usize> {
        self.set_full(false)?;
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let seqs = claim_run(&tx, stream, now, max)?;
        tx.commit()?;
        let Some(&last) = seqs.last() else {
            return Ok(0);
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached("UPDATE outbox SET available_at = ?3 WHERE stream = ?1 AND seq <= ?2")?
            .execute(params![stream, last, now])?;
        tx.commit()?;
        Ok(seqs.len())
    }
}

/// A stream's claimed run: its seqs, in order.
pub(crate) type Run = (String, Vec<i64>);

/// A run's events: (seq, payload), in order.
pub(crate) type RunEvents = Vec<(i64, Vec<u8>)>;

impl Journal {
    /// One relaxed transaction: the runs (at most `batch` rows each) of at
    /// most `max_streams` streams with a due row, oldest due first, at most
    /// `sweep_rows` rows in all. Without a table of due streams, the due
    /// streams are read from the outbox rows themselves (few while the
    /// drain keeps up).
    pub(crate) fn claim_due(&mut self, max_streams: usize, batch: i64, sweep_rows: i64) -> Result<Vec<Run>> {
        self.set_full(false)?;
        let now = now_ms();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let streams: Vec<String> = tx
            .prepare_cached(
                "SELECT stream FROM outbox WHERE available_at <= ?1 GROUP BY stream ORDER BY min(available_at) LIMIT ?2",
            )?
            .query_map(params![now, max_streams as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let (mut runs, mut rows) = (Vec::new(), 0);
        for stream in streams {
            if rows >= sweep_rows {
                break;
            }
            let seqs = claim_run(&tx, &stream, now, batch.min(sweep_rows - rows))?;
            if !seqs.is_empty() {
                rows += seqs.len() as i64;
                runs.push((stream, seqs));
            }
        }
        tx.commit()?;
        Ok(runs)
    }

    /// One relaxed transaction: every run's rows deleted (the ack).
    pub(crate) fn ack_runs(&mut self, runs: &[Run]) -> Result<()> {
        self.set_full(false)?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for (stream, seqs) in runs {
            if let Some(&last) = seqs.last() {
                ack(&tx, stream, last)?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// A read-only connection to the raw journal in `dir`, for reading claimed
/// runs' events without the writer's connection.
pub(crate) fn journal_reader(dir: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        dir.join("raw-journal.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::from_secs(5))?;
    Ok(conn)
}

/// The events of each claimed run, read on `reader`.
pub(crate) fn load_runs(reader: &Connection, runs: &[Run]) -> Result<Vec<RunEvents>> {
    runs.iter()
        .map(|(stream, seqs)| load_run(reader, stream, seqs[0], seqs[seqs.len() - 1]))
        .collect()
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

    /// One durable transaction: every run applied with its checkpoint
    /// compare-and-set.
    pub(crate) fn apply_runs(&mut self, runs: &[Run], events: &[RunEvents]) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for ((stream, _), events) in runs.iter().zip(events) {
            apply_run(&tx, stream, events)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The oracle: each stream's row is at its version.
    pub(crate) fn verify(&self, streams: &[String], versions: &[u64]) -> Result<()> {
        let mut st = self.conn.prepare("SELECT value FROM rows WHERE stream = ?1")?;
        for (s, &version) in streams.iter().zip(versions) {
            let v: Option<String> = st.query_row([s], |r| r.get(0)).optional()?;
            let want = doc(version as i64, crate::fixture::PAYLOAD_BYTES);
            ensure!(
                v.as_deref() == Some(want.as_str()),
                "RAW ORACLE FAILED: stream {s}: appended {version}, row {v:?}"
            );
        }
        Ok(())
    }
}

fn doc(seq: i64, bytes: usize) -> String {
    format!("{{\"seq\":{seq},\"bytes\":{bytes}}}")
}

/// Claims the first rows of `stream` (at most `max`) when its first row is
/// free and due: one statement; returns their seqs in order.
fn claim_run(tx: &Connection, stream: &str, now: i64, max: i64) -> Result<Vec<i64>> {
    let mut st = tx.prepare_cached(
        "UPDATE outbox SET available_at = ?2 + ?4
          WHERE stream = ?1 AND available_at <= ?2
            AND seq IN (SELECT seq FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT ?3)
            AND (SELECT available_at FROM outbox WHERE stream = ?1 ORDER BY seq LIMIT 1) <= ?2
         RETURNING seq",
    )?;
    let rows = st.query_map(params![stream, now, max, CLAIM_MS], |r| r.get::<_, i64>(0))?;
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

/// Applies a run inside the projection transaction: the checkpoint's
/// compare-and-set (one statement), then the projection's document: each
/// event's is computed, the run's last is written (the outbox's view
/// writes, too, reach the database once per document per batch).
fn apply_run(tx: &Connection, stream: &str, events: &[(i64, Vec<u8>)]) -> Result<()> {
    let (first, last) = (events[0].0, events[events.len() - 1].0);
    let moved = tx
        .prepare_cached(
            "INSERT INTO checkpoints (stream, last) VALUES (?1, ?2)
             ON CONFLICT (stream) DO UPDATE SET last = excluded.last WHERE last = ?3",
        )?
        .execute(params![stream, last, first - 1])?;
    ensure!(moved == 1, "raw: checkpoint of {stream} is not at {}", first - 1);
    let mut up = tx.prepare_cached(
        "INSERT INTO rows (stream, value) VALUES (?1, ?2) ON CONFLICT (stream) DO UPDATE SET value = excluded.value",
    )?;
    let mut value = String::new();
    for (seq, payload) in events {
        value = doc(*seq, payload.len());
    }
    up.execute(params![stream, value])?;
    Ok(())
}

/// Deletes the claimed rows of `stream` through `last` (the ack).
fn ack(tx: &Connection, stream: &str, last: i64) -> Result<()> {
    tx.prepare_cached("DELETE FROM outbox WHERE stream = ?1 AND seq <= ?2")?
        .execute(params![stream, last])?;
    Ok(())
}

/// Drains every pending row, streams round robin, at most `batch` rows per
/// stream per turn: claim (journal txn), read the events, apply with a
/// checkpoint compare-and-set (projection txn), delete (journal txn). A
/// stream that gave fewer than `batch` rows is done (the backlog is fixed
/// while it drains). Returns the events applied.
pub(crate) fn drain(j: &mut Journal, p: &mut Projection, streams: &[String], batch: i64) -> Result<u64> {
    j.set_full(false)?;
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
            if events.len() as i64 == batch {
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
    j.set_full(false)?;
    let mut live: std::collections::VecDeque<&str> = streams.iter().map(String::as_str).collect();
    let mut applied = 0u64;
    while !live.is_empty() {
        let now = now_ms();
        let mut taken: Vec<(&str, i64, Vec<i64>)> = Vec::new();
        let mut rows = 0i64;
        let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        while taken.len() < max_streams && rows < sweep_rows {
            let Some(stream) = live.pop_front() else { break };
            let asked = batch.min(sweep_rows - rows);
            let seqs = claim_run(&tx, stream, now, asked)?;
            if !seqs.is_empty() {
                rows += seqs.len() as i64;
                taken.push((stream, asked, seqs));
            }
        }
        tx.commit()?;
        let mut runs = Vec::with_capacity(taken.len());
        for (stream, _, seqs) in &taken {
            runs.push(load_run(&j.conn, stream, seqs[0], seqs[seqs.len() - 1])?);
        }
        let tx = p.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for ((stream, _, _), events) in taken.iter().zip(&runs) {
            apply_run(&tx, stream, events)?;
        }
        tx.commit()?;
        let tx = j.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        for (stream, _, seqs) in &taken {
            ack(&tx, stream, seqs[seqs.len() - 1])?;
        }
        tx.commit()?;
        for (stream, asked, seqs) in taken {
            applied += seqs.len() as u64;
            if seqs.len() as i64 == asked {
                live.push_back(stream);
            }
        }
    }
    Ok(applied)
}
