//! Opening an engine's connections: the writer's, the readers' and the
//! checkpointer's, all set up alike.

use std::path::Path;

use outbox_core::Result;
use rusqlite::{Connection, OpenFlags};

use super::busy;
use super::values::engine_error;
use crate::{SqliteOptions, Synchronous};

/// Whether an engine writes (`BEGIN IMMEDIATE` groups) or only reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    Write,
    Read,
}

/// The name SQLite opens `path` by: the path itself, or for a read-only
/// store with no `-wal` beside it a `file:` URI with `immutable=1` (no
/// `-wal` or `-shm` file is created; see [`SqliteOptions::read_only`]).
pub(crate) fn open_name(path: &Path, options: &SqliteOptions) -> (String, OpenFlags) {
    let plain = path.to_string_lossy().into_owned();
    if !(options.read_only && crate::files::read_as_immutable(path)) {
        return (plain, OpenFlags::empty());
    }
    let mut uri = String::from("file:");
    for b in plain.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'-' | b'_') {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    (uri, OpenFlags::SQLITE_OPEN_URI)
}

/// Opens a connection to an existing, migrated database file.
pub(super) fn connect(path: &Path, options: &SqliteOptions, access: Access) -> Result<Connection> {
    let (name, uri) = open_name(path, options);
    let flags = match access {
        Access::Write => OpenFlags::SQLITE_OPEN_READ_WRITE,
        Access::Read => OpenFlags::SQLITE_OPEN_READ_ONLY,
    } | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | uri;
    let open = |e| engine_error(format_args!("opening {}", path.display()), e);
    let conn = Connection::open_with_flags(name, flags).map_err(open)?;
    // SQLite's own busy handler while the connection is set up here, on the
    // caller's thread: the engine's handler reads its thread's timeout
    // (`busy::set_timeout`), which only the engine thread sets, and would
    // give up at once when a checkpoint of another connection briefly
    // holds the WAL index. The engine's handler takes over at the end.
    conn.busy_timeout(options.busy_timeout).map_err(open)?;
    conn.set_prepared_statement_cache_capacity(128);
    // Plans must not depend on bound values: SQLite 3.51 plans `LIMIT ?`
    // with the value bound, so otherwise every new binding makes a cached
    // statement parse and plan again at its next step. No statement may
    // rely on a bound value to pick an index: partial indexes are matched
    // by literals in the SQL text (see `outbox_sql::journal::list_statement`).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(open)?;
    let sync = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
        Synchronous::Off => "OFF",
    };
    // SQLite's default page cache (2 MiB) stays: a larger one fills up with
    // a large backlog and the worker's memory grows with it.
    // The writer keeps savepoint and statement journals in memory: by
    // default one spills to a temp file past 64 KiB, and a group's per-job
    // savepoints and the claims' multi-row updates wrote more there than to
    // the WAL (never synced; bounded by one group's transaction). Readers
    // keep the default, so a sort over a whole backlog (the queue summary's
    // `GROUP BY`) spills to disk instead of growing the process.
    let temp_store = match access {
        Access::Write => "MEMORY",
        Access::Read => "DEFAULT",
    };
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON; PRAGMA temp_store = {temp_store};"
    ))
    .map_err(open)?;
    if access == Access::Write {
        // Commits never truncate the WAL file: the checkpointer shrinks it
        // once the writer is quiet (see `options::WAL_SIZE_LIMIT`). A pragma that
        // sets a value also returns it: read, not executed.
        conn.query_row("PRAGMA journal_size_limit = -1", [], |_| Ok(()))
            .map_err(open)?;
    }
    // The clock the statements read (`crate::clock`).
    crate::clock::install_on(&conn, options.clock).map_err(open)?;
    conn.busy_handler(Some(busy::handler)).map_err(open)?;
    Ok(conn)
}
