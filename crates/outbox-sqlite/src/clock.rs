//! The database's clock, as the statements read it.
//!
//! Every statement that needs "now" reads [`now_ms!`]: the one row of a
//! per-connection view, `temp.outbox_clock`, that each connection of the
//! store creates when it opens ([`install_on`]). Which clock the view reads
//! is chosen when the store opens: SQLite's own (the process's wall clock,
//! in integer milliseconds), or, in a store opened with the test clock
//! (`SqliteOptions::with_test_clock`, feature `test-util` only), that clock
//! plus an offset stored in the database,
//! which `advance_clock_for_tests` moves for every instance and process on
//! the file. A production store never reads that offset: its statements are
//! the same text, and its view has no table in it.

/// The database's clock in integer milliseconds since the Unix epoch, as an
/// SQL expression: an uncorrelated scalar subquery, evaluated once per
/// statement (and SQLite's 'now' is the same for every use within one
/// statement).
macro_rules! now_ms {
    () => {
        "(SELECT ms FROM temp.outbox_clock)"
    };
}
pub(crate) use now_ms;

/// Which clock a store's connections read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Clock {
    /// SQLite's own clock.
    #[default]
    System,
    /// SQLite's clock plus the test offset stored in the database.
    #[cfg(feature = "test-util")]
    Test,
}

/// SQLite's clock in integer milliseconds (`unixepoch('subsec')` needs
/// SQLite 3.42; the bundled one is 3.51).
const SYSTEM: &str =
    "CREATE TEMP VIEW outbox_clock (ms) AS SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The test clock: SQLite's plus the offset stored in the database (0 until
/// `advance_clock_for_tests` stores one).
#[cfg(feature = "test-util")]
const TEST: &str = "CREATE TEMP VIEW outbox_clock (ms) AS SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) \
     + COALESCE((SELECT CAST(value AS INTEGER) FROM main.outbox_meta WHERE key = 'test_clock_offset_ms'), 0)";

/// Whether the database has its meta table (the test clock's view reads it,
/// and SQLite refuses a view of a table that does not exist yet).
const HAS_META: &str =
    "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'outbox_meta')";

impl Clock {
    /// The view's definition, for a database that has its meta table or
    /// not yet (before its first migration, the test clock reads SQLite's
    /// own until [`install_on`] runs again).
    #[cfg_attr(not(feature = "test-util"), allow(unused_variables))]
    fn view(self, has_meta: bool) -> &'static str {
        match self {
            Clock::System => SYSTEM,
            #[cfg(feature = "test-util")]
            Clock::Test if has_meta => TEST,
            #[cfg(feature = "test-util")]
            Clock::Test => SYSTEM,
        }
    }

    /// Whether this clock reads the database (so its view depends on
    /// whether the meta table exists).
    fn reads_meta(self) -> bool {
        self != Clock::System
    }
}

/// The database's clock, read on the engine connection `conn`.
pub(crate) fn now(conn: &rusqlite::Connection) -> rusqlite::Result<i64> {
    conn.prepare_cached(concat!("SELECT ", now_ms!()))?
        .query_row([], |r| r.get(0))
}

/// Creates (or replaces) the clock view on the engine connection `conn`.
pub(crate) fn install_on(conn: &rusqlite::Connection, clock: Clock) -> rusqlite::Result<()> {
    let has_meta = clock.reads_meta() && conn.query_row(HAS_META, [], |r| r.get::<_, bool>(0))?;
    conn.execute_batch("DROP VIEW IF EXISTS temp.outbox_clock")?;
    conn.execute_batch(clock.view(has_meta))
}

/// Moves the test clock forward by `?1` milliseconds.
#[cfg(feature = "test-util")]
pub(crate) const ADVANCE_TEST_CLOCK: &str = "INSERT INTO outbox_meta (key, value) VALUES ('test_clock_offset_ms', ?1) \
     ON CONFLICT (key) DO UPDATE SET value = CAST(value AS INTEGER) + ?1";

/// A store's connections read the clock it was opened with; `Ok` unless a
/// test asks to move the clock of a store opened without the test clock.
#[cfg(feature = "test-util")]
pub(crate) fn check_test_clock(clock: Clock, path: &std::path::Path) -> outbox_core::Result<()> {
    if clock == Clock::Test {
        return Ok(());
    }
    Err(outbox_core::Error::Config(format!(
        "{} was opened without the test clock: open it with `SqliteOptions::with_test_clock()` to move its clock",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The view's definition on `conn`.
    fn view_sql(conn: &rusqlite::Connection) -> String {
        conn.query_row(
            "SELECT sql FROM sqlite_temp_master WHERE type = 'view' AND name = 'outbox_clock'",
            [],
            |r| r.get(0),
        )
        .expect("the clock view")
    }

    fn now(conn: &rusqlite::Connection) -> i64 {
        conn.query_row(concat!("SELECT ", now_ms!()), [], |r| r.get(0))
            .expect("now")
    }

    fn wall_ms() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }

    #[test]
    fn the_system_clock_reads_no_table_and_is_the_wall_clock() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        conn.execute_batch(
            "CREATE TABLE outbox_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
             INSERT INTO outbox_meta VALUES ('test_clock_offset_ms', '3600000');",
        )
        .expect("meta");
        install_on(&conn, Clock::System).expect("install");
        assert!(!view_sql(&conn).contains("outbox_meta"), "{}", view_sql(&conn));
        // The same wall clock (a second's slack for a clock step between).
        let (before, at, after) = (wall_ms(), now(&conn), wall_ms());
        assert!(
            before - 1_000 <= at && at <= after + 1_000,
            "{before} <= {at} <= {after}"
        );
    }

    #[cfg(feature = "test-util")]
    #[test]
    fn the_test_clock_adds_the_stored_offset_once_the_meta_table_exists() {
        let conn = rusqlite::Connection::open_in_memory().expect("open");
        // Before the first migration: no table to read, SQLite's clock.
        install_on(&conn, Clock::Test).expect("install");
        assert!(!view_sql(&conn).contains("outbox_meta"));
        conn.execute_batch(
            "CREATE TABLE outbox_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL); \
             INSERT INTO outbox_meta VALUES ('test_clock_offset_ms', '3600000');",
        )
        .expect("meta");
        install_on(&conn, Clock::Test).expect("install again");
        let before = wall_ms();
        let at = now(&conn);
        assert!(at >= before + 3_600_000, "{at} is not an hour past {before}");
    }
}
