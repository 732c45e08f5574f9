//! What one round is made of, for every subcommand: where its databases
//! are, its stream ids and the seeded randomness of its schedule.

use std::path::PathBuf;

use anyhow::{Result, bail};
use outbox_postgres::PgOptions;

use crate::args::Args;

/// Where one round's databases are.
#[derive(Clone, Debug)]
pub(crate) enum Place {
    Sqlite {
        journal: PathBuf,
        projections: PathBuf,
    },
    Postgres {
        url: String,
        journal: String,
        projections: String,
    },
}

impl Place {
    pub(crate) fn from_args(a: &Args) -> Result<Place> {
        Ok(match a.req("--backend")? {
            "sqlite" => Place::Sqlite {
                journal: a.req("--journal")?.into(),
                projections: a.req("--projections")?.into(),
            },
            "postgres" => Place::Postgres {
                url: a.req("--url")?.into(),
                journal: a.req("--journal-schema")?.into(),
                projections: a.req("--projection-schema")?.into(),
            },
            other => bail!("unknown backend {other:?}"),
        })
    }

    pub(crate) fn to_args(&self) -> Vec<String> {
        match self {
            Place::Sqlite { journal, projections } => vec![
                "--backend".into(),
                "sqlite".into(),
                "--journal".into(),
                journal.display().to_string(),
                "--projections".into(),
                projections.display().to_string(),
            ],
            Place::Postgres {
                url,
                journal,
                projections,
            } => vec![
                "--backend".into(),
                "postgres".into(),
                "--url".into(),
                url.clone(),
                "--journal-schema".into(),
                journal.clone(),
                "--projection-schema".into(),
                projections.clone(),
            ],
        }
    }

    /// The same place with its projections in `other` (a scratch store for
    /// the rebuild): a file beside the others, or another schema.
    pub(crate) fn with_projections(&self, other: &str) -> Place {
        match self {
            Place::Sqlite { journal, projections } => Place::Sqlite {
                journal: journal.clone(),
                projections: projections.with_file_name(format!("{other}.db")),
            },
            Place::Postgres { url, journal, .. } => Place::Postgres {
                url: url.clone(),
                journal: journal.clone(),
                projections: format!("{journal}_{other}"),
            },
        }
    }
}

/// How long opening the Postgres stores keeps retrying while the server is
/// unavailable (a liveness bound only).
pub(crate) const CONNECT_RETRY: std::time::Duration = std::time::Duration::from_secs(120);

pub(crate) fn pg_options(schema: &str) -> PgOptions {
    PgOptions::default()
        .with_schema(schema)
        .with_max_connections(4)
        .with_acquire_timeout(std::time::Duration::from_secs(20))
}

/// splitmix64: small, deterministic schedules from a seed.
#[derive(Clone, Debug)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `num/den`.
    pub(crate) fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

/// The name of every round's second projection, beside the oracle.
pub(crate) const FLAKY: &str = "flaky";

/// The round's stream ids.
pub(crate) fn stream_names(n: u64) -> Vec<String> {
    (0..n).map(|i| format!("c{i:02}")).collect()
}
