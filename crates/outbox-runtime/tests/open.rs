//! `open::open_stores`: one call opens both stores from URLs on every
//! backend, and what it refuses leaves nothing behind.

use outbox_core::{Error, ExpectedVersion, LeaseAdmin, Seq};
use outbox_runtime::open::{OpenOptions, WithStores, open_stores};
use outbox_runtime::{Config, JournalBackend, Outbox, ProjectionBackend};
use outbox_testkit::{add, oracle_registry, sid};

/// Appends one event to stream `s` through a runtime built on the stores,
/// and returns the stream's events read back from the journal.
struct AppendOne;

impl WithStores for AppendOne {
    type Output = outbox_core::Result<usize>;

    async fn with<J, P>(self, journal: J, store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        let outbox = Outbox::builder(journal.clone(), store)
            .config(Config::producer_only())
            .event_types(oracle_registry())
            .build()
            .await?;
        outbox
            .append(&sid("s"), ExpectedVersion::Any, vec![add(1)])
            .await?;
        Ok(journal.read_stream(&sid("s"), Seq::FIRST, 100).await?.len())
    }
}

#[tokio::test]
async fn memory_urls_open_the_in_process_adapter() {
    let n = open_stores("memory:", "memory:", &OpenOptions::default(), AppendOne)
        .await
        .expect("opened")
        .expect("appended");
    assert_eq!(n, 1);
}

#[tokio::test]
async fn sqlite_urls_open_files_created_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let j = format!("sqlite://{}", dir.path().join("j.db").display());
    let p = format!("sqlite://{}", dir.path().join("p.db").display());
    let refused = open_stores(&j, &p, &OpenOptions::default(), AppendOne).await;
    assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a refused open creates no file"
    );
    let created = OpenOptions::default().with_create(true);
    assert_eq!(
        open_stores(&j, &p, &created, AppendOne).await.unwrap().unwrap(),
        1
    );
    // Opened again without `create`: the same files, the first event kept.
    assert_eq!(
        open_stores(&j, &p, &OpenOptions::default(), AppendOne)
            .await
            .unwrap()
            .unwrap(),
        2
    );
}

#[tokio::test]
async fn a_refused_projection_store_removes_the_journal_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let j = format!("sqlite://{}", dir.path().join("j.db").display());
    // The projection store's directory does not exist: its open fails.
    let p = format!("sqlite://{}", dir.path().join("missing/p.db").display());
    let r = open_stores(&j, &p, &OpenOptions::default().with_create(true), AppendOne).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the journal this call created was removed"
    );
}

#[tokio::test]
async fn mixed_backends_and_bad_urls_are_refused_in_one_line() {
    let o = OpenOptions::default();
    for (j, p) in [
        ("memory:", "sqlite://p.db"),
        ("sqlite://j.db", "postgres://u:secret@h/db"),
        ("mysql://h/db", "memory:"),
        ("postgres:/u:secret@h/db", "memory:"),
    ] {
        let e = open_stores(j, p, &o, AppendOne).await.expect_err(j);
        assert!(matches!(e, Error::InvalidInput(_)), "{j} {p}: {e}");
        let shown = e.to_string();
        assert!(!shown.contains("secret") && !shown.contains('\n'), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_urls_open_one_schema_created_only_when_asked() {
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schema = format!("open_{}", std::process::id());
    let o = OpenOptions::default().with_schema(&schema);
    let refused = open_stores(&url, &url, &o, AppendOne).await;
    assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
    let bad = open_stores(&url, &url, &o.clone().with_schema("Bad-Name"), AppendOne).await;
    assert!(matches!(bad, Err(Error::Config(_))), "{bad:?}");
    let created = o.clone().with_create(true);
    let first = open_stores(&url, &url, &created, AppendOne).await;
    let again = open_stores(&url, &url, &o, AppendOne).await;
    drop_schema(&url, &schema).await;
    assert_eq!(first.unwrap().unwrap(), 1);
    assert_eq!(again.unwrap().unwrap(), 2, "opened again, the first event kept");
}

async fn drop_schema(url: &str, schema: &str) {
    use outbox_postgres::sqlx::{self, Connection as _};
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    // A test-generated name.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE"
    )))
    .execute(&mut c)
    .await
    .unwrap();
}
