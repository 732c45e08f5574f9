//! Where a store is, parsed from the URL a user writes: one set of rules
//! for the runtime's `open_stores`, the adapters' `open_url`/`connect` and
//! the `outbox` command. Parsing only: nothing is opened here.

use std::path::PathBuf;

use crate::{Error, Result};

/// A store's location: `memory:`, a SQLite file (`sqlite://path`,
/// `sqlite:path` or a plain path) or a Postgres server (`postgres://...`,
/// `postgresql://...`). Errors never repeat a URL that may hold a password.
///
/// ```
/// use outbox_core::Location;
///
/// assert_eq!(Location::parse("sqlite://data/journal.db")?, Location::Sqlite("data/journal.db".into()));
/// assert_eq!(Location::parse("memory:")?, Location::Memory);
/// assert!(Location::parse("sqlite://j.db?mode=ro").is_err()); // options go in SqliteOptions
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// `memory:`: the in-process adapter (nothing outlives the process).
    Memory,
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A Postgres database: the `postgres://` or `postgresql://` URL as given
    /// (never shown: it may hold a password).
    Postgres(String),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Memory => f.write_str("Memory"),
            Location::Sqlite(p) => f.debug_tuple("Sqlite").field(p).finish(),
            Location::Postgres(_) => f.write_str("Postgres(<url not shown>)"),
        }
    }
}

impl Location {
    /// Parses a store URL (see [`Location`]). A `sqlite:` URL must name a
    /// file, without options (`?...`, `#...`: they belong in the adapter's
    /// options) and neither `:memory:` nor a `file:` URI (use the memory
    /// adapter); a plain path is taken as it is.
    pub fn parse(url: &str) -> Result<Location> {
        match url.split_once(':') {
            Some(("memory", rest)) if rest.is_empty() || rest == "//" => Ok(Location::Memory),
            Some(("memory", _)) => Err(Error::invalid(
                "a memory store URL is `memory:` alone (the store lives in this process)",
            )),
            Some(("sqlite", rest)) => {
                sqlite_path(rest.strip_prefix("//").unwrap_or(rest)).map(Location::Sqlite)
            }
            Some(("postgres" | "postgresql", rest)) if rest.starts_with("//") => {
                Ok(Location::Postgres(url.to_owned()))
            }
            Some(("postgres" | "postgresql", _)) => Err(Error::invalid(
                "a postgres URL must start with postgres:// or postgresql:// (url not shown)",
            )),
            Some((scheme, rest)) if rest.starts_with("//") => Err(Error::invalid(format_args!(
                "unsupported database URL scheme {scheme:?} (use memory:, sqlite://path or postgres://...)"
            ))),
            _ if url.is_empty() => Err(Error::invalid("the database URL is empty")),
            // A mistyped URL (`postgres//app:pw@host/db`, `postgres:/...`) would
            // otherwise be taken for a file name and printed, password and all.
            _ if looks_like_a_url(url) => Err(Error::invalid(
                "the database URL is neither postgres://... nor sqlite://path, and looks like a mistyped URL \
                 with credentials, not a file name (url not shown)",
            )),
            _ => Ok(Location::Sqlite(PathBuf::from(url))),
        }
    }

    /// [`Location::parse`], also taking a SQLite URL's one option
    /// `?mode=ro`: the location, and whether the URL asks for the store to
    /// be opened read-only (inspection with read access only; the `outbox`
    /// command's read-only commands take it). Any other option is refused
    /// as [`Location::parse`] refuses it.
    ///
    /// ```
    /// use outbox_core::Location;
    ///
    /// assert_eq!(Location::parse_mode("sqlite://j.db?mode=ro")?, (Location::Sqlite("j.db".into()), true));
    /// assert_eq!(Location::parse_mode("sqlite://j.db")?, (Location::Sqlite("j.db".into()), false));
    /// assert!(Location::parse_mode("sqlite://j.db?mode=rwc").is_err());
    /// # Ok::<(), outbox_core::Error>(())
    /// ```
    pub fn parse_mode(url: &str) -> Result<(Location, bool)> {
        if let Some(base) = url.strip_suffix("?mode=ro")
            && base.starts_with("sqlite:")
        {
            return match Location::parse(base)? {
                l @ Location::Sqlite(_) => Ok((l, true)),
                _ => Err(Error::invalid("?mode=ro is an option of sqlite URLs only")),
            };
        }
        Location::parse(url).map(|l| (l, false))
    }
}

/// The file of a `sqlite:` URL, its scheme and `//` taken off.
fn sqlite_path(rest: &str) -> Result<PathBuf> {
    if rest.is_empty() {
        return Err(Error::invalid("the sqlite URL names no file"));
    }
    if rest.contains('?') || rest.contains('#') {
        return Err(Error::invalid(
            "sqlite URL options (?...) are not supported; use SqliteOptions instead",
        ));
    }
    if rest == ":memory:" || rest.starts_with("file:") {
        return Err(Error::invalid(
            "in-memory and file: URI databases are not supported; give a file path (or use memory:)",
        ));
    }
    Ok(PathBuf::from(rest))
}

/// Whether a value that is no URL of ours looks like a mistyped one: it
/// names a Postgres scheme, or carries `user:password@` before its first
/// `/`-separated part ends.
fn looks_like_a_url(value: &str) -> bool {
    if value.to_ascii_lowercase().starts_with("postgres") {
        return true;
    }
    value
        .split_once('@')
        .is_some_and(|(before, _)| before.contains(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_pick_their_backend() {
        for (url, want) in [
            ("memory:", Location::Memory),
            ("memory://", Location::Memory),
            ("sqlite://a/b.db", Location::Sqlite("a/b.db".into())),
            ("sqlite:b.db", Location::Sqlite("b.db".into())),
            ("sqlite:///abs/b.db", Location::Sqlite("/abs/b.db".into())),
            ("plain.db", Location::Sqlite("plain.db".into())),
            (
                "postgres://u@h/db",
                Location::Postgres("postgres://u@h/db".into()),
            ),
            (
                "postgresql://u@h/db",
                Location::Postgres("postgresql://u@h/db".into()),
            ),
        ] {
            assert_eq!(Location::parse(url).unwrap(), want, "{url}");
        }
    }

    #[test]
    fn bad_urls_are_refused_without_showing_a_password() {
        for bad in [
            "",
            "sqlite://",
            "sqlite:",
            "sqlite://j.db?mode=ro",
            "sqlite:j.db#x",
            "sqlite::memory:",
            "sqlite:file:j.db",
            "mysql://x",
            "postgres:/u:pw@h/db",
            "postgres//u:pw@h/db",
            "u:pw@host/db",
            "memory:x",
        ] {
            let e = Location::parse(bad).expect_err(bad);
            assert!(matches!(e, Error::InvalidInput(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "a password is never shown: {e}");
        }
    }

    #[test]
    fn a_read_only_sqlite_url_is_its_location_and_a_flag() {
        for (url, path) in [
            ("sqlite://a/j.db?mode=ro", "a/j.db"),
            ("sqlite:j.db?mode=ro", "j.db"),
        ] {
            assert_eq!(
                Location::parse_mode(url).unwrap(),
                (Location::Sqlite(path.into()), true),
                "{url}"
            );
            assert!(
                Location::parse(url).is_err(),
                "parse alone never drops the mode: {url}"
            );
        }
        assert_eq!(
            Location::parse_mode("plain.db").unwrap(),
            (Location::Sqlite("plain.db".into()), false)
        );
        for bad in [
            "sqlite://j.db?mode=rw",
            "sqlite://j.db?mode=ro&cache=shared",
            "sqlite://?mode=ro",
            "plain.db?mode=ro",
            "postgres://u:pw@h/db?mode=ro",
        ] {
            match Location::parse_mode(bad) {
                Ok((Location::Sqlite(_), true)) => panic!("{bad} taken as read-only"),
                Ok((Location::Postgres(_), ro)) => assert!(!ro, "{bad}"),
                Ok(_) | Err(_) => {}
            }
        }
    }

    #[test]
    fn a_postgres_location_hides_its_url_in_debug() {
        let l = Location::parse("postgres://u:pw@h/db").unwrap();
        assert_eq!(format!("{l:?}"), "Postgres(<url not shown>)");
    }
}
