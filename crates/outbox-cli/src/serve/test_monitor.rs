//! The monitor the serve tests run: over fresh SQLite files.

use std::sync::Arc;

use outbox_core::Projection;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, SqliteTx};

use super::Monitor;
use super::door::Door;
use crate::backend::{Access, open_sqlite};

/// A monitor behind `door` over fresh SQLite files in `dir`, showing
/// `projections`, its figures over at most `lag_streams` streams, counting
/// rows exactly up to `exact_rows`.
pub(super) async fn monitor(
    door: Arc<Door>,
    dir: &std::path::Path,
    projections: Vec<Arc<dyn Projection<SqliteTx>>>,
    lag_streams: usize,
    exact_rows: u64,
) -> Arc<Monitor<SqliteJournal, SqliteProjectionStore>> {
    let (journal, store) = open_sqlite(
        dir.join("journal.db"),
        dir.join("projections.db"),
        Access::Create,
        outbox_core::PartitionOptions::default(),
    )
    .await
    .unwrap();
    Arc::new(Monitor {
        app: "test".into(),
        journal,
        store,
        projections,
        door,
        limit: 50,
        lag_streams,
        lag_threshold_ms: 60_000,
        figures: Arc::default(),
        figures_interval: std::time::Duration::from_secs(5),
        exact_rows,
        snapshot_of: None,
    })
}
