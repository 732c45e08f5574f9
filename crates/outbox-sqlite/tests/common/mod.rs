//! The SQLite test harness: a temp dir per fixture.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use outbox_core::{AppendOptions, AppendRequest, EventJournal, Seq, StreamId};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore, Synchronous};
use outbox_testkit::{Fixture, Harness, HeldAppend};

/// Options for tests: NORMAL sync keeps the suite quick (durability across
/// power loss is not what the suite checks; crash tests reopen the files).
pub fn test_options() -> SqliteOptions {
    SqliteOptions::default()
        .with_synchronous(Synchronous::Normal)
        .with_test_clock()
}

#[derive(Default)]
pub struct SqliteHarness;

pub struct Ctx {
    pub dir: tempfile::TempDir,
    pub journal_path: PathBuf,
    pub projection_path: PathBuf,
    pub journal: SqliteJournal,
    pub projections: SqliteProjectionStore,
}

impl Harness for SqliteHarness {
    type Journal = SqliteJournal;
    type Projections = SqliteProjectionStore;
    type Context = Ctx;

    async fn open(&self) -> Fixture<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let journal_path = dir.path().join("journal.db");
        let projection_path = dir.path().join("projections.db");
        let journal = SqliteJournal::open(&journal_path, test_options())
            .await
            .expect("open journal");
        let projections = SqliteProjectionStore::open(&projection_path, test_options())
            .await
            .expect("open projections");
        Fixture {
            journal: journal.clone(),
            projections: projections.clone(),
            ctx: Ctx {
                dir,
                journal_path,
                projection_path,
                journal,
                projections,
            },
        }
    }

    async fn reopen_journal(&self, ctx: &Ctx) -> SqliteJournal {
        SqliteJournal::open(&ctx.journal_path, test_options())
            .await
            .expect("reopen journal")
    }

    async fn reopen_projections(&self, ctx: &Ctx) -> SqliteProjectionStore {
        SqliteProjectionStore::open(&ctx.projection_path, test_options())
            .await
            .expect("reopen projections")
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

    /// SQLite's one writer lets no other append through while a
    /// transaction holds its write lock: the append happens at commit.
    async fn hold_append(&self, ctx: &Ctx, batch: Vec<AppendRequest>) -> HeldAppend {
        let journal = ctx.journal.clone();
        HeldAppend::new(async move || {
            journal
                .append(&batch, AppendOptions::enqueue())
                .await
                .expect("the held append commits");
        })
    }

    async fn corrupt_payload(&self, ctx: &Ctx, stream: &StreamId, seq: Seq) {
        let (stream, seq) = (stream.clone(), seq.as_i64());
        ctx.journal
            .transaction(move |tx| {
                let conn = tx.conn();
                let mut payload: Vec<u8> = conn
                    .query_row(
                        "SELECT payload FROM events WHERE stream = ?1 AND seq = ?2",
                        outbox_sqlite::rusqlite::params![stream.as_str(), seq],
                        |r| r.get(0),
                    )
                    .unwrap_or_else(|e| panic!("no event {stream}/{seq} to corrupt: {e}"));
                match payload.first_mut() {
                    Some(b) => *b ^= 0xff,
                    None => payload.push(0),
                }
                conn.execute(
                    "UPDATE events SET payload = ?3 WHERE stream = ?1 AND seq = ?2",
                    outbox_sqlite::rusqlite::params![stream.as_str(), seq, payload],
                )
                .expect("corrupt payload");
                Ok::<(), outbox_core::Error>(())
            })
            .await
            .expect("commit");
    }
}
