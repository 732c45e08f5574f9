//! The files SQLite and this engine keep beside a database (its WAL, the
//! turn file), named from the database's path. A leaf of the engine.

use std::path::{Path, PathBuf};

/// The file SQLite (or this engine) keeps beside the database at `db`:
/// its name with `suffix` appended (`-wal`, `-turn`).
pub(super) fn beside(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}
