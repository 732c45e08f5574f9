//! Wake-ups across processes: SQLite's `PRAGMA data_version` as a
//! [`WakeSource`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_core::WakeSource;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Mutex, watch};

/// How often an idle waiter looks at the file's change counter.
const CHECK_EVERY: Duration = Duration::from_millis(1);
/// How long a waiter waits before reopening a connection that failed.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// Wakes workers when any other connection, in this process or another,
/// commits to the journal file.
///
/// It keeps one read-only connection of its own and, while someone is inside
/// [`WakeSource::wait`], checks `PRAGMA data_version` every millisecond: a
/// read of the WAL index in shared memory, no disk I/O and no table scan,
/// whatever the backlog. The counter changes on every commit by another
/// connection (appends, but also claims and completions of other workers),
/// so wake-ups can be spurious; callers re-check the store. A commit made
/// between two waits resolves the next wait at once: the last value seen is
/// kept across calls. Nothing runs while nobody waits.
///
/// If the connection fails, `wait` resolves (so the caller polls) and the
/// next `wait` reopens it after a second.
#[derive(Debug)]
pub struct SqliteWakeSource {
    path: PathBuf,
    driver: Mutex<Driver>,
    signal: watch::Sender<u64>,
}

#[derive(Debug)]
struct Driver {
    conn: Option<Connection>,
    seen: Option<i64>,
}

fn open(path: &Path) -> rusqlite::Result<Connection> {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
}

fn data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get(0))
}

impl SqliteWakeSource {
    /// A wake source on the database file at `path` (opened at once, so a
    /// commit from now on resolves the first `wait`).
    pub(crate) fn new(path: &Path) -> Self {
        let conn = open(path).ok();
        let seen = conn.as_ref().and_then(|c| data_version(c).ok());
        SqliteWakeSource {
            path: path.to_owned(),
            driver: Mutex::new(Driver { conn, seen }),
            signal: watch::channel(0).0,
        }
    }

    /// Checks until the counter moves (or the connection fails).
    async fn drive(&self, d: &mut Driver) {
        loop {
            if d.conn.is_none() {
                match open(&self.path) {
                    Ok(c) => d.conn = Some(c),
                    Err(e) => {
                        tracing::debug!(path = %self.path.display(), error = %e, "wake-up connection cannot open; polling meanwhile");
                        tokio::time::sleep(REOPEN_AFTER).await;
                        return;
                    }
                }
            }
            let version = match &d.conn {
                Some(conn) => data_version(conn),
                None => continue,
            };
            match version {
                Ok(v) if d.seen == Some(v) => {}
                Ok(v) => {
                    let first = d.seen.is_none();
                    d.seen = Some(v);
                    if !first {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(path = %self.path.display(), error = %e, "wake-up check failed; reopening");
                    d.conn = None;
                    d.seen = None;
                    return;
                }
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }
}

#[outbox_core::async_trait]
impl WakeSource for SqliteWakeSource {
    async fn wait(&self) {
        let mut rx = self.signal.subscribe();
        tokio::select! {
            // Another waiter drives the checks: its signal wakes us too.
            _ = rx.changed() => {}
            mut d = self.driver.lock() => {
                self.drive(&mut d).await;
                self.signal.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }
}
