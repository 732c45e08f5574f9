//! The shared conformance suite, run against the in-memory adapters.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{AppendOptions, AppendRequest, EventJournal, ManualClock, Seq, StreamId};
use outbox_memory::{MemoryJournal, MemoryProjectionStore};
use outbox_testkit::{Fixture, Harness, HeldAppend};

#[derive(Default)]
struct MemoryHarness;

struct Ctx {
    clock: ManualClock,
    journal: MemoryJournal,
    projections: MemoryProjectionStore,
}

impl Harness for MemoryHarness {
    type Journal = MemoryJournal;
    type Projections = MemoryProjectionStore;
    type Context = Ctx;

    async fn open(&self) -> Fixture<Self> {
        let clock = ManualClock::default();
        let journal = MemoryJournal::with_clock(Arc::new(clock.clone()));
        let projections = MemoryProjectionStore::with_clock(Arc::new(clock.clone()));
        Fixture {
            journal: journal.clone(),
            projections: projections.clone(),
            ctx: Ctx {
                clock,
                journal,
                projections,
            },
        }
    }

    async fn reopen_journal(&self, ctx: &Ctx) -> MemoryJournal {
        ctx.journal.clone()
    }

    async fn reopen_projections(&self, ctx: &Ctx) -> MemoryProjectionStore {
        ctx.projections.clone()
    }

    async fn advance(&self, ctx: &Ctx, d: Duration) {
        ctx.clock.advance(d);
    }

    /// One lock takes positions and commits together: the append happens
    /// at commit.
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
        assert!(
            ctx.journal.corrupt_payload_for_tests(stream, seq),
            "no event {stream}/{seq} to corrupt"
        );
    }
}

outbox_testkit::conformance_tests!(MemoryHarness);
