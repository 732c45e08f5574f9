//! Running digests under an interleaving of concurrent applies that only
//! Postgres allows (ADR 0019): a document read (and so key-locked) by one
//! apply is deleted by another apply, which takes no key lock, and committed
//! before the first writes it back. The first apply's upsert then inserts,
//! so it must not also subtract the document it read: the running digest
//! still equals a scan afterwards.

mod common;

use std::sync::Arc;

use common::{DropSchemas, journal, projections, test_database_url, unique_schema};
use outbox_core::{
    AppendOptions, AppendRequest, ApplyOutcome, BoxError, Event, EventJournal, ExpectedVersion, Projection,
    ProjectionName, ProjectionStore, Seq, ViewProjection, ViewStore, ViewTx, async_trait, view_projection,
};
use outbox_postgres::PgTx;
use outbox_testkit::{add, sid};
use tokio::sync::Notify;

/// Stream `init` puts `t/k`; stream `a` reads it, tells the test, waits to
/// be let go and puts it back; stream `b` deletes it.
struct Interleaved {
    name: ProjectionName,
    a_read: Arc<Notify>,
    a_go: Arc<Notify>,
}

#[async_trait]
impl ViewProjection for Interleaved {
    fn name(&self) -> &ProjectionName {
        &self.name
    }
    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event) -> Result<(), BoxError> {
        match e.stream.as_str() {
            "init" => view.put("t", "k", &"v1").await?,
            "a" => {
                let seen: Option<String> = view.get("t", "k").await?;
                assert_eq!(seen.as_deref(), Some("v1"));
                self.a_read.notify_one();
                self.a_go.notified().await;
                view.put("t", "k", &"from a").await?;
            }
            _ => {
                view.delete("t", "k").await?;
            }
        }
        Ok(())
    }
}

async fn one_event(j: &outbox_postgres::PgJournal, stream: &str) -> Vec<Event> {
    let s = sid(stream);
    j.append(
        &[AppendRequest::new(s.clone(), ExpectedVersion::Any, vec![add(1)])],
        AppendOptions::default(),
    )
    .await
    .expect("append");
    j.read_stream(&s, Seq::FIRST, 1).await.expect("read")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_document_deleted_by_another_apply_is_not_subtracted_twice() {
    let Some(url) = test_database_url() else { return };
    let (js, ps) = (unique_schema("rdj"), unique_schema("rdp"));
    let _drop = DropSchemas::new(&url, [js.clone(), ps.clone()]);
    let j = journal(&url, &js).await;
    let store = Arc::new(projections(&url, &ps).await);
    let name = ProjectionName::new("p").unwrap();
    let (a_read, a_go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let view: Arc<dyn Projection<PgTx>> = view_projection(Arc::new(Interleaved {
        name: name.clone(),
        a_read: a_read.clone(),
        a_go: a_go.clone(),
    }));
    let ps_list = vec![view];
    store.setup(&ps_list).await.expect("setup");

    let init = one_event(&j, "init").await;
    store.apply(&sid("init"), &init, &ps_list).await.expect("init");

    let a = one_event(&j, "a").await;
    let (sa, pa, store_a) = (sid("a"), ps_list.clone(), store.clone());
    let task = tokio::spawn(async move { store_a.apply(&sa, &a, &pa).await });
    a_read.notified().await;
    // `a` holds the key's lock and has read v1; `b` deletes v1 and commits.
    let b = one_event(&j, "b").await;
    let out = store.apply(&sid("b"), &b, &ps_list).await.expect("b");
    assert!(matches!(out, ApplyOutcome::Applied(_)), "{out:?}");
    a_go.notify_one();
    let out = task.await.expect("task").expect("a");
    assert!(matches!(out, ApplyOutcome::Applied(_)), "{out:?}");

    let got: Option<String> = outbox_core::ViewReader::new(&*store, name.clone())
        .get("t", "k")
        .await
        .unwrap();
    assert_eq!(
        got.as_deref(),
        Some("from a"),
        "a's put inserted the document again"
    );
    let check = store.verify_view_digest(&name).await.unwrap();
    assert!(check.matches(), "{:?}", check.mismatch());
    assert_eq!(check.scanned.documents(), 1);
}
