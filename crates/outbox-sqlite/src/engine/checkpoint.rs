//! Checkpoints off the writer thread.
//!
//! SQLite checkpoints a WAL database from the connection that commits:
//! after a commit that leaves the WAL at 1000 frames or more, the
//! committing call copies the WAL's pages into the database file and syncs
//! it before it returns. For a journal engine that is twice a loss:
//! - The writer thread, which every append, claim and end waits for, pays
//!   for the copy and its `fsync` before it takes the next job.
//! - The WAL starts again from its first frame only when no reader still
//!   uses it, and under steady reads (a worker's, another process's) it
//!   rarely gets the chance. So the WAL stays above 1000 frames, and *every*
//!   commit checkpoints. Across processes at half load that was a quarter
//!   of the appender's writer thread (perf), time every append queued
//!   behind.
//!
//! So a writer engine's connection replaces SQLite's automatic checkpoint
//! with a WAL hook ([`hook`]): it counts the frames written since the last
//! checkpoint and, once there are [`FRAMES`] of them, wakes a checkpointer
//! thread of the engine's own, with a connection of its own ([`pass`]).
//! Its `PASSIVE` checkpoint waits for no reader and no writer, and both go
//! on meanwhile; then a `RESTART` checkpoint that never waits starts the
//! WAL again when nothing uses it. A checkpoint starts only after
//! [`FRAMES`] new frames however often the WAL could not start again, so
//! hot pages are copied once per checkpoint rather than once per commit.
//!
//! **The WAL file's size.** SQLite truncates a grown WAL file back to
//! `journal_size_limit` in the first commit after the WAL starts again,
//! on the committing connection. Under steady load, with readers always
//! on the WAL and the writer holding the lock most of the time, three
//! `RESTART`s in four fail, and runs of up to thirty failures (half a
//! second at the benchmark's half load) let the WAL pass 64 MiB several
//! times in ten seconds. Each truncation back held the writer 10–40 ms
//! (an `ftruncate` of pages still being written back), and those were the
//! worst append-to-applied lags of the run.
//! So the writers never truncate (`journal_size_limit = -1`), and the
//! checkpointer shrinks a WAL file grown past [`WAL_SIZE_LIMIT`] once its
//! writer has been quiet for [`QUIET`] ([`shrink`]): a file that grew in a
//! burst still goes back, and no busy writer waits for it.
//!
//! **The writer finishes what the checkpointer could not.** With one busy
//! writer and no reader (a producer appending as fast as it can), the
//! `RESTART` step nearly always finds the writer inside its next
//! transaction, and the passive copy never catches up with the frames
//! committed while it ran: the WAL never started again and grew by every
//! commit (29 MB in a 7-second benchmark round, against 4 MB for SQLite's
//! own checkpoints), and a commit that grows the file pays for new blocks
//! and for syncing the file's size with its data (about a third more per
//! single-event append). So a pass that could not start the WAL again asks
//! the writer thread to finish ([`finish_on_writer`]): before its next
//! transaction it runs a `PASSIVE` checkpoint of its own, which copies only
//! the frames committed since the pass, and its next commit then starts the
//! WAL from its first frame (SQLite does that by itself once every frame is
//! copied and no reader uses the WAL). That is at most one such checkpoint
//! per pass, every [`FRAMES`] frames, and the writer copies a few frames,
//! not the whole WAL as SQLite's automatic checkpoint would.
//!
//! The state is the writer thread's own (a thread-local): SQLite calls the
//! hook with no context of ours.

use std::cell::RefCell;
use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use outbox_core::Result;
use rusqlite::Connection;
use rusqlite::hooks::Wal;

use super::busy;
use super::connect::{Access, connect};
use super::values::engine_error;
use crate::SqliteOptions;
use crate::errors::internal;
use crate::options::WAL_SIZE_LIMIT;

/// How many frames the WAL takes between two checkpoints: SQLite's own
/// automatic checkpoint threshold (`PRAGMA wal_autocheckpoint`), counted
/// from the last checkpoint instead of from the WAL's first frame.
pub(super) const FRAMES: i64 = 1000;

/// How long the writer goes without waking the checkpointer (fewer than
/// [`FRAMES`] new frames) before a grown WAL file is shrunk ([`shrink`]).
const QUIET: Duration = Duration::from_secs(1);

thread_local! {
    /// The checkpointer the commits of this (writer) thread wake.
    static WAKES: RefCell<Option<Wakes>> = const { RefCell::new(None) };
}

/// A writer thread's side: what it tells its checkpointer.
struct Wakes {
    /// The WAL's frame count when the last checkpoint looked at it.
    looked_at: Arc<AtomicI64>,
    /// A pending wake-up (capacity one: wake-ups while one is pending are
    /// the same wake-up).
    wake: SyncSender<()>,
    /// Set by a pass that could not start the WAL again, for the writer to
    /// finish (see [`finish_on_writer`]).
    finish: Arc<AtomicBool>,
}

/// Whether a WAL of `frames` frames is due a checkpoint, the last one
/// having looked at `looked_at` frames. A WAL that started again from its
/// first frame (fewer frames than then) counts from there.
fn due(frames: i64, looked_at: i64) -> bool {
    let new = if frames < looked_at {
        frames
    } else {
        frames - looked_at
    };
    new >= FRAMES
}

/// Before a writer thread's transaction: if its checkpointer's last pass
/// could not start the WAL again, copies the frames committed since then
/// on the writer's own connection `conn`, so that the transaction's commit
/// starts the WAL from its first frame (see the module docs). A checkpoint
/// that cannot run now (the checkpointer is in one) is left to the next
/// pass.
pub(super) fn finish_on_writer(conn: &Connection) {
    let wanted = WAKES.with_borrow(|w| w.as_ref().is_some_and(|w| w.finish.swap(false, Ordering::AcqRel)));
    if !wanted {
        return;
    }
    match checkpoint(conn, "PASSIVE") {
        Ok((busy, frames, copied)) => {
            tracing::trace!(busy, frames, copied, "the writer finished a checkpoint");
        }
        Err(e) => {
            let e = engine_error("finishing a checkpoint on the writer", e);
            tracing::warn!(error = %e, "checkpoint failed; the next one retries");
        }
    }
}

/// The WAL hook of a writer engine's connection: called after each commit
/// with the WAL's frame count.
fn hook(_: &Wal, frames: c_int) -> rusqlite::Result<()> {
    WAKES.with_borrow(|wakes| {
        if let Some(w) = wakes
            && due(i64::from(frames), w.looked_at.load(Ordering::Relaxed))
        {
            match w.wake.try_send(()) {
                Ok(()) | Err(TrySendError::Full(())) => {}
                Err(TrySendError::Disconnected(())) => {
                    tracing::warn!("the sqlite checkpointer stopped; the WAL is no longer checkpointed");
                }
            }
        }
    });
    Ok(())
}

/// A writer engine's checkpointer: its thread and what the writer thread
/// needs to wake it.
pub(super) struct Checkpointer {
    wakes: Wakes,
    /// Set while the checkpointer's `RESTART` checkpoint holds the write
    /// lock: the writer's busy handler reads it (`busy::watch_checkpointer`).
    restarting: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Takes over the checkpoints of `writer`, a connection to the database
    /// at `path`: opens a connection of its own and starts its thread. The
    /// writer's commits wake it once the writer's thread runs
    /// [`Checkpointer::serve`].
    pub(super) fn start(path: &Path, options: &SqliteOptions, writer: &Connection) -> Result<Checkpointer> {
        let conn = connect(path, options, Access::Write)?;
        let looked_at = Arc::new(AtomicI64::new(0));
        let (wake, woken) = mpsc::sync_channel(1);
        let wal = wal_of(path);
        let seen = Arc::clone(&looked_at);
        let restarting = Arc::new(AtomicBool::new(false));
        let holding = Arc::clone(&restarting);
        let finish = Arc::new(AtomicBool::new(false));
        let unfinished = Arc::clone(&finish);
        let thread = thread::Builder::new()
            .name("outbox-sqlite-checkpointer".into())
            .spawn(move || {
                // Never waits for a lock: a checkpoint that finds one taken
                // does what it can and the next pass tries again.
                busy::set_timeout(Duration::ZERO);
                let shrinking = Shrinking {
                    wal,
                    quiet: QUIET,
                    limit: WAL_SIZE_LIMIT.unsigned_abs(),
                };
                let shared = Shared {
                    looked_at: &seen,
                    restarting: &holding,
                    finish: &unfinished,
                };
                run(&conn, &woken, &shared, &shrinking)
            })
            .map_err(|e| internal(format!("starting the sqlite checkpointer thread: {e}")))?;
        // Replaces SQLite's automatic checkpoint on this connection.
        writer.wal_hook(Some(hook));
        Ok(Checkpointer {
            wakes: Wakes {
                looked_at,
                wake,
                finish,
            },
            restarting,
            thread,
        })
    }

    /// Runs `serve` (the writer thread's work) with its commits waking the
    /// checkpointer, then stops the checkpointer and waits for it: its
    /// connection is closed when this returns.
    pub(super) fn serve<T>(self, serve: impl FnOnce() -> T) -> T {
        let Checkpointer {
            wakes,
            restarting,
            thread,
        } = self;
        WAKES.set(Some(wakes));
        busy::watch_checkpointer(Some(restarting));
        let out = serve();
        busy::watch_checkpointer(None);
        // Dropping the sender ends the checkpointer's loop.
        drop(WAKES.take());
        if thread.join().is_err() {
            tracing::warn!("the sqlite checkpointer panicked");
        }
        out
    }
}

/// The WAL file of the database at `db`.
fn wal_of(db: &Path) -> PathBuf {
    super::beside::beside(db, "-wal")
}

/// What a checkpointer thread shares with its writer thread.
struct Shared<'a> {
    /// The WAL's frame count when the last pass looked at it.
    looked_at: &'a AtomicI64,
    /// Set while this thread holds the write lock.
    restarting: &'a AtomicBool,
    /// Set after a pass that could not start the WAL again.
    finish: &'a AtomicBool,
}

/// When and what a checkpointer shrinks.
struct Shrinking {
    /// The WAL file.
    wal: PathBuf,
    /// How long without a wake-up counts as quiet.
    quiet: Duration,
    /// The largest file kept.
    limit: u64,
}

/// The checkpointer thread: a checkpoint pass per wake-up, until the
/// writer thread is done; after passes, once no wake-up came for
/// `shrinking.quiet`, shrinks the WAL file if it grew (again after each
/// further quiet time until that is done).
fn run(conn: &Connection, woken: &Receiver<()>, shared: &Shared<'_>, shrinking: &Shrinking) {
    let Shared {
        looked_at,
        restarting,
        finish,
    } = *shared;
    let shown = shrinking.wal.display();
    let quiet = shrinking.quiet;
    // Whether passes ran since the WAL file's size was last settled.
    let mut unsettled = false;
    loop {
        let wake = if unsettled {
            woken.recv_timeout(quiet)
        } else {
            woken.recv().map_err(|_| RecvTimeoutError::Disconnected)
        };
        match wake {
            Ok(()) => {
                unsettled = true;
                match pass(conn, restarting) {
                    Ok(Pass {
                        frames,
                        restarted,
                        writer_busy,
                    }) => {
                        looked_at.store(if restarted { 0 } else { frames }, Ordering::Relaxed);
                        if writer_busy {
                            finish.store(true, Ordering::Release);
                        }
                        tracing::trace!(wal = %shown, frames, restarted, "checkpointed the WAL");
                    }
                    Err(e) => {
                        let e = engine_error(format_args!("checkpointing {shown}"), e);
                        tracing::warn!(error = %e, "checkpoint failed; the next one retries");
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => match shrink(conn, restarting, &shrinking.wal, shrinking.limit)
            {
                Ok(Shrunk::Small) => unsettled = false,
                Ok(Shrunk::Truncated) => {
                    unsettled = false;
                    looked_at.store(0, Ordering::Relaxed);
                    tracing::debug!(wal = %shown, "truncated the grown WAL file");
                }
                Ok(Shrunk::Busy) => {}
                Err(e) => {
                    let e = engine_error(format_args!("truncating {shown}"), e);
                    tracing::warn!(error = %e, "truncating the WAL failed; the next quiet time retries");
                }
            },
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
}

/// What [`shrink`] found or did.
#[derive(Debug, PartialEq, Eq)]
enum Shrunk {
    /// The WAL file is no larger than the limit (or gone).
    Small,
    /// It was larger, and is now empty.
    Truncated,
    /// It is larger, and a reader or a writer kept it so.
    Busy,
}

/// Truncates the WAL file `wal` to nothing if it is larger than `limit`
/// bytes, with a `TRUNCATE` checkpoint that waits for nobody
/// (this thread's busy timeout is zero): it copies what is left of the WAL
/// and truncates it only if no reader uses it and no writer holds the
/// lock. While it holds the write lock, this engine's writer waits for it
/// as for a `RESTART` (`Checkpointer::restarting`).
fn shrink(conn: &Connection, restarting: &AtomicBool, wal: &Path, limit: u64) -> rusqlite::Result<Shrunk> {
    let grown = std::fs::metadata(wal).is_ok_and(|m| m.len() > limit);
    if !grown {
        return Ok(Shrunk::Small);
    }
    restarting.store(true, Ordering::Release);
    let truncate = checkpoint(conn, "TRUNCATE");
    restarting.store(false, Ordering::Release);
    let (busy, _, _) = truncate?;
    Ok(if busy { Shrunk::Busy } else { Shrunk::Truncated })
}

/// What one checkpoint pass did.
struct Pass {
    /// The WAL's frames when it looked (-1 when another connection was
    /// checkpointing).
    frames: i64,
    /// Whether the WAL starts again from its first frame.
    restarted: bool,
    /// Whether it copied every frame and still could not start the WAL
    /// again (the `RESTART` step found the write lock taken, or a reader on
    /// the WAL): the writer can then finish ([`finish_on_writer`]). When a
    /// reader kept frames from being copied, it could not.
    writer_busy: bool,
}

/// `PRAGMA wal_checkpoint(mode)`: whether a lock kept it from finishing,
/// the WAL's frames and how many of them are in the database file (both -1
/// when it could not start).
fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, i64, i64)> {
    conn.prepare_cached(&format!("PRAGMA wal_checkpoint({mode})"))?
        .query_row([], |r| Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?)))
}

/// One pass. A `PASSIVE` checkpoint copies the frames while writers and
/// readers go on. If it copied them all, a `RESTART` checkpoint copies the
/// few committed meanwhile and starts the WAL again from its first frame,
/// unless a writer holds the lock or a reader still uses the WAL: it never
/// waits (its busy timeout is zero), and the next pass tries again. It does
/// hold the write lock while it copies those few frames: that is the only
/// time a checkpoint stops the writers. Without it the WAL would never start
/// again, since the writers add frames while the passive checkpoint runs.
fn pass(conn: &Connection, restarting: &AtomicBool) -> rusqlite::Result<Pass> {
    let (busy, frames, copied) = checkpoint(conn, "PASSIVE")?;
    if busy || frames <= 0 || copied < frames {
        return Ok(Pass {
            frames,
            restarted: false,
            writer_busy: false,
        });
    }
    restarting.store(true, Ordering::Release);
    let restart = checkpoint(conn, "RESTART");
    restarting.store(false, Ordering::Release);
    let (busy, frames, copied) = restart?;
    Ok(Pass {
        frames,
        restarted: !busy,
        // Busy with every frame copied: the write lock was taken (the
        // checkpoint then copies what it can without it), or a reader
        // still reads the WAL. Either way the writer can copy the frames
        // committed since and start the WAL again at its next commit once
        // no reader is on it; while one is, its checkpoint finds nothing to
        // copy and costs nothing.
        writer_busy: busy && frames > 0 && copied == frames,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::engine::{Engine, new_wal_db};

    #[test]
    fn a_checkpoint_is_due_every_thousand_new_frames() {
        assert!(!due(999, 0));
        assert!(due(1000, 0));
        // A WAL that never starts again still checkpoints per new frames,
        // not on every commit past 1000.
        assert!(!due(5_500, 5_000));
        assert!(due(6_000, 5_000));
        // One that started again counts from its first frame.
        assert!(!due(10, 5_000));
        assert!(due(1_200, 5_000));
    }

    /// A new database `t (k, v)` in `dir`, with a writer connection that
    /// makes no automatic checkpoints and a checkpointer's connection that
    /// never waits (this thread's busy timeout is zero).
    fn writer_and_checkpointer(dir: &Path) -> (std::path::PathBuf, Connection, Connection) {
        let path = dir.join("wal.db");
        new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL); PRAGMA wal_checkpoint(TRUNCATE);",
        );
        let writer = connect(&path, &SqliteOptions::default(), Access::Write).expect("writer");
        writer
            .execute_batch("PRAGMA wal_autocheckpoint = 0;")
            .expect("no automatic checkpoints");
        let checkpointer = connect(&path, &SqliteOptions::default(), Access::Write).expect("checkpointer");
        super::super::busy::set_timeout(std::time::Duration::ZERO);
        (path, writer, checkpointer)
    }

    /// The size of the WAL file of `wal.db` in `dir`.
    fn wal_size(dir: &Path) -> u64 {
        std::fs::metadata(dir.join("wal.db-wal")).expect("wal").len()
    }

    /// Commits a 40 kB row `k` (ten pages of WAL).
    fn insert_row(writer: &Connection, k: i64) {
        writer
            .execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(40000))", [k])
            .expect("insert");
    }

    /// Grows the WAL of `wal.db` in `dir` by a 400 kB row `k`; its size after.
    fn grow(writer: &Connection, dir: &Path, k: i64) -> u64 {
        writer
            .execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(400000))", [k])
            .expect("large insert");
        wal_size(dir)
    }

    /// A reader inside a read transaction on the WAL as it is now, and the
    /// rows of `t` it sees.
    fn reading(path: &Path) -> (Connection, i64) {
        let reader = connect(path, &SqliteOptions::default(), Access::Read).expect("reader");
        reader.execute_batch("BEGIN").expect("begin");
        let seen = reader
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("read");
        (reader, seen)
    }

    /// A pass copies the WAL and starts it again, unless a reader still
    /// uses it: then it copies what it can and leaves the WAL as it is.
    #[test]
    fn a_pass_starts_the_wal_again_only_when_no_reader_uses_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let insert = |k: i64| insert_row(&writer, k);
        insert(1);
        let (reader, seen) = reading(&path);
        assert_eq!(seen, 1);
        insert(2);
        let held = pass(&checkpointer, &AtomicBool::new(false)).expect("pass");
        assert!(held.frames > 0 && !held.restarted, "restarted under a reader");
        reader.execute_batch("COMMIT").expect("end the read");
        let free = pass(&checkpointer, &AtomicBool::new(false)).expect("pass");
        assert!(free.restarted, "did not restart with no reader");
        // The next commit writes from the WAL's first frame.
        insert(3);
        let (_, frames, _) = checkpoint(&checkpointer, "PASSIVE").expect("look");
        assert!(
            frames < held.frames,
            "the WAL went on from frame {} to {frames}",
            held.frames
        );
    }

    /// With the writer inside a transaction, a pass copies the WAL but
    /// cannot start it again, and says the writer can finish; the writer's
    /// own checkpoint then copies what it committed since, and its next
    /// commit writes from the WAL's first frame. Without it the WAL of a
    /// writer that is always in a transaction only grows.
    #[test]
    fn a_pass_the_writer_kept_from_restarting_is_finished_by_the_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let insert = |k: i64| insert_row(&writer, k);
        insert(1);
        insert(2);
        writer.execute_batch("BEGIN IMMEDIATE").expect("begin");
        let blocked = pass(&checkpointer, &AtomicBool::new(false)).expect("pass");
        assert!(!blocked.restarted, "restarted while the writer held the lock");
        assert!(blocked.writer_busy, "did not hand the restart to the writer");
        writer
            .execute("INSERT INTO t (k, v) VALUES (3, zeroblob(40000))", [])
            .expect("insert in the transaction");
        writer.execute_batch("COMMIT").expect("commit");

        let (wake, _woken) = mpsc::sync_channel(1);
        let finish = Arc::new(AtomicBool::new(blocked.writer_busy));
        WAKES.set(Some(Wakes {
            looked_at: Arc::new(AtomicI64::new(blocked.frames)),
            wake,
            finish: Arc::clone(&finish),
        }));
        finish_on_writer(&writer);
        drop(WAKES.take());
        assert!(!finish.load(Ordering::Acquire), "the request stayed pending");
        insert(4);
        let (_, frames, _) = checkpoint(&checkpointer, "PASSIVE").expect("look");
        assert!(
            frames < blocked.frames,
            "the WAL went on from frame {} to {frames}",
            blocked.frames
        );
    }

    /// A pass that a reader kept from copying every frame does not ask
    /// the writer to finish: the writer could not copy them either.
    #[test]
    fn a_pass_a_reader_held_back_leaves_the_writer_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let insert = |k: i64| insert_row(&writer, k);
        insert(1);
        let (_reader, _) = reading(&path);
        insert(2);
        let held = pass(&checkpointer, &AtomicBool::new(false)).expect("pass");
        assert!(!held.restarted && !held.writer_busy, "{} frames", held.frames);
    }

    /// A writer engine's connection never truncates the WAL file, not even
    /// at its first commit after a pass started the WAL again: a grown file
    /// keeps its size until the checkpointer shrinks it.
    #[test]
    fn a_commit_after_a_restart_leaves_a_grown_wal_to_the_checkpointer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let limit: i64 = writer
            .query_row("PRAGMA journal_size_limit", [], |r| r.get(0))
            .expect("limit");
        assert_eq!(limit, -1, "the writer's connection truncates the WAL");
        let grown = grow(&writer, dir.path(), 1);
        assert!(
            pass(&checkpointer, &AtomicBool::new(false))
                .expect("pass")
                .restarted
        );
        writer
            .execute("INSERT INTO t (k, v) VALUES (2, x'00')", [])
            .expect("small insert");
        assert_eq!(wal_size(dir.path()), grown, "the commit truncated the WAL");
    }

    /// A WAL file larger than the limit is truncated to nothing, unless a
    /// reader still uses the WAL; one within the limit is left alone.
    #[test]
    fn shrinking_truncates_a_grown_wal_unless_a_reader_uses_it() {
        const SMALL: u64 = 64 * 1024;
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let wal = dir.path().join("wal.db-wal");
        let restarting = AtomicBool::new(false);
        writer
            .execute("INSERT INTO t (k, v) VALUES (1, x'00')", [])
            .expect("small insert");
        assert_eq!(
            shrink(&checkpointer, &restarting, &wal, SMALL).expect("shrink"),
            Shrunk::Small
        );
        let grown = grow(&writer, dir.path(), 2);
        assert!(grown > SMALL, "the WAL did not grow: {grown} bytes");
        let (reader, seen) = reading(&path);
        assert_eq!(seen, 2);
        assert_eq!(
            shrink(&checkpointer, &restarting, &wal, SMALL).expect("shrink"),
            Shrunk::Busy
        );
        assert_eq!(wal_size(dir.path()), grown, "truncated under a reader");
        reader.execute_batch("COMMIT").expect("end the read");
        assert_eq!(
            shrink(&checkpointer, &restarting, &wal, SMALL).expect("shrink"),
            Shrunk::Truncated
        );
        assert_eq!(wal_size(dir.path()), 0);
        assert!(!restarting.load(Ordering::Acquire), "left the writer waiting");
        let rows: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 2, "the rows survived the truncation");
    }

    /// Once its writer stops waking it, the checkpointer shrinks a grown
    /// WAL file by itself (a quiet time of zero here: the first look after
    /// a pass finds it quiet; the test waits for the file, not for a time).
    #[test]
    fn a_quiet_checkpointer_shrinks_a_grown_wal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, writer, checkpointer) = writer_and_checkpointer(dir.path());
        let grown = grow(&writer, dir.path(), 1);
        let (wake, woken) = mpsc::sync_channel(1);
        let seen = Arc::new(AtomicI64::new(0));
        let shrinking = Shrinking {
            wal: dir.path().join("wal.db-wal"),
            quiet: Duration::ZERO,
            limit: grown / 2,
        };
        let thread = thread::spawn(move || {
            super::super::busy::set_timeout(Duration::ZERO);
            let (restarting, finish) = (AtomicBool::new(false), AtomicBool::new(false));
            let shared = Shared {
                looked_at: &seen,
                restarting: &restarting,
                finish: &finish,
            };
            run(&checkpointer, &woken, &shared, &shrinking);
        });
        wake.send(()).expect("wake");
        while wal_size(dir.path()) > grown / 2 {
            assert!(!thread.is_finished(), "the checkpointer stopped");
            thread::sleep(Duration::from_millis(1));
        }
        drop(wake);
        thread.join().expect("the checkpointer panicked");
        assert_eq!(wal_size(dir.path()), 0);
    }

    /// The writer's busy handler, while this engine's own checkpointer
    /// holds the write lock for its `RESTART` step, waits without marking
    /// the turn file: a database one process writes never gets one. A wait
    /// for anything else still marks it.
    #[test]
    fn waiting_for_its_own_checkpointer_leaves_no_turn_file() {
        use crate::engine::{busy, turn};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wal.db");
        new_wal_db(&path, "CREATE TABLE t (k INTEGER PRIMARY KEY)");
        // This test's thread plays the writer engine's.
        turn::take_part(&path);
        busy::set_timeout(Duration::from_secs(5));
        let restarting = Arc::new(AtomicBool::new(true));
        busy::watch_checkpointer(Some(Arc::clone(&restarting)));
        assert!(busy::handler(0), "gave up at once");
        assert!(
            !turn::path_of(&path).exists(),
            "waiting for its own checkpointer made a turn file"
        );
        restarting.store(false, Ordering::Release);
        assert!(busy::handler(1), "gave up at once");
        assert!(
            turn::path_of(&path).exists(),
            "a wait for another writer is not marked"
        );
        turn::waited();
        busy::watch_checkpointer(None);
    }

    /// The hook wakes the checkpointer once a thousand frames were
    /// written since it last looked, inside the commit that wrote them (so
    /// this needs no waiting), and not on the commits before.
    #[test]
    fn the_hook_wakes_the_checkpointer_after_a_thousand_new_frames() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wal.db");
        new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL); PRAGMA wal_checkpoint(TRUNCATE);",
        );
        let writer = connect(&path, &SqliteOptions::default(), Access::Write).expect("writer");
        writer.wal_hook(Some(hook));
        // This test's thread plays the writer engine's.
        let (wake, woken) = mpsc::sync_channel(1);
        WAKES.set(Some(Wakes {
            looked_at: Arc::new(AtomicI64::new(0)),
            wake,
            finish: Arc::new(AtomicBool::new(false)),
        }));
        // The WAL's frames (3.51's NOOP mode reads them without checkpointing).
        let frames = || -> i64 {
            writer
                .query_row("PRAGMA wal_checkpoint(NOOP)", [], |r| r.get(1))
                .expect("frames")
        };
        let mut k = 0;
        while frames() < FRAMES {
            assert!(woken.try_recv().is_err(), "woken at {} frames", frames());
            // About 25 pages a commit.
            writer
                .execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(100000))", [k])
                .expect("insert");
            k += 1;
        }
        assert!(woken.try_recv().is_ok(), "not woken at {} frames", frames());
        drop(WAKES.take());
    }

    /// A writer engine's connection leaves the checkpoints to its
    /// checkpointer (its automatic checkpoint is off), and closing the
    /// engine closes the checkpointer's connection too: the last close
    /// removes the WAL.
    #[tokio::test]
    async fn a_writer_engine_does_not_checkpoint_and_its_close_removes_the_wal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wal.db");
        new_wal_db(
            &path,
            "CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL); PRAGMA wal_checkpoint(TRUNCATE);",
        );
        let engine =
            Arc::new(Engine::start(&path, &SqliteOptions::default(), Access::Write).expect("engine"));
        let automatic: i64 = engine
            .read(|conn| {
                conn.query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
                    .map_err(|e| engine_error("reading wal_autocheckpoint", e))
            })
            .await
            .expect("read");
        assert_eq!(automatic, 0, "the writer's connection checkpoints by itself");
        // About 1,300 pages of 4 KiB, in 13 commits: the checkpointer is woken.
        for k in 0..13 {
            engine
                .write(move |conn| {
                    conn.execute("INSERT INTO t (k, v) VALUES (?1, zeroblob(400000))", [k])
                        .map(drop)
                        .map_err(|e| engine_error("inserting", e))
                })
                .await
                .expect("write");
        }
        engine.close().await;
        assert!(
            !wal_of(&path).exists(),
            "closing left the WAL behind: a connection is still open"
        );
        let rows: i64 = Connection::open(&path)
            .and_then(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
            .expect("count");
        assert_eq!(rows, 13, "the rows survived the close");
    }
}
