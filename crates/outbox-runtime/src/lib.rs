#![doc = include_str!("../README.md")]

mod bounded;
mod clock;
mod config;
pub mod consumers;
mod failpoint;
mod gaps;
mod generations;
mod host;
mod lag;
mod metrics;
pub mod open;
mod outbox;
mod panic;
mod partitions;
mod registry;
mod replay;
mod running;
mod scratch;
mod sinks;
mod skipping;
#[cfg(feature = "testing")]
pub mod testing;
mod unavailable;
pub mod wait;
mod worker;

pub use bounded::StoreCallStats;
pub use clock::TokioClock;
pub use config::{Config, ENV_VARS};
#[cfg(feature = "failpoints")]
pub use failpoint::GENERATION_POINTS as GENERATION_FAILPOINTS;
#[cfg(feature = "failpoints")]
pub use failpoint::POINTS as FAILPOINTS;
pub use gaps::RepairReport;
pub use generations::{DEFAULT_DIFF_LIMIT, GenerationBuild, ShadowDiff, StreamDiff, Swap};
pub use host::host_name;
pub use lag::{LAG_BUCKETS_MS, LagSnapshot};
pub use metrics::{Gauges, MetricsSnapshot};
pub use outbox::{AppendOutcome, InlineFailure, JournalBackend, Outbox, OutboxBuilder, ProjectionBackend};
pub use replay::{ReplayOptions, error_code};
pub use running::{Running, Tasks, cancel_on_shutdown_signal};
pub use sinks::DeliveryReport;
pub use unavailable::retry_while_unavailable;
pub use worker::{TickReport, WorkerKind};

/// The cancellation token that [`Outbox::replay`], [`Outbox::rebuild`],
/// [`Outbox::start_until`] and friends take (tokio-util's), so an
/// application needs no dependency of its own on `tokio-util`.
pub use tokio_util::sync::CancellationToken;

/// The core prelude and the runtime's own names, in one import:
/// `use outbox_runtime::prelude::*;` (the builder, the running handle, the
/// configuration and the backend bounds, and [`open`]'s call).
pub mod prelude {
    pub use crate::open::{OpenOptions, WithStores, open_stores};
    pub use crate::{CancellationToken, Config, JournalBackend, Outbox, ProjectionBackend, Running};
    pub use outbox_core::prelude::*;
}
