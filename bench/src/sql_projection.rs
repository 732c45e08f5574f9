//! The hand-written SQL projection (`Projection<SqliteTx>`, the escape
//! hatch) that W2 also drains: one upsert of the stream's row per event,
//! the statement prepared once, a whole run in one closure
//! (`Projection::apply_run` through `SqliteTx::run_each`). The raw loop it
//! is compared with writes the same table shape (ADR 0038 made each
//! closure one handoff, not one per statement).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, FailedEvent, Projection, ProjectionName, async_trait,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::rusqlite::params;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, SqliteTx, digest_table};

use crate::fixture::{EVENT_TYPE, Rt, Seen, check_rows, sqlite_options};

/// The projection's name and table.
const NAME: &str = "bench_sql";
const TABLE: &str = "bench_sql_rows";

struct BenchRows {
    name: ProjectionName,
    seen: Arc<Seen>,
}

#[async_trait]
impl Projection<SqliteTx> for BenchRows {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|c| {
            c.execute_batch(
                "CREATE TABLE IF NOT EXISTS bench_sql_rows (stream TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
            )
        })
        .await?;
        Ok(())
    }

    async fn apply(&self, tx: &mut SqliteTx, e: &Event) -> Result<(), BoxError> {
        let row = row_of(e);
        tx.run(move |c| upsert(c, row)).await?;
        self.seen.saw(e)
    }

    /// The whole run in one closure: one handoff to the writer thread.
    async fn apply_run(&self, tx: &mut SqliteTx, events: &[&Event]) -> Result<(), FailedEvent> {
        tx.run_each(events.iter().map(|e| row_of(e)).collect(), upsert)
            .await?;
        for (i, e) in events.iter().enumerate() {
            self.seen.saw(e).map_err(|source| FailedEvent::at(i, source))?;
        }
        Ok(())
    }

    fn applies_runs(&self) -> bool {
        true
    }

    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|c| c.execute_batch("DELETE FROM bench_sql_rows")).await?;
        Ok(())
    }

    async fn digest(&self, tx: &mut SqliteTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(digest_table(tx, TABLE, out).await?)
    }
}

/// The row an event writes: its stream, and its seq and size as JSON.
fn row_of(e: &Event) -> (String, String) {
    (
        e.stream.as_str().to_owned(),
        format!("{{\"seq\":{},\"bytes\":{}}}", e.seq.get(), e.payload.len()),
    )
}

/// The upsert of one row, the statement prepared once per connection.
fn upsert(
    c: &outbox_sqlite::rusqlite::Connection,
    (stream, value): (String, String),
) -> outbox_sqlite::rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO bench_sql_rows (stream, value) VALUES (?1, ?2) \
         ON CONFLICT (stream) DO UPDATE SET value = excluded.value",
    )?
    .execute(params![stream, value])
    .map(drop)
}

/// The runtime over two SQLite files in `dir` with [`BenchRows`] as its
/// only projection.
pub(crate) async fn open(dir: &Path, config: Config, seen: Arc<Seen>) -> Result<Rt> {
    let journal = SqliteJournal::open(dir.join("journal.db"), sqlite_options())
        .await
        .context("opening the journal")?;
    let store = SqliteProjectionStore::open(dir.join("projections.db"), sqlite_options())
        .await
        .context("opening the projection store")?;
    let mut types = EventTypeRegistry::new();
    types.apply(EVENT_TYPE)?;
    Ok(Outbox::builder(journal, store)
        .event_types(types)
        .projection(Arc::new(BenchRows {
            name: ProjectionName::new(NAME)?,
            seen,
        }))
        .config(config)
        .build()
        .await?)
}

/// The oracle ([`check_rows`]): each row's seq is read back from its JSON.
pub(crate) async fn verify(rt: &Rt, seen: &Seen, prefix: &str, versions: &[u64]) -> Result<()> {
    let rows: Vec<(String, String)> = rt
        .store()
        .read(|c| {
            c.prepare("SELECT stream, value FROM bench_sql_rows")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .await?;
    let at: HashMap<String, u64> = rows
        .into_iter()
        .map(|(stream, value)| {
            let seq = value
                .strip_prefix("{\"seq\":")
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .with_context(|| format!("ORACLE FAILED: stream {stream}: row {value:?} has no seq"))?;
            Ok((stream, seq))
        })
        .collect::<Result<_>>()?;
    check_rows(seen, prefix, versions, &at)
}
