//! Running digests against changes made behind the view API: a document
//! edited with hand-written SQL is caught by `verify_view_digest`, and a
//! projection whose documents predate running digests (the rows migration
//! 0004 adds with NULL lanes) stays untracked until a reset starts it over.

mod common;

use std::sync::Arc;

use common::test_options;
use outbox_core::{
    AppendOptions, AppendRequest, BoxError, DigestBuilder, Event, EventJournal, ExpectedVersion, Projection,
    ProjectionName, ProjectionStore, RunningDigest, ViewProjection, ViewStore, ViewTx, async_trait,
    view_projection,
};
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, SqliteTx};
use outbox_testkit::{add, sid};

/// Puts the event's seq under key `k<seq>` of table `t`.
struct Seqs(ProjectionName);

#[async_trait]
impl ViewProjection for Seqs {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event) -> Result<(), BoxError> {
        view.put("t", &format!("k{}", e.seq), &e.seq.get()).await?;
        Ok(())
    }
}

/// Runs `sql` on the projection database when applying (the escape hatch,
/// reaching behind the view API).
struct Behind(ProjectionName, &'static str);

#[async_trait]
impl Projection<SqliteTx> for Behind {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn apply(&self, tx: &mut SqliteTx, _: &Event) -> Result<(), BoxError> {
        let sql = self.1;
        tx.run(move |conn| conn.execute_batch(sql)).await?;
        Ok(())
    }
    async fn reset(&self, _: &mut SqliteTx) -> Result<(), BoxError> {
        Ok(())
    }
    async fn digest(&self, _: &mut SqliteTx, _: &mut DigestBuilder) -> Result<(), BoxError> {
        Ok(())
    }
}

struct Stores {
    _dir: tempfile::TempDir,
    journal: SqliteJournal,
    store: SqliteProjectionStore,
    p: ProjectionName,
    view: Arc<dyn Projection<SqliteTx>>,
}

async fn stores() -> Stores {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(dir.path().join("j.db"), test_options())
        .await
        .unwrap();
    let store = SqliteProjectionStore::open(dir.path().join("p.db"), test_options())
        .await
        .unwrap();
    let p = ProjectionName::new("seqs").unwrap();
    let view = view_projection(Arc::new(Seqs(p.clone())));
    store.setup(std::slice::from_ref(&view)).await.unwrap();
    Stores {
        _dir: dir,
        journal,
        store,
        p,
        view,
    }
}

impl Stores {
    /// Appends `n` events to `stream` and applies them to `projection`.
    async fn apply(&self, stream: &str, n: usize, projection: &Arc<dyn Projection<SqliteTx>>) {
        let s = sid(stream);
        let appended = self
            .journal
            .append(
                &[AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::Any,
                    (0..n).map(|i| add(i as i64)).collect(),
                )],
                AppendOptions::default(),
            )
            .await
            .unwrap();
        let from = appended[0].first_seq;
        let events = self.journal.read_stream(&s, from, n).await.unwrap();
        self.store
            .apply(&s, &events, std::slice::from_ref(projection))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn verify_catches_a_document_changed_behind_the_view_api() {
    let st = stores().await;
    st.apply("a", 3, &st.view).await;
    let check = st.store.verify_view_digest(&st.p).await.unwrap();
    assert!(check.matches(), "{:?}", check.mismatch());
    assert_eq!(check.scanned.documents(), 3);

    let tamper: Arc<dyn Projection<SqliteTx>> = Arc::new(Behind(
        ProjectionName::new("tamper").unwrap(),
        "UPDATE outbox_views SET value = '42' WHERE projection = 'seqs' AND key = 'k2'",
    ));
    st.apply("b", 1, &tamper).await;
    let check = st.store.verify_view_digest(&st.p).await.unwrap();
    let line = check.mismatch().expect("the edited document is caught");
    assert!(
        line.contains("`seqs`") && line.contains("but a scan gives") && !line.contains('\n'),
        "{line}"
    );
    assert_eq!(check.scanned.documents(), 3, "same count, different contents");
}

#[tokio::test]
async fn documents_from_before_running_digests_stay_untracked_until_a_reset() {
    let st = stores().await;
    st.apply("a", 2, &st.view).await;
    // What migration 0004 leaves for documents written before it.
    let untrack: Arc<dyn Projection<SqliteTx>> = Arc::new(Behind(
        ProjectionName::new("untrack").unwrap(),
        "UPDATE outbox_view_digests SET d0 = NULL, d1 = NULL, d2 = NULL, d3 = NULL, d4 = NULL, \
         d5 = NULL, d6 = NULL, d7 = NULL WHERE projection = 'seqs'",
    ));
    st.apply("b", 1, &untrack).await;
    let check = st.store.verify_view_digest(&st.p).await.unwrap();
    assert_eq!(check.recorded.digest, None);
    assert!(
        check.mismatch().unwrap().contains("rebuild"),
        "{:?}",
        check.mismatch()
    );

    st.apply("a", 1, &st.view).await;
    let listed = st.store.view_digests().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].digest, None,
        "applies keep an untracked digest untracked"
    );

    st.store.reset(&*st.view).await.unwrap();
    st.apply("c", 2, &st.view).await;
    let check = st.store.verify_view_digest(&st.p).await.unwrap();
    assert!(check.matches(), "{:?}", check.mismatch());
    assert_ne!(check.recorded.digest, Some(RunningDigest::EMPTY));
    assert_eq!(check.recorded.documents, 2);
}

/// Migration 0004 on a database that already has documents: each projection
/// with documents gets an untracked running digest (NULL lanes), which
/// `verify` reports and a reset starts over.
#[tokio::test]
async fn the_migration_marks_existing_documents_untracked() {
    let st = stores().await;
    st.apply("a", 3, &st.view).await;
    let path = st.store.path().to_owned();
    st.store.close().await;
    // Roll the file back to the schema before migration 0004, documents kept.
    {
        use sqlx::{ConnectOptions, sqlite::SqliteConnectOptions};
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .connect()
            .await
            .unwrap();
        sqlx::query("DELETE FROM _outbox_migrations WHERE version = 4")
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query("DROP TABLE outbox_view_digests")
            .execute(&mut conn)
            .await
            .unwrap();
        let _ = sqlx::Connection::close(conn).await;
    }
    let store = SqliteProjectionStore::open(&path, test_options()).await.unwrap();
    let listed = store.view_digests().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].projection.as_str(), listed[0].digest), ("seqs", None));
    let check = store.verify_view_digest(&st.p).await.unwrap();
    assert_eq!(check.scanned.documents(), 3);
    assert!(
        check.mismatch().unwrap().contains("rebuild"),
        "{:?}",
        check.mismatch()
    );
    store.reset(&*st.view).await.unwrap();
    assert!(store.verify_view_digest(&st.p).await.unwrap().matches());
    store.close().await;
}

/// Several view projections in one apply transaction each keep their own
/// running digest: their digest updates, the documents and the checkpoints
/// go to the database together (one command with many placeholders; the
/// demo's three projections once found its arguments bound to the wrong
/// placeholders).
#[tokio::test]
async fn several_view_projections_in_one_transaction_keep_their_own_digests() {
    let st = stores().await;
    let names: Vec<ProjectionName> = ["one", "two", "three"]
        .iter()
        .map(|n| ProjectionName::new(*n).unwrap())
        .collect();
    let views: Vec<Arc<dyn Projection<SqliteTx>>> = names
        .iter()
        .map(|n| view_projection(Arc::new(Seqs(n.clone()))))
        .collect();
    st.store.setup(&views).await.unwrap();
    let mut runs = Vec::new();
    for stream in ["a", "b"] {
        let s = sid(stream);
        st.journal
            .append(
                &[AppendRequest::new(
                    s.clone(),
                    ExpectedVersion::Any,
                    (0..4).map(add).collect(),
                )],
                AppendOptions::default(),
            )
            .await
            .unwrap();
        runs.push(
            st.journal
                .read_stream(&s, outbox_core::Seq::FIRST, 4)
                .await
                .unwrap(),
        );
    }
    let runs: Vec<&[Event]> = runs.iter().map(Vec::as_slice).collect();
    let outcomes = st.store.apply_runs(&runs, &views).await.unwrap();
    assert_eq!(outcomes.len(), 2);
    for n in &names {
        let check = st.store.verify_view_digest(n).await.unwrap();
        assert!(check.matches(), "{n}: {:?}", check.mismatch());
        assert_eq!(
            check.scanned.documents(),
            4,
            "{n}: k1..k4, written by both streams"
        );
        assert_eq!(st.store.checkpoint(n, &sid("a")).await.unwrap(), 4);
    }
}
