//! What every Postgres workload starts from: a fresh schema, an outbox on
//! it and the number of streams. A leaf of `pg`, used by its workloads.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
use outbox_runtime::{Config, Outbox};

use crate::fixture::{self, Seen};

/// The outbox of the Postgres workloads.
pub(super) type PgRt = Outbox<PgJournal, PgProjectionStore>;

/// Streams of every shape.
pub(super) const STREAMS: u64 = 100;

/// A fresh schema name for this process.
pub(crate) fn schema(kind: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench_{kind}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A runtime on `schema` with the bench projection; with the journal's
/// LISTEN/NOTIFY wake source when `woken`.
pub(crate) async fn open(
    url: &str,
    schema: &str,
    config: Config,
    seen: Arc<Seen>,
    woken: bool,
) -> Result<PgRt> {
    let journal = PgJournal::connect(url, PgOptions::default().with_schema(schema))
        .await
        .context("connecting the journal")?;
    let store = PgProjectionStore::sharing(&journal).await?;
    let wake = woken.then(|| journal.wake_source());
    let mut builder = fixture::builder(journal, store, seen)?;
    if let Some(w) = wake {
        builder = builder.wake_source(w);
    }
    builder.config(config).build().await.map_err(Into::into)
}
