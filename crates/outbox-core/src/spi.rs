//! Plumbing for adapter authors: what an adapter implements or calls that an
//! application never touches.
//!
//! Applications use the crate root (events, ports, projections, policies);
//! adapters additionally implement the traits here and use its helpers.
//!
//! **Not semver-stable for applications.** This module changes with the
//! adapters' needs (the apply loop's hooks, row conversions, validation
//! helpers), in any release of `outbox-core`; only the crate root is the
//! application's API. An adapter outside this workspace should pin the exact
//! version of `outbox-core` it was written against.

pub use crate::apply::{all_applied, apply_in, apply_runs_in, ended_by_projection, reapply_in};
pub use crate::event::{AppendPlan, plan_append};
pub use crate::generation::{BuildPlan, comparable_digest, not_building, plan_build, plan_drop};
pub use crate::live::{GenerationMap, LiveGeneration};
pub use crate::outbox::{truncate_error, unless_lease_lost, validate_limit, validate_ttl};
pub use crate::partition::validate_wanted;
pub use crate::ports::worker_id_held;
pub use crate::projection::{ProjectionPlan, plan_apply, validate_run};
pub use crate::running::stored_view_digest;
pub use crate::sink::{validate_advance, validate_cursor_move, validate_failing};
pub use crate::stored::{
    StoredEvent, StoredLease, StoredOutboxRow, StoredRun, StoredWatermark, journal_undecodable,
    projection_names, projection_undecodable, validate_projection_names,
};
pub use crate::time::duration_millis;
pub use crate::tx::{ApplyTx, CheckpointMove, StreamAdvance, ViewRow, ViewStorage};
pub use crate::view::digest_view;
