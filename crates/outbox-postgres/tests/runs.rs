//! A hand-written projection that writes a whole run in one statement
//! (`Projection::apply_run`), finding the failing event the way the trait
//! documents for Postgres: a savepoint before the statement, and on an
//! error a rollback to it and the events one at a time. The error names
//! that event; nothing of the run commits; the events before it apply.

mod common;

use std::sync::Arc;

use common::{DropSchemas, journal, projections, test_database_url, unique_schema};
use outbox_core::{
    AppendOptions, AppendRequest, BoxError, DigestBuilder, Error, Event, EventJournal, ExpectedVersion,
    FailedEvent, Projection, ProjectionName, ProjectionStore, Seq,
};
use outbox_postgres::sqlx::{self, PgConnection};
use outbox_postgres::{PgProjectionStore, PgTx};
use outbox_testkit::{add, sid};

/// One row per event, keyed by seq; the table refuses seq 5.
struct Rows(ProjectionName);

async fn insert(conn: &mut PgConnection, seqs: &[i64]) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO run_rows (seq) SELECT * FROM unnest($1::bigint[])")
        .bind(seqs)
        .execute(conn)
        .await
        .map(drop)
}

async fn exec(conn: &mut PgConnection, sql: &'static str) -> sqlx::Result<()> {
    sqlx::query(sql).execute(conn).await.map(drop)
}

#[outbox_core::async_trait]
impl Projection<PgTx> for Rows {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn setup(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        exec(
            tx.conn(),
            "CREATE TABLE IF NOT EXISTS run_rows (seq bigint PRIMARY KEY CHECK (seq <> 5))",
        )
        .await?;
        Ok(())
    }
    async fn apply(&self, tx: &mut PgTx, e: &Event) -> Result<(), BoxError> {
        insert(tx.conn(), &[e.seq.as_i64()]).await?;
        Ok(())
    }
    async fn apply_run(&self, tx: &mut PgTx, events: &[&Event]) -> Result<(), FailedEvent> {
        let seqs: Vec<i64> = events.iter().map(|e| e.seq.as_i64()).collect();
        let conn = tx.conn();
        exec(conn, "SAVEPOINT run")
            .await
            .map_err(|e| FailedEvent::at(0, e))?;
        let Err(whole) = insert(conn, &seqs).await else {
            exec(conn, "RELEASE SAVEPOINT run")
                .await
                .map_err(|e| FailedEvent::at(0, e))?;
            return Ok(());
        };
        // Find the event: back to before the statement, then one at a time.
        exec(conn, "ROLLBACK TO SAVEPOINT run")
            .await
            .map_err(|_| FailedEvent::at(0, whole))?;
        for (i, seq) in seqs.iter().enumerate() {
            insert(conn, &[*seq]).await.map_err(|e| FailedEvent::at(i, e))?;
        }
        exec(conn, "RELEASE SAVEPOINT run")
            .await
            .map_err(|e| FailedEvent::at(0, e))
    }
    fn applies_runs(&self) -> bool {
        true
    }
    async fn reset(&self, tx: &mut PgTx) -> Result<(), BoxError> {
        exec(tx.conn(), "DELETE FROM run_rows").await?;
        Ok(())
    }
    async fn digest(&self, tx: &mut PgTx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(outbox_postgres::digest_table(tx.conn(), "run_rows", out).await?)
    }
}

async fn rows(store: &PgProjectionStore) -> Vec<i64> {
    sqlx::query_scalar("SELECT seq FROM run_rows ORDER BY seq")
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_run_in_one_statement_names_the_event_it_fails_on_through_a_savepoint() {
    let Some(url) = test_database_url() else { return };
    let (js, ps) = (unique_schema("rj"), unique_schema("rp"));
    let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
    let j = journal(&url, &js).await;
    let store = projections(&url, &ps).await;
    let name = ProjectionName::new("rows").unwrap();
    let p: Arc<dyn Projection<PgTx>> = Arc::new(Rows(name.clone()));
    store.setup(std::slice::from_ref(&p)).await.unwrap();
    let s = sid("s");
    j.append(
        &[AppendRequest::new(
            s.clone(),
            ExpectedVersion::Any,
            (1..=6).map(add).collect(),
        )],
        AppendOptions::enqueue(),
    )
    .await
    .unwrap();
    let events = j.read_stream(&s, Seq::FIRST, 10).await.unwrap();

    store
        .apply(&s, &events[..3], std::slice::from_ref(&p))
        .await
        .unwrap();
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3], 3)
    );

    let r = store.apply(&s, &events[3..], std::slice::from_ref(&p)).await;
    assert!(
        matches!(&r, Err(Error::Apply { seq, .. }) if seq.get() == 5),
        "{r:?}"
    );
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3], 3)
    );

    store
        .apply(&s, &events[3..4], std::slice::from_ref(&p))
        .await
        .unwrap();
    assert_eq!(
        (rows(&store).await, store.checkpoint(&name, &s).await.unwrap()),
        (vec![1, 2, 3, 4], 4)
    );
}
