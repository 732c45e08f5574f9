//! The engine connections' busy handler: short, growing pauses instead of
//! SQLite's default schedule.
//!
//! SQLite's own handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50 and
//! then 100 ms between tries while another connection (another process)
//! holds the write lock. Write transactions here last about a millisecond,
//! so a waiter that just missed the lock sleeps far longer than the holder
//! keeps it: with two processes writing one journal (an appender and a
//! worker), those sleeps were the tail of the append-to-applied lag. This
//! handler pauses 50 µs and grows the pause by half each try up to 2 ms,
//! until the connection's busy timeout has passed since the first try.
//! A writer engine's waits are marked on the database's turn file
//! ([`super::turn`]); a marked wait keeps its first pauses at most
//! [`WHILE_MARKED`], since the holder pauses for it before its next
//! transaction.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The shortest pause between two tries.
const FIRST: Duration = Duration::from_micros(50);
/// The longest pause between two tries.
const LONGEST: Duration = Duration::from_millis(2);
/// The longest pause of a wait marked on the turn file: well within the
/// holder's pause for waiters ([`super::turn::LONGEST_YIELD`]).
const WHILE_MARKED: Duration = Duration::from_micros(100);
/// How many tries of a marked wait keep their pauses that short (about
/// 5 ms): past them the holder is in a long transaction, and the pauses
/// grow as unmarked ones do instead of polling the lock for its length.
const MARKED_TRIES: i32 = 50;

thread_local! {
    /// This engine thread's busy timeout, and when the current wait began.
    static WAIT: Cell<(Duration, Option<Instant>)> = const { Cell::new((Duration::ZERO, None)) };
    /// A writer thread's checkpointer's flag, set while that checkpointer
    /// holds the write lock (its `RESTART` step, a few frames' copy; see
    /// `checkpoint.rs`, which hands it over here).
    static CHECKPOINTER_HOLDS_LOCK: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Sets the busy timeout of the engine thread that calls it (each engine
/// thread owns one connection).
pub(crate) fn set_timeout(timeout: Duration) {
    WAIT.set((timeout, None));
}

/// Makes the busy handler of the calling (writer) thread wait for its own
/// checkpointer as `holds_lock` says (`None`: it has none).
pub(super) fn watch_checkpointer(holds_lock: Option<Arc<AtomicBool>>) {
    CHECKPOINTER_HOLDS_LOCK.set(holds_lock);
}

/// Whether this writer thread's own checkpointer holds the write lock: the
/// handler then waits for it without marking the turn file, which is for
/// writers of other processes (`super::turn`). A database one process
/// writes never gets one.
fn checkpointer_holds_lock() -> bool {
    CHECKPOINTER_HOLDS_LOCK.with_borrow(|f| f.as_ref().is_some_and(|f| f.load(Ordering::Acquire)))
}

/// The pause before try `n + 1` (`n` tries failed so far).
fn pause(n: i32) -> Duration {
    let mut p = FIRST;
    for _ in 0..n.clamp(0, 16) {
        p = (p * 3 / 2).min(LONGEST);
    }
    p
}

/// The handler given to SQLite (`sqlite3_busy_handler`): `true` to try
/// again after a pause, `false` to give up with `SQLITE_BUSY`.
pub(crate) fn handler(n: i32) -> bool {
    let (timeout, started) = WAIT.get();
    let now = Instant::now();
    let started = match (n, started) {
        (0, _) | (_, None) => now,
        (_, Some(t)) => t,
    };
    WAIT.set((timeout, Some(started)));
    if now.duration_since(started) >= timeout {
        return false;
    }
    let pause = if checkpointer_holds_lock() {
        // This engine's own checkpointer, for a few frames: no other
        // process's writer to mark the wait for.
        pause(n).min(WHILE_MARKED)
    } else if super::turn::waiting() && n < MARKED_TRIES {
        pause(n).min(WHILE_MARKED)
    } else {
        pause(n)
    };
    thread::sleep(pause);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_from_50_microseconds_to_2_milliseconds() {
        assert_eq!(pause(0), FIRST);
        assert!(pause(1) > pause(0));
        assert_eq!(pause(100), LONGEST);
        let waited: Duration = (0..20).map(pause).sum();
        assert!(
            waited < Duration::from_millis(30),
            "twenty tries wait {waited:?}, not SQLite's default seconds"
        );
    }

    #[test]
    fn a_zero_timeout_gives_up_at_once() {
        set_timeout(Duration::ZERO);
        assert!(!handler(0));
    }
}
