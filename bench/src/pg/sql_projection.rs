//! The hand-written SQL projection (`Projection<PgTx>`) that the Postgres
//! drain also runs, beside the view projection: the same row per stream
//! (its last event's seq and size), written per run as one upsert of the
//! run's last event (`Projection::apply_run`), which is the state the
//! per-event `apply` leaves.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use outbox_core::{BoxError, DigestBuilder, Event, FailedEvent, Projection, ProjectionName, async_trait};
use outbox_postgres::sqlx::{self, PgConnection};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore, PgTx, digest_table};
use outbox_runtime::Config;

use super::setup::PgRt;
use crate::fixture::{Seen, check_rows};

const NAME: &str = "bench_sql";

struct PgRows {
    name: ProjectionName,
    seen: Arc<Seen>,
}

/// The stream's row set to `e`'s seq and size.
async fn upsert(conn: &mut PgConnection, e: &Event) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO bench_sql_rows (stream, seq, bytes) VALUES ($1, $2, $3) \
         ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, bytes = excluded.bytes",
    )
    .bind(e.stream.as_str())
    .bind(e.seq.as_i64())
    .bind(e.payload.len() as i64)
    .execute(conn)
    .await
    .map(drop)
}

#[async_trait]
impl Projection<PgTx> for PgRows {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn setup(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS bench_sql_rows (stream text PRIMARY KEY, seq bigint NOT NULL, bytes bigint NOT NULL)",
        )
        .execute(tx.conn())
        .await?;
        Ok(())
    }

    async fn apply(&self, tx: &mut PgTx, e: &Event) -> Result<(), BoxError> {
        upsert(tx.conn(), e).await?;
        self.seen.saw(e)
    }

    /// One statement per run: a stream's row is its last event's, so the
    /// run's last event writes what every event in turn would have. No
    /// event's data can break the statement (any failure is the store's),
    /// so there is no event to find: it is named as the run's first.
    async fn apply_run(&self, tx: &mut PgTx, events: &[&Event]) -> Result<(), FailedEvent> {
        let Some(last) = events.last() else {
            return Ok(());
        };
        upsert(tx.conn(), last).await.map_err(|e| FailedEvent::at(0, e))?;
        for (i, e) in events.iter().enumerate() {
            self.seen.saw(e).map_err(|source| FailedEvent::at(i, source))?;
        }
        Ok(())
    }

    fn applies_runs(&self) -> bool {
        true
    }

    async fn reset(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM bench_sql_rows")
            .execute(tx.conn())
            .await?;
        Ok(())
    }

    async fn digest(&self, tx: &mut PgTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(digest_table(tx.conn(), "bench_sql_rows", out).await?)
    }
}

/// The runtime on `schema` with [`PgRows`] as its only projection.
pub(super) async fn open(url: &str, schema: &str, config: Config, seen: Arc<Seen>) -> Result<PgRt> {
    let journal = PgJournal::connect(url, PgOptions::default().with_schema(schema))
        .await
        .context("connecting the journal")?;
    let store = PgProjectionStore::sharing(&journal).await?;
    let mut types = outbox_core::EventTypeRegistry::new();
    types.apply(crate::fixture::EVENT_TYPE)?;
    Ok(outbox_runtime::Outbox::builder(journal, store)
        .event_types(types)
        .projection(Arc::new(PgRows {
            name: ProjectionName::new(NAME)?,
            seen,
        }))
        .config(config)
        .build()
        .await?)
}

/// The oracle ([`check_rows`]) over the rows' seqs.
pub(super) async fn verify(rt: &PgRt, seen: &Seen, prefix: &str, versions: &[u64]) -> Result<()> {
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT stream, seq FROM bench_sql_rows")
        .fetch_all(rt.store().pool())
        .await?;
    let at: HashMap<String, u64> = rows
        .into_iter()
        .map(|(stream, seq)| (stream, u64::try_from(seq).unwrap_or(0)))
        .collect();
    check_rows(seen, prefix, versions, &at)
}
