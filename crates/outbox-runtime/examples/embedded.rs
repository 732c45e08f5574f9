//! Embedding the runtime in an application, on the embedded SQLite default.
//!
//! ```sh
//! cargo run -p outbox-runtime --example embedded
//! ```
//!
//! An application registers its event types and projections, appends events
//! on its request path, and runs the apply worker in the background; the
//! projection table it queries is updated exactly once per event.

use std::time::Duration;

use outbox_core::{
    BoxError, Event, EventTypeRegistry, ExpectedVersion, OutboxInspector, ProjectionName, StreamId,
    ViewProjection, ViewTx, async_trait,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};

/// A projection: the balance of each account, in cents. Written once, it
/// runs unchanged on the memory, SQLite and Postgres adapters.
struct Balances(ProjectionName);

#[async_trait]
impl ViewProjection for Balances {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event) -> Result<(), BoxError> {
        let cents: i64 = std::str::from_utf8(&e.payload)?.parse()?;
        let delta = if e.event_type.as_str() == "withdrawn" {
            -cents
        } else {
            cents
        };
        view.update("balances", e.stream.as_str(), |balance: &mut i64| {
            *balance += delta
        })
        .await?;
        Ok(())
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let journal = SqliteJournal::open(dir.path().join("journal.db"), SqliteOptions::default()).await?;
    let store =
        SqliteProjectionStore::open(dir.path().join("projections.db"), SqliteOptions::default()).await?;

    let mut types = EventTypeRegistry::new();
    types
        .apply("deposited")?
        .apply("withdrawn")?
        .audit_only("statement_viewed")?;

    // Config::from_env() reads the OUTBOX_* variables; here: outbox on, apply worker on.
    let outbox = Outbox::builder(journal, store)
        .config(Config::apply_worker().with_poll_interval(Duration::from_millis(500)))
        .event_types(types)
        .view(Balances(ProjectionName::new("balances")?))
        .build()
        .await?;
    let running = outbox.start().await?;
    println!("mode {}; worker {}", outbox.mode(), outbox.worker_id());

    // The request path: append with an expected version; the worker wakes at once.
    let alice = StreamId::new("account-alice")?;
    outbox
        .append(
            &alice,
            ExpectedVersion::NoStream,
            vec![
                outbox.event("deposited", "1000")?,
                outbox.event("statement_viewed", "")?,
            ],
        )
        .await?;
    outbox
        .append(
            &alice,
            ExpectedVersion::Exact(2),
            vec![outbox.event("withdrawn", "250")?],
        )
        .await?;
    // A stale expected version is a typed conflict, not a hole in the stream.
    let stale = outbox
        .append(
            &alice,
            ExpectedVersion::Exact(1),
            vec![outbox.event("withdrawn", "1")?],
        )
        .await;
    println!("stale append: {}", stale.unwrap_err());

    // Wait for the worker until nothing is pending or being applied. These
    // projections do not fail; where one might, a failed head keeps its
    // stream's rows pending until its retry, so give such a wait a
    // deadline (tests call `outbox.drain()` instead of starting a worker).
    loop {
        let s = outbox.journal().summary().await?;
        if s.pending + s.processing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;

    let cents: i64 = outbox
        .views("balances")?
        .get("balances", alice.as_str())
        .await?
        .unwrap_or_default();
    println!(
        "alice: {cents} cents (applied {}, audit-only {})",
        outbox.metrics().applied,
        outbox.metrics().audit_only
    );
    assert_eq!(cents, 750);
    Ok(())
}
