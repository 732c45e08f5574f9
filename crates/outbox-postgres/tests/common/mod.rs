//! The Postgres test harness: a fresh schema (or two) per fixture, dropped
//! when the fixture is; the oracle's tables in the projection schema.
//!
//! Every test starts with [`test_database_url`] (or [`PgHarness::two_schemas`]
//! / [`PgHarness::shared`]) and returns when it is `None`: without a server
//! the binary says once why its tests are skipped; in CI they fail instead.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use outbox_core::{AppendOptions, AppendRequest, Seq, StreamId};
use outbox_postgres::sqlx;
pub use outbox_postgres::testing::{DropSchemas, unique_schema};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore};
use outbox_testkit::{Fixture, Harness, HeldAppend};

pub use outbox_testkit::pg::test_database_url;

/// Options for a test store on `schema`.
pub fn options(schema: &str) -> PgOptions {
    PgOptions::default()
        .with_schema(schema)
        .with_max_connections(4)
        .with_acquire_timeout(Duration::from_secs(20))
        .with_test_clock()
}

pub async fn journal(url: &str, schema: &str) -> PgJournal {
    PgJournal::connect(url, options(schema))
        .await
        .expect("connect journal")
}

pub async fn projections(url: &str, schema: &str) -> PgProjectionStore {
    PgProjectionStore::connect(url, options(schema))
        .await
        .expect("connect projections")
}

/// Runs the suite with the journal and the projections in two schemas with
/// their own pools (`shared: false`, the "two databases" shape), or in one
/// schema sharing one pool (`shared: true`).
pub struct PgHarness {
    pub url: String,
    pub shared: bool,
}

impl PgHarness {
    /// Two schemas, two pools; `None` when the tests are skipped.
    pub fn two_schemas() -> Option<Self> {
        let url = test_database_url()?;
        Some(PgHarness { url, shared: false })
    }

    /// One schema, one pool; `None` when the tests are skipped.
    pub fn shared() -> Option<Self> {
        let url = test_database_url()?;
        Some(PgHarness { url, shared: true })
    }
}

pub struct Ctx {
    pub journal_schema: String,
    pub projection_schema: String,
    pub journal: PgJournal,
    pub projections: PgProjectionStore,
    _drop: DropSchemas,
}

impl Harness for PgHarness {
    type Journal = PgJournal;
    type Projections = PgProjectionStore;
    type Context = Ctx;

    async fn open(&self) -> Fixture<Self> {
        let (journal_schema, projection_schema, journal, projections) = if self.shared {
            let s = unique_schema("one");
            let j = journal(&self.url, &s).await;
            let p = PgProjectionStore::sharing(&j).await.expect("sharing projections");
            (s.clone(), s, j, p)
        } else {
            let (js, ps) = (unique_schema("j"), unique_schema("p"));
            let j = journal(&self.url, &js).await;
            let p = projections(&self.url, &ps).await;
            (js, ps, j, p)
        };
        let mut schemas = vec![journal_schema.clone()];
        if projection_schema != journal_schema {
            schemas.push(projection_schema.clone());
        }
        Fixture {
            journal: journal.clone(),
            projections: projections.clone(),
            ctx: Ctx {
                journal_schema,
                projection_schema,
                journal,
                projections,
                _drop: DropSchemas::new(&self.url, schemas),
            },
        }
    }

    async fn reopen_journal(&self, ctx: &Ctx) -> PgJournal {
        journal(&self.url, &ctx.journal_schema).await
    }

    async fn reopen_projections(&self, ctx: &Ctx) -> PgProjectionStore {
        projections(&self.url, &ctx.projection_schema).await
    }

    async fn advance(&self, ctx: &Ctx, d: Duration) {
        ctx.journal
            .advance_clock_for_tests(d)
            .await
            .expect("advance journal clock");
        ctx.projections
            .advance_clock_for_tests(d)
            .await
            .expect("advance projection clock");
    }

    /// A real open transaction: its events take their positions now and
    /// are visible only once it commits. On a journal instance of its own,
    /// so that many held appends do not exhaust the fixture's pool.
    async fn hold_append(&self, ctx: &Ctx, batch: Vec<AppendRequest>) -> HeldAppend {
        let journal = self.reopen_journal(ctx).await;
        let mut tx = journal.begin().await.expect("begin");
        journal
            .append_in(&mut tx, &batch, AppendOptions::enqueue())
            .await
            .expect("append in the open transaction");
        HeldAppend::new(async move || {
            tx.commit().await.expect("the held append commits");
            drop(journal);
        })
    }

    async fn corrupt_payload(&self, ctx: &Ctx, stream: &StreamId, seq: Seq) {
        let n = sqlx::query(
            "UPDATE events SET payload = CASE WHEN length(payload) = 0 THEN '\\x00'::bytea \
             ELSE set_byte(payload, 0, get_byte(payload, 0) # 255) END WHERE stream = $1 AND seq = $2",
        )
        .bind(stream.as_str())
        .bind(seq.as_i64())
        .execute(ctx.journal.pool())
        .await
        .expect("corrupt a payload")
        .rows_affected();
        assert_eq!(n, 1, "no event {stream}/{seq} to corrupt");
    }
}
