//! The PostgreSQL server of the tests.
//!
//! Postgres-backed tests read the server's URL from
//! [`DATABASE_URL_VAR`]; `cargo xtask test` (and `cargo xtask ci`) starts a
//! throwaway cluster and sets it. Plain `cargo test` without it skips those
//! tests and says so in one line per test binary, never silently and never
//! by aborting. In CI (the `CI` variable set) a missing server fails the
//! tests instead: CI never passes by skipping them.
//!
//! ```
//! // In a test binary, under `#[tokio::test]`:
//! async fn something_on_postgres() {
//!     let Some(url) = outbox_testkit::pg::test_database_url() else { return };
//!     // Connect to `url` only after this line, and give drop guards (schemas
//!     // to drop) the URL itself: a guard whose Drop panics while a failed
//!     // test unwinds aborts the whole test binary.
//!     # let _ = url;
//! }
//! ```

mod cluster;

use std::io::Write;
use std::sync::Once;

use cluster::Cluster;

/// The variable naming the tests' PostgreSQL server.
pub const DATABASE_URL_VAR: &str = "OUTBOX_TEST_DATABASE_URL";

/// The tests' PostgreSQL server, or `None` when [`DATABASE_URL_VAR`] is
/// unset (or empty): the caller returns at once, having run nothing.
///
/// The first `None` of a process writes one line to stderr saying which
/// tests are skipped, why, and how to run them. It goes to the process's
/// stderr, past the test harness's output capture, so a passing `cargo test`
/// shows it too.
///
/// # Panics
///
/// When the variable is missing and `CI` is set (whatever its value), and
/// when the variable is not Unicode: either is a broken setup, not a reason
/// to skip.
pub fn test_database_url() -> Option<String> {
    match std::env::var(DATABASE_URL_VAR) {
        Ok(url) if !url.is_empty() => return Some(url),
        Err(std::env::VarError::NotUnicode(v)) => panic!("{DATABASE_URL_VAR} is not Unicode: {v:?}"),
        Ok(_) | Err(std::env::VarError::NotPresent) => {}
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{DATABASE_URL_VAR} is not set and CI is: in CI the Postgres tests must run, never be skipped. \
             `cargo xtask ci` starts a throwaway server and sets {DATABASE_URL_VAR}; run the tests through it"
        );
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        // Not `eprintln!`: the test harness captures that for passing tests.
        let _ = writeln!(std::io::stderr().lock(), "{}", skip_line(&test_binary()));
    });
    None
}

/// The line printed when the Postgres tests of `binary` are skipped.
fn skip_line(binary: &str) -> String {
    format!(
        "note: skipping the Postgres tests of {binary}: {DATABASE_URL_VAR} is not set. Run them with \
         `cargo xtask test` (it starts a throwaway server), or set {DATABASE_URL_VAR} to a server's URL \
         (`cargo xtask pg-shell` starts one and prints it)"
    )
}

/// The test binary, as "`outbox-runtime` test binary `postgres`" (the
/// package from the variable cargo and nextest set when they run tests, the
/// binary's name without cargo's hash suffix).
fn test_binary() -> String {
    let name = binary_name();
    match std::env::var("CARGO_PKG_NAME") {
        Ok(pkg) if !pkg.is_empty() => format!("`{pkg}` test binary `{name}`"),
        _ => format!("test binary `{name}`"),
    }
}

/// `postgres` for `.../deps/postgres-0123456789abcdef`.
fn binary_name() -> String {
    let exe = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&exe)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.rsplit_once('-') {
        Some((base, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            base.to_owned()
        }
        _ => name,
    }
}

/// A PostgreSQL cluster of one test's own, which the test can stop and
/// start (database restarts, outages), made as `cargo xtask ci` makes its
/// throwaway cluster (the same code, `pg/cluster.rs`): `initdb` into a
/// temporary directory, a Unix socket in that directory and no TCP (so no
/// port is taken), run as the system user `outbox-pg` when the tests run as
/// root. Dropping it stops it (`-m immediate`) and deletes the directory.
pub struct OwnCluster {
    cluster: Cluster,
}

/// The settings of a test's own server: no fsync (it never has to survive
/// a power loss), and few connections (one test uses it).
const OWN_SETTINGS: &str = "-c fsync=off -c max_connections=100";

impl OwnCluster {
    /// Starts a fresh cluster, or `None` (with one line on stderr) when the
    /// PostgreSQL binaries (`initdb`, `pg_ctl`) are missing.
    ///
    /// # Panics
    ///
    /// When the binaries are missing and `CI` is set (CI never passes by
    /// skipping), and when the cluster cannot be created or started.
    pub fn start(tag: &str) -> Option<OwnCluster> {
        let Some(bin) = cluster::find_bin() else {
            if std::env::var_os("CI").is_some() {
                panic!(
                    "the PostgreSQL binaries (initdb, pg_ctl) are missing and CI is set: this test starts a \
                     cluster of its own (apt-get install postgresql)"
                );
            }
            let _ = writeln!(
                std::io::stderr().lock(),
                "note: skipping {tag} of {}: it starts a Postgres cluster of its own and the PostgreSQL \
                 binaries (initdb, pg_ctl) are missing (apt-get install postgresql)",
                test_binary()
            );
            return None;
        };
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The socket directory goes into a URL and a server option: plain characters only.
        let safe: String = tag
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = std::env::temp_dir().join(format!("outbox-own-pg-{safe}-{}-{n}", std::process::id()));
        let cluster = Cluster::create(dir, bin, OWN_SETTINGS).unwrap_or_else(|e| panic!("{e}"));
        let own = OwnCluster { cluster };
        own.start_again();
        Some(own)
    }

    /// The connection URL (over the Unix socket in the cluster's directory).
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// Stops the server the way a crash or a kill does: `pg_ctl stop -m
    /// immediate` (every backend is killed; crash recovery at the next start).
    pub fn stop_immediate(&self) {
        self.cluster.stop_immediate().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub fn start_again(&self) {
        self.cluster.start().unwrap_or_else(|e| panic!("{e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_line_names_the_binary_the_variable_and_both_ways_to_run() {
        let line = skip_line("test binary `conformance`");
        assert!(line.contains("test binary `conformance`"), "{line}");
        assert!(line.contains(DATABASE_URL_VAR), "{line}");
        assert!(line.contains("cargo xtask test"), "{line}");
        assert!(line.contains("cargo xtask pg-shell"), "{line}");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}
