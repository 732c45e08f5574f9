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
//! The journal is `OUTBOX_JOURNAL_URL` (default `sqlite://outbox-journal.db`,
//! as for `bank`); on Postgres the schema is `OUTBOX_PG_SCHEMA` (default
//! `outbox`). The journal must exist (`bank migrate`), and the sample's
//! accounts must not: it appends with `ExpectedVersion::NoStream`, so a
//! second run is refused with a version conflict and changes nothing.

use std::process::ExitCode;

use outbox_cli::{Location, open_url};
use outbox_core::{AppendOptions, EventJournal};
use outbox_postgres::{PgJournal, PgOptions};
use outbox_sqlite::{SqliteJournal, SqliteOptions};

async fn seed(journal: &impl EventJournal) -> Result<(), Box<dyn std::error::Error>> {
    // The sample's four appends, one transaction each, as four requests of
    // the bank's request path would make them.
    for request in outbox_example_bank::sample()? {
        for a in journal.append(&[request], AppendOptions::enqueue()).await? {
            println!("appended {} seq {}..={}", a.stream, a.first_seq, a.last_seq);
        }
    }
    Ok(())
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

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("OUTBOX_JOURNAL_URL").unwrap_or_else(|_| "sqlite://outbox-journal.db".into());
    match open_url(&url)? {
        Location::Sqlite(path) => {
            let options = SqliteOptions::default().with_create_if_missing(false);
            let journal = SqliteJournal::open(&path, options).await?;
            let result = seed(&journal).await;
            journal.close().await;
            result
        }
        Location::Postgres(url) => {
            let schema = std::env::var("OUTBOX_PG_SCHEMA").unwrap_or_else(|_| "outbox".into());
            let journal = PgJournal::connect(&url, PgOptions::default().with_schema(schema)).await?;
            let result = seed(&journal).await;
            journal.close().await;
            result
        }
    }
}
