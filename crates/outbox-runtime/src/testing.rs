//! What an application's tests need (feature `testing`): an outbox on the
//! memory adapter with a manual clock and retries that fall due at once,
//! draining with a readable failure, digests and dead letters, and one test
//! run on every backend.
//!
//! ```
//! use outbox_core::{EventTypeRegistry, ExpectedVersion, StreamId};
//! use outbox_runtime::testing;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> outbox_core::Result<()> {
//! let mut types = EventTypeRegistry::new();
//! types.apply("deposited")?;
//! let clock = testing::clock();
//! let outbox = testing::memory(&clock).event_types(types).build().await?;
//! let account = StreamId::new("account-7")?;
//! outbox
//!     .append(&account, ExpectedVersion::Any, vec![outbox.event("deposited", b"100")?])
//!     .await?;
//! let report = testing::drain(&outbox).await?; // every row applied, or an error naming what was not
//! assert_eq!(report.completed, 1);
//! assert!(testing::dead_letters(&outbox).await?.is_empty());
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Error, ManualClock, OutboxRow, OutboxStatus, Result, RetryPolicy, Timestamp};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};

use crate::open::{OpenOptions, WithStores, open_stores};
use crate::{Config, JournalBackend, Outbox, OutboxBuilder, ProjectionBackend, TickReport};

/// The retry delay of [`memory`]'s policy: advance the clock by this much
/// and every failed row is due again.
pub const RETRY: Duration = Duration::from_millis(1);

/// Attempts before a row is dead-lettered under [`memory`]'s policy.
pub const DEAD_LETTER_AFTER: u32 = 3;

/// A manual clock at a fixed start (2026-01-01), for [`memory`].
pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(Timestamp::from_millis(1_767_225_600_000)))
}

/// The retry policy of [`memory`]: [`RETRY`] between attempts, dead after
/// [`DEAD_LETTER_AFTER`].
pub fn fast_retry() -> RetryPolicy {
    RetryPolicy::new(RETRY, RETRY, DEAD_LETTER_AFTER).expect("a valid policy")
}

/// A builder on fresh memory stores whose leases and due times follow
/// `clock`: appends enqueue rows and nothing applies them until the test
/// calls [`drain`] (or `tick`), retries fall due once the clock is advanced
/// by [`RETRY`], and the third failure dead-letters. Register the
/// application's event types and projections on it, then `build`.
pub fn memory(clock: &Arc<ManualClock>) -> OutboxBuilder<MemoryJournal, MemoryProjectionStore> {
    let mut config = Config::producer_only();
    config.retry = fast_retry();
    Outbox::builder(
        MemoryJournal::with_clock(clock.clone()),
        MemoryProjectionStore::with_clock(clock.clone()),
    )
    .config(config)
}

/// Worker passes until one changes nothing ([`Outbox::drain`]); an error
/// when any row is then left failed, dead or otherwise undone, or any
/// projection is left failing on a stream (ADR 0032), naming the first few
/// with their errors, so a test fails with the projection's message rather
/// than a count.
pub async fn drain<J: JournalBackend, P: ProjectionBackend>(outbox: &Outbox<J, P>) -> Result<TickReport> {
    let report = outbox.drain().await?;
    let left = outbox.journal().summary().await?;
    let failing = outbox.projection_states(None, 5).await?;
    if left.total() == 0 && failing.is_empty() {
        return Ok(report);
    }
    let rows = outbox.journal().list(None, 5).await?;
    let mut shown: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}/{} {} after {} attempt(s): {}",
                r.stream,
                r.seq,
                r.status,
                r.attempt_count,
                r.last_error.as_deref().unwrap_or("(no error)")
            )
        })
        .collect();
    shown.extend(failing.iter().map(|s| {
        format!(
            "{} on {}/{} {} after {} attempt(s): {}",
            s.sink,
            s.stream,
            s.seq + 1,
            s.status,
            s.attempt_count,
            s.last_error.as_deref().unwrap_or("(behind; not failed yet)")
        )
    }));
    Err(Error::InvalidState(format!(
        "the outbox was not drained: {} row(s) left ({} failed, {} dead), {} projection exception(s); first: {}",
        left.total(),
        left.failed,
        left.dead,
        failing.len(),
        shown.join("; ")
    )))
}

/// One dead letter: a projection's on one stream (ADR 0032), or a row's,
/// which holds its stream back for every projection (an event whose
/// attempts ended the process, or that the journal could not serve).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The projection it is dead for; `None` for a dead row (every projection).
    pub projection: Option<String>,
    /// The stream.
    pub stream: outbox_core::StreamId,
    /// The event that failed.
    pub seq: u64,
    /// The attempts it had.
    pub attempt_count: u32,
    /// The last failure's message.
    pub last_error: Option<String>,
}

/// The dead letters: dead rows (oldest first), then each projection's dead
/// streams (at most 10,000 of each).
pub async fn dead_letters<J: JournalBackend, P: ProjectionBackend>(
    outbox: &Outbox<J, P>,
) -> Result<Vec<DeadLetter>> {
    let rows: Vec<OutboxRow> = outbox
        .journal()
        .list(Some(OutboxStatus::Dead), outbox_core::MAX_PAGE)
        .await?;
    let mut out: Vec<DeadLetter> = rows
        .into_iter()
        .map(|r| DeadLetter {
            projection: None,
            stream: r.stream,
            seq: r.seq.get(),
            attempt_count: r.attempt_count,
            last_error: r.last_error,
        })
        .collect();
    for s in outbox
        .projection_states(Some(outbox_core::SinkStatus::Dead), outbox_core::MAX_PAGE)
        .await?
    {
        out.push(DeadLetter {
            projection: outbox_core::consumer_projection(&s.sink).map(str::to_owned),
            stream: s.stream,
            seq: s.seq + 1,
            attempt_count: s.attempt_count,
            last_error: s.last_error,
        });
    }
    Ok(out)
}

/// Each registered projection's digest (its rows and checkpoints, as
/// `outbox report` prints it), by name: equal on every backend for the
/// same events. See the runbook's "Which digest to compare".
pub async fn digests<J: JournalBackend, P: ProjectionBackend>(
    outbox: &Outbox<J, P>,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in outbox.projections() {
        let d = outbox.store().digest(p.as_ref()).await?;
        out.insert(p.name().to_string(), d.to_string());
    }
    Ok(out)
}

/// A backend [`on_every_backend`] ran a test on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// `memory:`.
    Memory,
    /// SQLite files in a fresh temporary directory.
    Sqlite,
    /// A fresh schema of the server at `OUTBOX_TEST_DATABASE_URL`, dropped
    /// afterwards.
    Postgres,
}

/// Runs the test `make()` builds on fresh stores of every backend this
/// build has (features `sqlite`, `postgres`): memory, SQLite files in a
/// temporary directory, and Postgres in a schema of its own when
/// `OUTBOX_TEST_DATABASE_URL` names a server. Returns each backend with
/// what the test returned, so the test can compare them (digests, views).
///
/// Without that variable, in a build with the `postgres` feature, Postgres
/// is skipped and this says so on stderr (one line per process, naming the
/// variable); with `CI` set it is an error instead, so a CI run cannot
/// pass by skipping. The returned backends say which ran.
pub async fn on_every_backend<W, F>(mut make: F) -> Result<Vec<(Backend, W::Output)>>
where
    W: WithStores,
    F: FnMut() -> W,
{
    let mut out = Vec::new();
    let created = OpenOptions::default().with_create(true);
    out.push((
        Backend::Memory,
        open_stores("memory:", "memory:", &created, make()).await?,
    ));
    if cfg!(feature = "sqlite") {
        let dir = std::env::temp_dir().join(format!("outbox-testing-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::storage(format_args!("creating {}", dir.display()), e))?;
        let j = format!("sqlite://{}", dir.join("journal.db").display());
        let p = format!("sqlite://{}", dir.join("projections.db").display());
        let result = open_stores(&j, &p, &created, make()).await;
        let _ = std::fs::remove_dir_all(&dir);
        out.push((Backend::Sqlite, result?));
    }
    if cfg!(feature = "postgres") {
        match std::env::var(TEST_DATABASE_URL).ok().filter(|u| !u.is_empty()) {
            Some(url) => {
                let schema = format!("outbox_testing_{}_{}", std::process::id(), unique());
                let result = open_stores(&url, &url, &created.clone().with_schema(&schema), make()).await;
                drop_schema(&url, &schema).await;
                out.push((Backend::Postgres, result?));
            }
            None => postgres_skipped(std::env::var_os("CI").is_some())?,
        }
    }
    Ok(out)
}

/// The variable naming the Postgres server of [`on_every_backend`].
const TEST_DATABASE_URL: &str = "OUTBOX_TEST_DATABASE_URL";

/// What [`on_every_backend`] does without a Postgres server: in CI
/// (`ci`), an error; otherwise one line on stderr, the first time.
fn postgres_skipped(ci: bool) -> Result<()> {
    if ci {
        return Err(Error::invalid(format!(
            "{TEST_DATABASE_URL} is not set and CI is: a test on every backend must run on Postgres in CI"
        )));
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        // Not `eprintln!`: the test harness captures that for passing tests.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr().lock(),
            "outbox testing: Postgres skipped by on_every_backend: set {TEST_DATABASE_URL} to a server's URL to run it there too"
        );
    });
    Ok(())
}

/// A number no other call in this process got.
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(feature = "postgres")]
async fn drop_schema(url: &str, schema: &str) {
    use outbox_postgres::sqlx::{self, Connection as _};
    let Ok(mut c) = sqlx::PgConnection::connect(url).await else {
        return;
    };
    // A name this module made (letters, digits, underscores).
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&mut c)
    .await;
    let _ = c.close().await;
}

#[cfg(not(feature = "postgres"))]
async fn drop_schema(_: &str, _: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_postgres_is_an_error_in_ci_naming_the_variable() {
        let e = postgres_skipped(true).unwrap_err().to_string();
        assert!(e.contains(TEST_DATABASE_URL) && e.contains("CI"), "{e}");
    }

    #[test]
    fn a_skipped_postgres_outside_ci_goes_on() {
        postgres_skipped(false).unwrap();
        postgres_skipped(false).unwrap();
    }
}
