//! An application's hand-written projection (`Projection<SqliteTx>`, the
//! escape hatch) registered on its `App`: the commands apply it and report
//! it, and a binary whose hand-written projection is for another backend
//! refuses to apply events rather than complete them without it.
// SQLite stores and the SQLite `App` registration: the default feature.
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use clap::Parser as _;
use outbox_cli::{App, Cli, execute};
use outbox_core::{
    AppendOptions, AppendRequest, BoxError, DigestBuilder, Event, EventJournal, ExpectedVersion,
    OutboxInspector, Projection, ProjectionName, ProjectionStore, async_trait,
};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, SqliteTx};
use outbox_testkit::{OracleProjection, add, oracle_registry, sid};

struct Site {
    _tmp: tempfile::TempDir,
    journal: String,
    projections: String,
}

/// Migrated databases with `events` events on stream `s`, enqueued.
async fn site(app: &App, events: i64) -> Site {
    let tmp = tempfile::tempdir().unwrap();
    let site = Site {
        journal: tmp.path().join("j.db").display().to_string(),
        projections: tmp.path().join("p.db").display().to_string(),
        _tmp: tmp,
    };
    run(app, &site, &["migrate"]).await.unwrap();
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    let req = AppendRequest::new(sid("s"), ExpectedVersion::Any, (1..=events).map(add).collect());
    j.append(&[req], AppendOptions::enqueue()).await.unwrap();
    j.close().await;
    site
}

async fn run(app: &App, site: &Site, args: &[&str]) -> anyhow::Result<()> {
    let mut argv = vec![
        "app",
        "--journal",
        &site.journal,
        "--projection-db",
        &site.projections,
    ];
    argv.extend_from_slice(args);
    execute(app, Cli::try_parse_from(argv).unwrap()).await
}

fn oracle() -> Arc<dyn Projection<SqliteTx>> {
    Arc::new(HandWritten(OracleProjection::new("oracle").shared()))
}

/// The oracle as a hand-written projection: every call forwarded, but not
/// `documents_only` (what a `Projection` written by hand says; the runtime
/// refuses a wrapped view registered as a hand-written projection).
struct HandWritten<Tx>(Arc<dyn Projection<Tx>>);

#[async_trait]
impl<Tx: Send + 'static> Projection<Tx> for HandWritten<Tx> {
    fn name(&self) -> &ProjectionName {
        self.0.name()
    }
    async fn setup(&self, tx: &mut Tx) -> Result<(), BoxError> {
        self.0.setup(tx).await
    }
    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError> {
        self.0.apply(tx, event).await
    }
    async fn reset(&self, tx: &mut Tx) -> Result<(), BoxError> {
        self.0.reset(tx).await
    }
    async fn digest(&self, tx: &mut Tx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        self.0.digest(tx, out).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_projection_is_applied_by_work_and_listed_by_report() {
    let app = App::new("app")
        .event_types(oracle_registry())
        .sqlite_projection(oracle());
    let site = site(&app, 3).await;
    run(&app, &site, &["work", "--once"]).await.unwrap();
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    let name = ProjectionName::new("oracle").unwrap();
    assert_eq!(store.checkpoint(&name, &sid("s")).await.unwrap(), 3, "applied");
    store.close().await;
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        j.summary().await.unwrap().total(),
        0,
        "completed after it applied"
    );
    j.close().await;
    // The commands know it by name: a rebuild of it runs, `report` reads it.
    run(&app, &site, &["rebuild", "--projection", "oracle"])
        .await
        .unwrap();
    run(&app, &site, &["report", "--json"]).await.unwrap();
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(store.checkpoint(&name, &sid("s")).await.unwrap(), 3, "rebuilt");
    store.close().await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_projection_for_another_backend_stops_the_worker_before_it_completes_anything() {
    let pg: Arc<dyn Projection<outbox_postgres::PgTx>> =
        Arc::new(HandWritten(OracleProjection::new("sql_totals").shared()));
    let app = App::new("app")
        .event_types(oracle_registry())
        .view(OracleProjection::new("view"))
        .postgres_projection(pg);
    let site = site(&app, 2).await;
    let e = run(&app, &site, &["work", "--once"])
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("sql_totals") && e.contains("another backend"), "{e}");
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(j.summary().await.unwrap().pending, 2, "nothing completed");
    j.close().await;
}
