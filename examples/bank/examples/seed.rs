//! Appends the bank's sample day ([`outbox_example_bank::sample`]) to the
//! journal the `bank` command uses, with an outbox row per event, so that
//! `bank work --once` has something to apply.
//!
//! ```sh
//! cargo run -p outbox-example-bank -- migrate
//! cargo run -p outbox-example-bank --example seed
//! cargo run -p outbox-example-bank -- work --once
//! ```
//!
//! The stores are `OUTBOX_JOURNAL_URL` and `OUTBOX_PROJECTION_URL` (defaults
//! `sqlite://outbox-journal.db` and `sqlite://outbox-projections.db`, as for
//! `bank`), opened by `outbox_runtime::open::open_stores`; on Postgres the
//! schema is `OUTBOX_PG_SCHEMA` (default `outbox`). The stores must exist
//! (`bank migrate`), and the sample's
//! accounts must not: it appends with `ExpectedVersion::NoStream`, so a
//! second run is refused with a version conflict and changes nothing.

use std::process::ExitCode;

use outbox_core::{AppendOptions, LeaseAdmin};
use outbox_runtime::open::{OpenOptions, WithStores, open_stores};
use outbox_runtime::{JournalBackend, ProjectionBackend};

/// The seeding, written once for every backend.
struct Seed;

impl WithStores for Seed {
    type Output = outbox_core::Result<()>;

    async fn with<J, P>(self, journal: J, _store: P) -> Self::Output
    where
        J: JournalBackend + LeaseAdmin + Clone,
        P: ProjectionBackend + Clone,
    {
        // The sample's four appends, one transaction each, as four requests of
        // the bank's request path would make them.
        for request in outbox_example_bank::sample()? {
            for a in journal.append(&[request], AppendOptions::enqueue()).await? {
                println!("appended {} seq {}..={}", a.stream, a.first_seq, a.last_seq);
            }
        }
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seed: error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> outbox_core::Result<()> {
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let journal = var("OUTBOX_JOURNAL_URL", "sqlite://outbox-journal.db");
    let projections = var("OUTBOX_PROJECTION_URL", "sqlite://outbox-projections.db");
    // The stores must exist (`bank migrate`); the schema is OUTBOX_PG_SCHEMA's.
    open_stores(&journal, &projections, &OpenOptions::from_env()?, Seed).await?
}
