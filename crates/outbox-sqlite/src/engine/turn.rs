//! Turns between writers of one database in different processes.
//!
//! SQLite's write lock is not fair: a writer that finds it taken sleeps in
//! the busy handler and tries again, and a busy writer in another process
//! (an appender committing a group every few hundred microseconds) takes
//! the lock again the moment it commits, before the sleeper wakes. With a
//! producer appending 10,000 single-event calls a second, a worker process
//! waited up to 68 tries for its claims, and the append-to-applied lag
//! across processes reached p99 99 ms (p50 16 ms).
//!
//! So writers take turns through a file beside the database
//! (`<database>-turn`, mode 0600, never written): a writer engine that
//! finds the write lock taken holds a shared lock on it while it waits
//! ([`waiting`] … [`waited`]), and every writer engine, before it starts a
//! transaction, looks for such a lock held by another and pauses while
//! there is one ([`let_waiters_in`]), at most [`LONGEST_YIELD`], so the
//! waiter's next try finds the write lock free. The file is made by the
//! first writer that waits: a database only one process writes never gets
//! one. These are advisory `flock` locks: a writer that does not take part
//! (another program, an older version) only loses its priority; SQLite's
//! own locks still decide who writes.
//!
//! The state is the engine thread's own (a thread-local): SQLite calls the
//! busy handler with no context of ours.

use std::cell::RefCell;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

/// The longest a writer pauses for waiters before its own transaction: a
/// few of their tries (see `busy`), so a waiter that does not come (it
/// gave up, or its process stopped) costs little.
pub(super) const LONGEST_YIELD: Duration = Duration::from_micros(500);

/// How often a pausing writer looks again.
const LOOK_AGAIN: Duration = Duration::from_micros(25);

/// How often a writer looks for a turn file that was not there: a writer
/// of a database only its process writes tries at most this often (one
/// failed `open`), not before every transaction.
const LOOK_FOR_FILE: Duration = Duration::from_millis(1);

/// The turn file of the database at `db`.
pub(crate) fn path_of(db: &Path) -> PathBuf {
    super::beside::beside(db, "-turn")
}

/// A writer engine thread's part in the turns.
struct Turn {
    path: PathBuf,
    /// The turn file, once it exists.
    file: Option<File>,
    /// When the file was last looked for and not found.
    missing_at: Option<Instant>,
    /// Whether this thread holds its shared lock (it is waiting).
    held: bool,
}

thread_local! {
    static MINE: RefCell<Option<Turn>> = const { RefCell::new(None) };
}

/// Makes the calling thread (a writer engine's) take turns on the database
/// at `db`.
pub(super) fn take_part(db: &Path) {
    MINE.with(|m| {
        *m.borrow_mut() = Some(Turn {
            path: path_of(db),
            file: None,
            missing_at: None,
            held: false,
        })
    });
}

impl Turn {
    /// The turn file: opened, or made (mode 0600) when `create`. Without
    /// `create`, a file found missing is looked for again only after
    /// [`LOOK_FOR_FILE`].
    fn file(&mut self, create: bool) -> Option<&File> {
        let recently_missing = self.missing_at.is_some_and(|t| t.elapsed() < LOOK_FOR_FILE);
        if self.file.is_none() && (create || !recently_missing) {
            let mut options = OpenOptions::new();
            options.read(true).write(true).create(create).truncate(false);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            self.file = options.open(&self.path).ok();
            self.missing_at = self.file.is_none().then(Instant::now);
        }
        self.file.as_ref()
    }

    /// Whether another writer waits (holds its shared lock on the file).
    fn someone_waits(&mut self) -> bool {
        self.file(false)
            .is_some_and(|f| locked_by_another(f).unwrap_or(false))
    }
}

/// Whether another open file holds a lock on the turn file `file` (probed
/// with an exclusive lock that is let go at once).
fn locked_by_another(file: &File) -> std::io::Result<bool> {
    match file.try_lock() {
        Ok(()) => file.unlock().map(|()| false),
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Before a transaction: pauses while another writer waits for the write
/// lock, at most [`LONGEST_YIELD`]. Returns whether one waited.
pub(super) fn let_waiters_in() -> bool {
    MINE.with(|m| {
        let mut mine = m.borrow_mut();
        let Some(turn) = mine.as_mut() else {
            return false;
        };
        if !turn.someone_waits() {
            return false;
        }
        let started = Instant::now();
        while started.elapsed() < LONGEST_YIELD {
            thread::sleep(LOOK_AGAIN);
            if !turn.someone_waits() {
                break;
            }
        }
        true
    })
}

/// The busy handler found the write lock taken: says so on the turn file
/// (once per wait). Returns whether the wait is marked (the holder will
/// pause for it, so the handler keeps its pauses short).
pub(super) fn waiting() -> bool {
    MINE.with(|m| {
        let mut mine = m.borrow_mut();
        let Some(turn) = mine.as_mut() else {
            return false;
        };
        if !turn.held {
            turn.held = turn.file(true).is_some_and(|f| f.try_lock_shared().is_ok());
        }
        turn.held
    })
}

/// The wait is over (the transaction began, or gave up).
pub(super) fn waited() {
    MINE.with(|m| {
        if let Some(turn) = m.borrow_mut().as_mut()
            && turn.held
        {
            if let Some(f) = &turn.file {
                let _ = f.unlock();
            }
            turn.held = false;
        }
    });
}

/// Whether the database at `db` has a writer waiting, seen from outside
/// any engine (tests).
#[cfg(test)]
pub(super) fn waiter_on(db: &Path) -> std::io::Result<bool> {
    locked_by_another(&OpenOptions::new().read(true).write(true).open(path_of(db))?)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Arc;
    use std::time::Duration;

    use rusqlite::Connection;

    use super::*;
    use crate::SqliteOptions;
    use crate::engine::{Access, Engine, engine_error};

    /// A WAL database with one table, `t`.
    fn new_db(dir: &Path) -> PathBuf {
        let path = dir.join("turns.db");
        crate::engine::new_wal_db(&path, "CREATE TABLE t (k INTEGER PRIMARY KEY)");
        path
    }

    async fn insert(engine: Arc<Engine>, k: i64) -> outbox_core::Result<()> {
        engine
            .write(move |conn| {
                conn.execute("INSERT INTO t VALUES (?1)", [k])
                    .map(drop)
                    .map_err(|e| engine_error("inserting", e))
            })
            .await
    }

    /// A writer engine that finds the write lock held by another
    /// connection (another process) marks its wait on the turn file, a
    /// file only 0600, and unmarks it once its transaction began.
    #[tokio::test]
    async fn a_writer_waiting_for_the_lock_says_so_until_it_gets_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = new_db(dir.path());
        let engine =
            Arc::new(Engine::start(&path, &SqliteOptions::default(), Access::Write).expect("engine"));
        insert(Arc::clone(&engine), 1)
            .await
            .expect("a write with nobody in the way");
        assert!(
            !path_of(&path).exists(),
            "a database one writer writes gets no turn file"
        );

        let other = Connection::open(&path).expect("the other process");
        other
            .execute_batch("BEGIN IMMEDIATE")
            .expect("holds the write lock");
        let waiting = tokio::spawn(insert(Arc::clone(&engine), 2));
        // The busy handler marks the wait on its first call; the write
        // cannot commit before `other` does, so it ends first only by giving
        // up (after the busy timeout and its retries) with the wait unmarked.
        while !waiter_on(&path).unwrap_or(false) {
            assert!(!waiting.is_finished(), "the write ended without marking its wait");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            std::fs::metadata(path_of(&path))
                .expect("turn file")
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
        other.execute_batch("COMMIT").expect("lets go of the lock");
        waiting.await.expect("task").expect("the waiting write commits");
        assert!(!waiter_on(&path).expect("turn file"), "the wait is unmarked");
        engine.close().await;
    }

    /// Before its transaction a writer pauses while another writer's wait
    /// is marked, and not when none is.
    #[test]
    fn a_writer_lets_a_marked_waiter_go_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = new_db(dir.path());
        take_part(&path);
        assert!(!let_waiters_in(), "no turn file: nobody waits");
        let waiter = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path_of(&path))
            .expect("turn file");
        // Anew: a file found missing is looked for again only a while later.
        take_part(&path);
        assert!(!let_waiters_in(), "nobody waits");
        waiter.lock_shared().expect("a marked wait");
        assert!(let_waiters_in(), "a marked waiter goes first");
        waiter.unlock().expect("unmark");
        assert!(!let_waiters_in(), "the wait is over");
    }
}
