//! Consumers the database knows (ADR 0032): two application binaries on one
//! journal, one without projection `x`. The one without it runs `work`:
//! `x`'s progress is untouched (its checkpoints stay where they were, and
//! it is left a consumer state on each stream whose rows were completed),
//! `report` shows `x` registered with no live worker, and the binary with
//! `x` then catches it up, exactly once and in order.
// SQLite stores and the SQLite `App` registration: the default feature.
#![cfg(feature = "sqlite")]

use clap::Parser as _;
use outbox_cli::{App, Cli, execute};
use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, OutboxInspector, ProjectionName,
    ProjectionStore, SinkStatus, SinkStore, projection_consumer,
};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use outbox_testkit::{Expected, OracleProjection, add, check_history, oracle_registry, read_state, sid};
use std::collections::BTreeMap;

struct Site {
    _tmp: tempfile::TempDir,
    journal: String,
    projections: String,
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

async fn append(site: &Site, stream: &str, values: std::ops::RangeInclusive<i64>) {
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    let req = AppendRequest::new(sid(stream), ExpectedVersion::Any, values.map(add).collect());
    j.append(&[req], AppendOptions::enqueue()).await.unwrap();
    j.close().await;
}

async fn checkpoints(site: &Site, projection: &str) -> (u64, u64) {
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    let name = ProjectionName::new(projection).unwrap();
    let out = (
        store.checkpoint(&name, &sid("s")).await.unwrap(),
        store.checkpoint(&name, &sid("t")).await.unwrap(),
    );
    store.close().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_without_a_projection_leaves_it_its_work_and_the_binary_with_it_catches_up() {
    let full = App::new("full")
        .version("2.0.0")
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"))
        .view(OracleProjection::new("x"));
    let lean = App::new("lean")
        .version("1.9.0")
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"));
    let tmp = tempfile::tempdir().unwrap();
    let site = Site {
        journal: tmp.path().join("j.db").display().to_string(),
        projections: tmp.path().join("p.db").display().to_string(),
        _tmp: tmp,
    };
    run(&full, &site, &["migrate"]).await.unwrap();
    append(&site, "s", 1..=3).await;
    run(&full, &site, &["work", "--once"]).await.unwrap();
    assert_eq!(checkpoints(&site, "x").await, (3, 0));

    append(&site, "s", 4..=6).await;
    append(&site, "t", 1..=2).await;
    run(&lean, &site, &["work", "--once"]).await.unwrap();
    assert_eq!(
        checkpoints(&site, "oracle").await,
        (6, 2),
        "the lean binary applied its own"
    );
    assert_eq!(checkpoints(&site, "x").await, (3, 0), "x's progress is untouched");
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(j.summary().await.unwrap().total(), 0, "the rows are completed");
    let key = projection_consumer(&ProjectionName::new("x").unwrap()).unwrap();
    let held = j.sink_states(&key, &[sid("s"), sid("t")]).await.unwrap();
    assert!(
        held.iter().all(|h| h.status == SinkStatus::Failed),
        "x is left a state on each stream: {held:?}"
    );
    let statuses = outbox_runtime::consumers::consumer_statuses(&j).await.unwrap();
    j.close().await;
    let x = statuses
        .iter()
        .find(|c| c.projection.as_deref() == Some("x"))
        .expect("x is registered");
    assert!(!x.live, "no live worker runs x: {x:?}");
    assert_eq!(x.info.version, "2.0.0", "registered by the full binary");
    let oracle = statuses
        .iter()
        .find(|c| c.projection.as_deref() == Some("oracle"))
        .unwrap();
    assert_eq!(oracle.info.version, "1.9.0", "last registered by the lean binary");

    run(&full, &site, &["work", "--once"]).await.unwrap();
    assert_eq!(
        checkpoints(&site, "x").await,
        (6, 2),
        "caught up by the binary with x"
    );
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    let want = BTreeMap::from([
        ("s".to_owned(), Expected { through: 6, sum: 21 }),
        ("t".to_owned(), Expected { through: 2, sum: 3 }),
    ]);
    for p in ["oracle", "x"] {
        let state = read_state(&store, p).await.unwrap();
        check_history(&state, &want, &BTreeMap::new()).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    store.close().await;
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    let left = j.sink_states(&key, &[sid("s"), sid("t")]).await.unwrap();
    assert!(
        left.iter().all(|h| h.status == SinkStatus::Ok),
        "x is back on the shared path: {left:?}"
    );
    j.close().await;
    // Retiring x removes it and its states.
    run(&full, &site, &["consumers", "retire", "--consumer", "x", "--yes"])
        .await
        .unwrap();
    let j = SqliteJournal::open(&site.journal, SqliteOptions::default())
        .await
        .unwrap();
    let statuses = outbox_runtime::consumers::consumer_statuses(&j).await.unwrap();
    assert!(
        statuses.iter().all(|c| c.projection.as_deref() != Some("x")),
        "{statuses:?}"
    );
    j.close().await;
}

/// A projection whose policy is `skip` passes over the event it fails on,
/// with a record; `outbox skipped reapply` applies it once after the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_event_is_recorded_and_reapplied_once_from_the_command_line() {
    let picky = OracleProjection::new("x");
    let faults = picky.faults();
    let app = App::new("app")
        .event_types(oracle_registry())
        .view(OracleProjection::new("oracle"))
        .view(picky)
        .on_error("x", outbox_core::OnError::Skip);
    let tmp = tempfile::tempdir().unwrap();
    let site = Site {
        journal: tmp.path().join("j.db").display().to_string(),
        projections: tmp.path().join("p.db").display().to_string(),
        _tmp: tmp,
    };
    run(&app, &site, &["migrate"]).await.unwrap();
    faults.fail(&sid("s"), 2, u32::MAX);
    append(&site, "s", 1..=4).await;
    // The shared path skips it; the exception path then catches x up.
    for _ in 0..3 {
        run(&app, &site, &["work", "--once"]).await.unwrap();
    }
    assert_eq!(
        checkpoints(&site, "x").await,
        (4, 0),
        "x went on past the skipped event"
    );
    assert_eq!(checkpoints(&site, "oracle").await, (4, 0));
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    let listed = outbox_core::SkippedEvents::skipped(&store, None, 10)
        .await
        .unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|s| (s.projection.as_str(), s.stream.as_str(), s.seq.get()))
            .collect::<Vec<_>>(),
        [("x", "s", 2)]
    );
    assert_eq!(
        read_state(&store, "x").await.unwrap().streams["s"].seqs,
        [1, 3, 4]
    );
    store.close().await;
    run(&app, &site, &["skipped"]).await.unwrap();
    let args = [
        "skipped",
        "reapply",
        "--projection",
        "x",
        "--stream",
        "s",
        "--seq",
        "2",
    ];
    let failing = run(&app, &site, &args).await.unwrap_err().to_string();
    assert!(failing.contains("x"), "the applier's error: {failing}");
    faults.clear();
    run(&app, &site, &args).await.unwrap();
    let again = run(&app, &site, &args).await.unwrap_err().to_string();
    assert!(again.contains("no skipped event"), "{again}");
    let store = SqliteProjectionStore::open(&site.projections, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        read_state(&store, "x").await.unwrap().streams["s"].seqs,
        [1, 3, 4, 2]
    );
    assert!(
        outbox_core::SkippedEvents::skipped(&store, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    store.close().await;
}
