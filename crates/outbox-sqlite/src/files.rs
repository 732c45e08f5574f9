//! Checking a database file before SQLite opens it: the path, the
//! directory, the permissions, the header; and the names beside it.

use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use outbox_core::{Error, Location, Result};

use crate::SqliteOptions;

/// `sqlite://path`, `sqlite:path` to a path, by [`Location::parse`]'s
/// rules (no options, no `:memory:`).
pub(crate) fn path_from_url(url: &str) -> Result<PathBuf> {
    if !url.starts_with("sqlite:") {
        return Err(Error::invalid(
            "a sqlite url must start with sqlite:// or sqlite:",
        ));
    }
    match Location::parse(url)? {
        Location::Sqlite(path) => Ok(path),
        _ => Err(Error::invalid(
            "a sqlite url must start with sqlite:// or sqlite:",
        )),
    }
}

fn io_invalid(path: &Path, what: &str, e: io::Error) -> Error {
    Error::invalid(format_args!("cannot open {}: {what}: {e}", path.display()))
}

const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Checks and prepares the path before SQLite sees it: the directory exists
/// (or is created 0700 when asked), the file is created 0600 if missing, an
/// existing file is a SQLite database (or empty) and writable. Returns the
/// absolute path. Never changes an existing file.
pub(crate) fn prepare_path(path: &Path, options: &SqliteOptions) -> Result<PathBuf> {
    let shown = path.display();
    if path.as_os_str().is_empty() {
        return Err(Error::invalid("the database path is empty"));
    }
    if path.to_str().is_none() {
        return Err(Error::invalid(format_args!(
            "database path {shown} is not valid UTF-8"
        )));
    }
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid(format_args!("database path {shown} names no file")))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::invalid(format_args!(
                "cannot open {shown}: {} is not a directory",
                parent.display()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if !options.create_if_missing {
                return Err(Error::NotFound(format!(
                    "database file {shown} (its directory does not exist)"
                )));
            }
            if !options.create_dirs {
                return Err(Error::invalid(format_args!(
                    "cannot open {shown}: directory {} does not exist",
                    parent.display()
                )));
            }
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| io_invalid(path, "creating its directory failed", e))?;
        }
        Err(e) => return Err(io_invalid(path, "its directory is not accessible", e)),
    }
    let dir = parent
        .canonicalize()
        .map_err(|e| io_invalid(path, "resolving its directory failed", e))?;
    let abs = dir.join(name);
    let shown = abs.display();

    if options.read_only {
        return prepare_read_only(abs);
    }
    if !options.create_if_missing {
        // `exists()` reads "cannot look" as "absent"; an unreadable
        // directory is a permission problem, not a database to create.
        match abs.try_exists() {
            Ok(true) => {}
            Ok(false) => {
                return Err(Error::NotFound(format!(
                    "database file {shown} (create it with `outbox migrate`)"
                )));
            }
            Err(e) => return Err(io_invalid(&abs, "cannot look for it", e)),
        }
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&abs)
    {
        Ok(_) => return Ok(abs),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_invalid(&abs, "creating the file failed", e)),
    }
    // An empty file is a database that was never created; only a command
    // allowed to create databases may initialize it.
    let meta = check_existing(&abs, options.create_if_missing)?;
    // `readonly()` means no write bit at all: honoured even when running as
    // root, who would otherwise be allowed to write.
    if meta.permissions().readonly() {
        return Err(Error::invalid(format_args!(
            "cannot open {shown}: the file is read-only"
        )));
    }
    OpenOptions::new()
        .write(true)
        .open(&abs)
        .map_err(|e| io_invalid(&abs, "it is not writable", e))?;
    Ok(abs)
}

/// [`prepare_path`] for a read-only open: the file exists, is a regular,
/// non-empty file with SQLite's header; nothing is created or opened for
/// writing.
fn prepare_read_only(abs: PathBuf) -> Result<PathBuf> {
    let shown = abs.display();
    match abs.try_exists() {
        Ok(true) => {}
        Ok(false) => {
            return Err(Error::NotFound(format!(
                "database file {shown} (opened read-only, so it is not created; create it with `outbox migrate`)"
            )));
        }
        Err(e) => return Err(io_invalid(&abs, "cannot look for it", e)),
    }
    check_existing(&abs, false)?;
    Ok(abs)
}

/// Checks an existing file at `abs`: a regular file with SQLite's header,
/// or (when `may_be_empty`) an empty one. Returns its metadata.
fn check_existing(abs: &Path, may_be_empty: bool) -> Result<std::fs::Metadata> {
    let shown = abs.display();
    let meta = std::fs::metadata(abs).map_err(|e| io_invalid(abs, "reading its metadata failed", e))?;
    if !meta.is_file() {
        return Err(Error::invalid(format_args!(
            "cannot open {shown}: not a regular file"
        )));
    }
    if meta.len() == 0 {
        if may_be_empty {
            return Ok(meta);
        }
        return Err(Error::NotFound(format!(
            "database file {shown} is empty (create it with `outbox migrate`)"
        )));
    }
    let mut header = [0u8; 16];
    let mut file = OpenOptions::new()
        .read(true)
        .open(abs)
        .map_err(|e| io_invalid(abs, "reading it failed", e))?;
    let mut got = 0;
    while got < header.len() {
        match file.read(&mut header[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_invalid(abs, "reading it failed", e)),
        }
    }
    if got < header.len() || &header != SQLITE_HEADER {
        return Err(Error::invalid(format_args!("{shown} is not a SQLite database")));
    }
    Ok(meta)
}

/// The file beside the database `path` with `suffix` (`-wal`, `-shm`).
pub(crate) fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Whether a read-only open of `path` reads it as immutable: when no `-wal`
/// file is beside it, no process has it open in WAL mode, and a read-only
/// connection would otherwise create the `-wal` and `-shm` files (or, in a
/// directory it cannot write, fail to open).
pub(crate) fn read_as_immutable(path: &Path) -> bool {
    !beside(path, "-wal").exists()
}

/// The error of a write asked of a store opened read-only.
pub(crate) fn read_only_error(path: &Path, what: impl fmt::Display) -> Error {
    Error::Storage {
        message: format!(
            "{what}: {} is open read-only (sqlite://…?mode=ro, or a file this user cannot write); \
             this needs write access",
            path.display()
        ),
        temporary: false,
        source: None,
    }
}
