//! A hand-written projection that writes a whole run in one closure
//! (`Projection::apply_run` through `SqliteTx::run_each`): its rows and
//! checkpoint commit together; a statement failing on one event names that
//! event, nothing of the run commits, and the events before it apply on
//! their own.

mod common;

use std::sync::Arc;

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, BoxError, DigestBuilder, Error, Event, EventJournal, ExpectedVersion,
    FailedEvent, Projection, ProjectionName, ProjectionStore, Seq,
};
use outbox_sqlite::rusqlite::params;
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, SqliteTx, digest_table};
use outbox_testkit::{add, sid};

/// One row per event, keyed by seq; the table refuses seq `refused` (a
/// CHECK constraint), so the statement fails on that event alone.
struct Rows(ProjectionName, i64);

#[outbox_core::async_trait]
impl Projection<SqliteTx> for Rows {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        let refused = self.1;
        tx.run(move |c| {
            c.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS rows (seq INTEGER PRIMARY KEY CHECK (seq <> {refused}))"
            ))
        })
        .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut SqliteTx, e: &Event) -> Result<(), BoxError> {
        self.apply_run(tx, &[e]).await.map_err(|f| f.source)
    }
    async fn apply_run(&self, tx: &mut SqliteTx, events: &[&Event]) -> Result<(), FailedEvent> {
        let seqs = events.iter().map(|e| e.seq.as_i64()).collect();
        tx.run_each(seqs, |c, seq| {
            c.prepare_cached("INSERT INTO rows (seq) VALUES (?1)")?
                .execute(params![seq])
                .map(drop)
        })
        .await
    }
    fn applies_runs(&self) -> bool {
        true
    }
    async fn reset(&self, tx: &mut SqliteTx) -> Result<(), BoxError> {
        tx.run(|c| c.execute_batch("DELETE FROM rows")).await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut SqliteTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(digest_table(tx, "rows", out).await?)
    }
}

async fn rows(store: &SqliteProjectionStore) -> Vec<i64> {
    store
        .read(|c| {
            c.prepare("SELECT seq FROM rows ORDER BY seq")?
                .query_map([], |r| r.get(0))?
                .collect()
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_in_one_closure_commits_with_its_checkpoint_and_names_the_event_a_statement_fails_on() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("j.db"), test_options())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), test_options())
        .await
        .unwrap();
    let name = ProjectionName::new("rows").unwrap();
    let p: Arc<dyn Projection<SqliteTx>> = Arc::new(Rows(name.clone(), 5));
    store.setup(std::slice::from_ref(&p)).await.unwrap();
    let s = sid("s");
    journal
        .append(
            &[AppendRequest::new(
                s.clone(),
                ExpectedVersion::Any,
                (1..=6).map(add).collect(),
            )],
            AppendOptions::enqueue(),
        )
        .await
        .unwrap();
    let events = journal.read_stream(&s, Seq::FIRST, 10).await.unwrap();

    // A run that succeeds: rows and checkpoint together.
    store
        .apply(&s, &events[..3], std::slice::from_ref(&p))
        .await
        .unwrap();
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3], 3)
    );

    // Seq 5 is refused: the error names it, and nothing of the run commits.
    let r = store.apply(&s, &events[3..], std::slice::from_ref(&p)).await;
    assert!(
        matches!(&r, Err(Error::Apply { seq, .. }) if seq.get() == 5),
        "{r:?}"
    );
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3], 3)
    );

    // The events before it apply on their own, as the worker does next.
    store
        .apply(&s, &events[3..4], std::slice::from_ref(&p))
        .await
        .unwrap();
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3, 4], 4)
    );
}
