//! When each event becomes visible (issue 43: lag is measured to
//! visibility, after the commit): a reader of the measured projection's
//! checkpoints on a connection of its own, the way an application's read
//! side sees them, stamps each seq when a checkpoint first shows it. The
//! checkpoint moves in the transaction that writes the document, so the
//! stamp is when the document became readable, within one poll.
//!
//! On SQLite the reader wakes every [`SQLITE_POLL`] and reads only when
//! the file's `data_version` says another connection committed; on
//! Postgres it reads every [`PG_POLL`] (its lags are tens of ms and more).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use rusqlite::{Connection, OpenFlags};

use crate::fixture::PROJECTION;

/// Set (to anything) to measure lag to the apply-time stamps, without the
/// reader (an A/B of the reader's own cost on a small machine).
pub(crate) const TO_APPLY_VAR: &str = "OUTBOX_BENCH_LAG_TO_APPLY";

fn to_apply() -> bool {
    std::env::var_os(TO_APPLY_VAR).is_some()
}

/// When each (stream, seq) was first seen applied.
pub(crate) type Stamps = HashMap<(String, u64), SystemTime>;

/// The pause between two looks at a SQLite file (the stamp's resolution:
/// a stamp is late by at most this, which can only overstate the lag).
/// The workers' own cross-process wake-up looks as often. A 100 µs poll
/// was tried first: on 2 cores its thread took enough CPU from the worker
/// to inflate the lag it measured (p99 52 against 30 ms acknowledged to
/// applied, in an A/B with `OUTBOX_BENCH_LAG_TO_APPLY`).
const SQLITE_POLL: Duration = Duration::from_millis(1);

/// The pause between two reads on Postgres.
const PG_POLL: Duration = Duration::from_millis(1);

/// The measured projection's checkpoints in the outbox's projection file,
/// and the statement's argument.
const OUTBOX_CHECKPOINTS: (&str, &[&str]) = (
    "SELECT stream, last_applied FROM outbox_checkpoints WHERE projection = ?1",
    &[PROJECTION],
);

/// The raw engine loop's checkpoints.
const RAW_CHECKPOINTS: (&str, &[&str]) = ("SELECT stream, last FROM checkpoints", &[]);

/// A running reader; [`finish`](Watcher::finish) stops it and returns its
/// stamps.
pub(crate) struct Watcher {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<Result<Stamps>>,
}

/// When each seq of each stream was first seen: a stream's i-th stamp is
/// its seq i + 1 (a checkpoint passes every seq below it). Kept per stream
/// while the reader runs and keyed by (stream, seq) only after: one map of
/// every event (the runs' 240,000 at half load) stopped the reader for
/// 40-70 ms each time it grew, and every event committed meanwhile was
/// stamped that late (over 1% of a run's events: its p99).
#[derive(Default)]
struct Seen {
    by_stream: HashMap<String, Vec<SystemTime>>,
}

impl Seen {
    /// Stamps every seq of `stream` above the last seen through `last`.
    fn saw(&mut self, stream: String, last: u64, now: SystemTime) {
        let stamps = self.by_stream.entry(stream).or_default();
        let seen = stamps.len() as u64;
        if last > seen {
            stamps.resize(last as usize, now);
        }
    }

    /// The stamps by (stream, seq).
    fn into_stamps(self) -> Stamps {
        self.by_stream
            .into_iter()
            .flat_map(|(stream, stamps)| {
                stamps
                    .into_iter()
                    .zip(1u64..)
                    .map(move |(at, seq)| ((stream.clone(), seq), at))
            })
            .collect()
    }
}

impl Watcher {
    /// Watches the projection file at `path` (it must exist).
    pub(crate) fn sqlite(path: &Path) -> Result<Watcher> {
        Watcher::sqlite_reading(path, OUTBOX_CHECKPOINTS)
    }

    /// Watches the raw engine loop's projection file at `path` (it must
    /// exist).
    pub(crate) fn raw_sqlite(path: &Path) -> Result<Watcher> {
        Watcher::sqlite_reading(path, RAW_CHECKPOINTS)
    }

    /// Watches the file at `path` through `checkpoints`, a statement (and
    /// its arguments) that reads (stream, last seq applied) for every
    /// stream.
    fn sqlite_reading(path: &Path, checkpoints: (&'static str, &'static [&'static str])) -> Result<Watcher> {
        let (checkpoints, args) = checkpoints;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .with_context(|| format!("opening {} to watch it", path.display()))?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("visible".into())
            .spawn(move || {
                let mut seen = Seen::default();
                let mut version = -1i64;
                let mut read = conn.prepare(checkpoints)?;
                loop {
                    // Read once more after the stop, so nothing committed
                    // before it is missed.
                    let last_look = flag.load(Ordering::Acquire);
                    let now_version: i64 = conn.query_row("PRAGMA data_version", [], |r| r.get(0))?;
                    if now_version != version {
                        version = now_version;
                        let rows =
                            read.query_map(rusqlite::params_from_iter(args), |r| Ok((r.get(0)?, r.get(1)?)))?;
                        let now = SystemTime::now();
                        for row in rows {
                            let (stream, last): (String, i64) = row?;
                            seen.saw(stream, last as u64, now);
                        }
                    }
                    if last_look {
                        return Ok(seen.into_stamps());
                    }
                    std::thread::sleep(SQLITE_POLL);
                }
            })?;
        Ok(Watcher { stop, handle })
    }

    /// Watches the checkpoints in `schema` of the server at `url`.
    pub(crate) fn postgres(url: &str, schema: &str) -> Result<Watcher> {
        use outbox_postgres::sqlx::{self, Connection as _};
        let (url, schema) = (url.to_owned(), schema.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("visible".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(async move {
                    let mut conn = sqlx::PgConnection::connect(&url).await?;
                    let sql = format!(
                        "SELECT stream, last_applied FROM \"{schema}\".outbox_checkpoints WHERE projection = $1"
                    );
                    let mut seen = Seen::default();
                    loop {
                        let last_look = flag.load(Ordering::Acquire);
                        let rows: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(sql.as_str()))
                            .bind(PROJECTION)
                            .fetch_all(&mut conn)
                            .await?;
                        let now = SystemTime::now();
                        for (stream, last) in rows {
                            seen.saw(stream, last as u64, now);
                        }
                        if last_look {
                            return Ok(seen.into_stamps());
                        }
                        tokio::time::sleep(PG_POLL).await;
                    }
                })
            })?;
        Ok(Watcher { stop, handle })
    }

    /// [`Watcher::sqlite`], or none when [`TO_APPLY_VAR`] is set.
    pub(crate) fn sqlite_unless_to_apply(path: &Path) -> Result<Option<Watcher>> {
        if to_apply() {
            Ok(None)
        } else {
            Watcher::sqlite(path).map(Some)
        }
    }

    /// [`Watcher::postgres`], or none when [`TO_APPLY_VAR`] is set.
    pub(crate) fn postgres_unless_to_apply(url: &str, schema: &str) -> Result<Option<Watcher>> {
        if to_apply() {
            Ok(None)
        } else {
            Watcher::postgres(url, schema).map(Some)
        }
    }

    /// The stamps of `watch`, or `applied` (the apply-time stamps) when
    /// there is no reader.
    pub(crate) async fn finish_or(watch: Option<Watcher>, applied: Stamps) -> Result<Stamps> {
        match watch {
            Some(w) => w.finish().await,
            None => Ok(applied),
        }
    }

    /// Stops the reader (after one more look) and returns its stamps.
    pub(crate) async fn finish(self) -> Result<Stamps> {
        self.stop.store(true, Ordering::Release);
        let handle = self.handle;
        tokio::task::spawn_blocking(move || handle.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the visibility reader panicked"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_stamps_every_seq_it_passed_once() {
        let mut seen = Seen::default();
        let (t1, t2) = (
            SystemTime::UNIX_EPOCH,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1),
        );
        seen.saw("s".into(), 2, t1);
        seen.saw("s".into(), 2, t2);
        seen.saw("s".into(), 4, t2);
        seen.saw("t".into(), 1, t2);
        let stamps = seen.into_stamps();
        assert_eq!(stamps.len(), 5);
        assert_eq!(stamps[&("s".to_string(), 1)], t1);
        assert_eq!(stamps[&("s".to_string(), 2)], t1);
        assert_eq!(stamps[&("s".to_string(), 3)], t2);
        assert_eq!(stamps[&("s".to_string(), 4)], t2);
        assert_eq!(stamps[&("t".to_string(), 1)], t2);
    }
}
