//! Embedding the runtime in an application, on the embedded SQLite default.
//!
//! ```sh
//! cargo run -p outbox-runtime --example embedded
//! ```
//!
//! An application registers its event types and projections, appends events
//! on its request path, and runs the apply worker in the background; the
//! projection table it queries is updated exactly once per event.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, ExpectedVersion, OutboxStore, Projection,
    ProjectionName, StreamId, async_trait,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::sqlx::{self, SqliteConnection};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, digest_table};

/// A projection: the balance of each account.
struct Balances(ProjectionName);

#[async_trait]
impl Projection<SqliteConnection> for Balances {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn setup(&self, tx: &mut SqliteConnection) -> Result<(), BoxError> {
        sqlx::query("CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, cents INTEGER NOT NULL)")
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn apply(&self, tx: &mut SqliteConnection, e: &Event) -> Result<(), BoxError> {
        let cents: i64 = std::str::from_utf8(&e.payload)?.parse()?;
        let delta = if e.event_type.as_str() == "withdrawn" {
            -cents
        } else {
            cents
        };
        sqlx::query(
            "INSERT INTO balances (account, cents) VALUES (?1, ?2) \
             ON CONFLICT (account) DO UPDATE SET cents = cents + excluded.cents",
        )
        .bind(e.stream.as_str())
        .bind(delta)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn reset(&self, tx: &mut SqliteConnection) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM balances").execute(&mut *tx).await?;
        Ok(())
    }

    async fn digest(&self, tx: &mut SqliteConnection, out: &mut DigestBuilder) -> Result<(), BoxError> {
        digest_table(tx, "balances", out).await?;
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
        .projection(Arc::new(Balances(ProjectionName::new("balances")?)))
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

    while outbox.journal().summary().await?.total() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.shutdown().await;

    let mut conn = outbox.store().read().await?;
    let cents: i64 = sqlx::query_scalar("SELECT cents FROM balances WHERE account = ?1")
        .bind(alice.as_str())
        .fetch_one(&mut *conn)
        .await?;
    println!(
        "alice: {cents} cents (applied {}, audit-only {})",
        outbox.metrics().applied,
        outbox.metrics().audit_only
    );
    assert_eq!(cents, 750);
    Ok(())
}
