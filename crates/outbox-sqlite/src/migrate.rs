//! Making a database file ready before a store opens its connections: its
//! role and schema version checked, WAL mode, the embedded migrations and
//! the role record, on one short-lived connection of SQLite's C API.
//!
//! Applied migrations are recorded in `_outbox_migrations` in the layout,
//! descriptions and SHA-384 checksums that `sqlx`'s migrator used when it
//! ran these files (before ADR 0038), so files it migrated open unchanged
//! and a file migrated here reads the same to it.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use outbox_core::{Error, Result};
use rusqlite::{Connection, OpenFlags, OptionalExtension as _};
use sha2::{Digest as _, Sha384};

use crate::SqliteOptions;
use crate::engine::{engine_error, open_name};
use outbox_sql::Role;

/// The table recording applied migrations. Not `_sqlx_migrations`, so an
/// application that keeps its own migrations in the same file (typically
/// the projection database) does not collide.
pub(crate) const MIGRATIONS_TABLE: &str = "_outbox_migrations";

/// How many times `BEGIN IMMEDIATE` is retried after SQLite's own busy
/// timeout expired, before a temporary error reaches the caller.
const BUSY_RETRIES: u32 = 3;

/// One embedded migration: `migrations/<role>/<version>_<name>.sql`.
pub(crate) struct Migration {
    pub(crate) version: i64,
    /// The file name's `<name>` with `_` as spaces, as recorded.
    pub(crate) description: &'static str,
    pub(crate) sql: &'static str,
}

macro_rules! migration {
    ($role:literal, $version:literal, $name:literal, $description:literal) => {
        Migration {
            version: $version,
            description: $description,
            sql: include_str!(concat!("../migrations/", $role, "/", $name, ".sql")),
        }
    };
}

/// The journal's migrations, oldest first (`migrations/journal`; a unit
/// test checks this list against the directory).
const JOURNAL: &[Migration] = &[
    migration!("journal", 1, "0001_init", "init"),
    migration!("journal", 2, "0002_workers", "workers"),
    migration!(
        "journal",
        3,
        "0003_claims_touch_no_status_index",
        "claims touch no status index"
    ),
    migration!("journal", 4, "0004_activity", "activity"),
    migration!("journal", 5, "0005_first_failure", "first failure"),
    migration!("journal", 6, "0006_partitions", "partitions"),
    migration!("journal", 7, "0007_sinks", "sinks"),
    migration!("journal", 8, "0008_alone", "alone"),
    migration!("journal", 9, "0009_consumers", "consumers"),
    migration!("journal", 10, "0010_lean_append", "lean append"),
    migration!(
        "journal",
        11,
        "0011_claims_write_no_processing_index",
        "claims write no processing index"
    ),
];

/// The projection database's migrations, oldest first.
const PROJECTION: &[Migration] = &[
    migration!("projection", 1, "0001_init", "init"),
    migration!("projection", 2, "0002_runs", "runs"),
    migration!("projection", 3, "0003_views", "views"),
    migration!("projection", 4, "0004_view_digests", "view digests"),
    migration!("projection", 5, "0005_run_positions", "run positions"),
    migration!("projection", 6, "0006_generations", "generations"),
    migration!(
        "projection",
        7,
        "0007_watermarks_follow_checkpoints",
        "watermarks follow checkpoints"
    ),
    migration!("projection", 8, "0008_skipped", "skipped"),
];

/// A role's migrations, oldest first.
pub(crate) fn migrations(role: Role) -> &'static [Migration] {
    match role {
        Role::Journal => JOURNAL,
        Role::Projection => PROJECTION,
    }
}

/// Checks and prepares the file at `path` for a store of `role`: the path
/// ([`crate::files::prepare_path`]), then on a connection of its own the
/// role and version checks, WAL and the migrations. Returns the absolute
/// path. A refused file is left as it was.
pub(crate) async fn prepare(path: &Path, options: &SqliteOptions, role: Role) -> Result<PathBuf> {
    options.validate()?;
    let abs = crate::files::prepare_path(path, options)?;
    let (options, file) = (options.clone(), abs.clone());
    // Off the async runtime: opening may wait for another process's locks.
    let (reply, done) = tokio::sync::oneshot::channel();
    thread::Builder::new()
        .name("outbox-sqlite-open".into())
        .spawn(move || {
            let _ = reply.send(setup(&file, &options, role));
        })
        .map_err(|e| crate::errors::internal(format!("preparing {}: {e}", abs.display())))?;
    done.await
        .map_err(|_| crate::errors::internal(format!("preparing {}: the thread stopped", abs.display())))??;
    Ok(abs)
}

/// What an existing file says about itself.
struct Found {
    role: Option<String>,
    version: Option<i64>,
}

fn inspect(conn: &Connection, path: &Path) -> Result<Found> {
    let not_db = |e: rusqlite::Error| {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
            Error::invalid(format_args!("{} is not a SQLite database", path.display()))
        } else {
            engine_error(format_args!("reading the schema of {}", path.display()), e)
        }
    };
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name IN ('outbox_meta', ?1)")
        .and_then(|mut st| st.query_map([MIGRATIONS_TABLE], |r| r.get(0))?.collect())
        .map_err(not_db)?;
    let role = if tables.iter().any(|t| t == "outbox_meta") {
        conn.query_row("SELECT value FROM outbox_meta WHERE key = 'role'", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(not_db)?
    } else {
        None
    };
    let version = if tables.iter().any(|t| t == MIGRATIONS_TABLE) {
        conn.query_row("SELECT MAX(version) FROM _outbox_migrations", [], |r| r.get(0))
            .map_err(not_db)?
    } else {
        None
    };
    Ok(Found { role, version })
}

/// Refuses a file of the other role or of a newer schema. Reads only.
fn check(found: &Found, role: Role, path: &Path, newest: i64) -> Result<()> {
    if let Some(r) = &found.role {
        if r != role.as_str() {
            return Err(Error::invalid(format_args!(
                "{} is an outbox {r} database, not a {role} database; the {role} store needs its own file",
                path.display()
            )));
        }
    } else if found.version.is_some() {
        return Err(Error::invalid(format_args!(
            "{} has outbox migrations but no role; refusing to use it as a {role} database",
            path.display()
        )));
    }
    if let Some(v) = found.version
        && v > newest
    {
        return Err(Error::SchemaTooNew {
            database: format!("{role} database {}", path.display()),
            found: v,
            supported: newest,
        });
    }
    Ok(())
}

/// The connection the checks and migrations run on: read-write, or for a
/// read-only store read-only (immutable when no `-wal` is beside it).
fn connect(path: &Path, options: &SqliteOptions) -> Result<Connection> {
    let (name, uri) = open_name(path, options);
    let access = if options.read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
    };
    let open = |e| engine_error(format_args!("opening {}", path.display()), e);
    let conn =
        Connection::open_with_flags(name, access | OpenFlags::SQLITE_OPEN_NO_MUTEX | uri).map_err(open)?;
    conn.busy_timeout(options.busy_timeout).map_err(open)?;
    if !options.read_only {
        let sync = match options.synchronous {
            crate::Synchronous::Full => "FULL",
            crate::Synchronous::Normal => "NORMAL",
            crate::Synchronous::Off => "OFF",
        };
        conn.execute_batch(&format!("PRAGMA synchronous = {sync}; PRAGMA foreign_keys = ON;"))
            .map_err(open)?;
    }
    Ok(conn)
}

/// Role and version checks, WAL, migrations, role record.
fn setup(path: &Path, options: &SqliteOptions, role: Role) -> Result<()> {
    let shown = path.display();
    let migrations = migrations(role);
    let newest = migrations.last().map_or(0, |m| m.version);
    let conn = connect(path, options)?;
    // 1. Read-only checks first: a refused file is left exactly as it was.
    let found = inspect(&conn, path)?;
    check(&found, role, path, newest)?;
    let version = found.version.unwrap_or(0);
    if (!options.migrate || options.read_only) && version < newest {
        return Err(Error::SchemaTooOld {
            database: format!("{role} database {shown}"),
            found: version,
            supported: newest,
        });
    }
    // Read-only: no WAL switch (a database of ours is in WAL mode since its
    // first migration), no migration, no role record.
    if options.read_only {
        return Ok(());
    }

    // 2. WAL. Switching needs an exclusive lock that the busy handler does
    //    not wait for, so retry while another opener holds one.
    let started = Instant::now();
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get::<_, String>(0)) {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => break,
            Ok(mode) => {
                return Err(Error::Storage {
                    message: format!("{shown} cannot use WAL mode (journal mode is {mode})"),
                    temporary: false,
                    source: None,
                });
            }
            Err(e) if crate::engine::is_busy(&e) && started.elapsed() < options.busy_timeout => {
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(engine_error(format_args!("switching {shown} to WAL mode"), e)),
        }
    }

    // 3. Migrate and record the role in one write transaction, checking
    //    again under the write lock (another process may have won).
    //    Without `migrate` the schema is current (checked above): no write.
    if !options.migrate {
        return Ok(());
    }
    begin_immediate(&conn, path, options.busy_timeout)?;
    let migrated = check(&inspect(&conn, path)?, role, path, newest)
        .and_then(|()| run(&conn, migrations, role, path))
        .and_then(|()| {
            conn.execute(
                "INSERT INTO outbox_meta (key, value) VALUES ('role', ?1) ON CONFLICT (key) DO NOTHING",
                [role.as_str()],
            )
            .map(drop)
            .map_err(|e| engine_error(format_args!("recording the role of {shown}"), e))
        })
        .and_then(|()| {
            conn.execute_batch("COMMIT")
                .map_err(|e| engine_error(format_args!("migrating {shown}"), e))
        });
    if migrated.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    migrated
}

/// `BEGIN IMMEDIATE`, retried a few times if SQLite's busy timeout expires
/// first (another process holds the write lock); then a temporary error.
fn begin_immediate(conn: &Connection, path: &Path, busy_timeout: Duration) -> Result<()> {
    let mut attempt = 0;
    loop {
        match conn.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => return Ok(()),
            Err(e) if crate::engine::is_busy(&e) && attempt < BUSY_RETRIES => {
                attempt += 1;
                tracing::debug!(path = %path.display(), attempt, "sqlite write lock busy; retrying");
                thread::sleep(Duration::from_millis(10 * u64::from(attempt)));
            }
            Err(e) => {
                return Err(engine_error(
                    format_args!(
                        "starting a write transaction on {} (waited {busy_timeout:?} per attempt)",
                        path.display()
                    ),
                    e,
                ));
            }
        }
    }
}

/// The migrations not yet applied, in order, inside the caller's
/// transaction; refuses a file whose record has a failed migration, a
/// version this build does not know, or a checksum that differs.
fn run(conn: &Connection, migrations: &[Migration], role: Role, path: &Path) -> Result<()> {
    let shown = path.display();
    let err = |e| engine_error(format_args!("migrating the {role} database {shown}"), e);
    let refuse = |why: String| Error::Storage {
        message: format!("migrating the {role} database {shown}: {why}"),
        temporary: false,
        source: None,
    };
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
            version BIGINT PRIMARY KEY,
            description TEXT NOT NULL,
            installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
            success BOOLEAN NOT NULL,
            checksum BLOB NOT NULL,
            execution_time BIGINT NOT NULL
        );"
    ))
    .map_err(err)?;
    let applied: Vec<(i64, bool, Vec<u8>)> = conn
        .prepare(&format!(
            "SELECT version, success, checksum FROM {MIGRATIONS_TABLE} ORDER BY version"
        ))
        .and_then(|mut st| {
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(err)?;
    for (version, success, checksum) in &applied {
        if !success {
            return Err(refuse(format!(
                "migration {version} was partially applied; fix and remove the migration record"
            )));
        }
        let Some(m) = migrations.iter().find(|m| m.version == *version) else {
            return Err(refuse(format!(
                "migration {version} was previously applied but is missing in this build"
            )));
        };
        if checksum.as_slice() != Sha384::digest(m.sql.as_bytes()).as_slice() {
            return Err(refuse(format!(
                "migration {version} was previously applied but has been modified"
            )));
        }
    }
    for m in migrations {
        if applied.iter().any(|(v, _, _)| *v == m.version) {
            continue;
        }
        let started = Instant::now();
        conn.execute_batch(m.sql).map_err(err)?;
        let took = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
        conn.execute(
            &format!(
                "INSERT INTO {MIGRATIONS_TABLE} (version, description, success, checksum, execution_time) \
                 VALUES (?1, ?2, TRUE, ?3, ?4)"
            ),
            rusqlite::params![
                m.version,
                m.description,
                Sha384::digest(m.sql.as_bytes()).as_slice(),
                took
            ],
        )
        .map_err(err)?;
        tracing::info!(path = %shown, %role, version = m.version, "applied a migration");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded lists are the `migrations/` directories: every file, in
    /// version order, with the description `sqlx` derived from its name
    /// (the recorded checksums and descriptions depend on it).
    #[test]
    fn the_embedded_lists_are_the_migration_directories() {
        for role in [Role::Journal, Role::Projection] {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(role.as_str());
            let mut files: Vec<(i64, String, String)> = std::fs::read_dir(&dir)
                .expect("the migrations directory")
                .map(|e| {
                    let name = e.expect("an entry").file_name().into_string().expect("utf-8");
                    let (version, rest) = name.split_once('_').expect("<version>_<name>.sql");
                    let sql = std::fs::read_to_string(dir.join(&name)).expect("read");
                    (
                        version.parse().expect("a numeric version"),
                        rest.trim_end_matches(".sql").replace('_', " "),
                        sql,
                    )
                })
                .collect();
            files.sort();
            let embedded: Vec<(i64, String, String)> = migrations(role)
                .iter()
                .map(|m| (m.version, m.description.to_owned(), m.sql.to_owned()))
                .collect();
            assert_eq!(embedded, files, "{role} migrations");
        }
    }
}
