//! Replay and rebuild runs: persisted records of catch-up and rebuild jobs.

use std::fmt;

use serde::Serialize;

use crate::{Error, ProjectionName, Result, Seq, StreamId, Timestamp, WorkerId};

/// What a run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// Apply what the projection has not applied yet, walking the journal in
    /// global-position order (optionally only after `since` and up to
    /// `until`); each stream in seq order from its checkpoint.
    CatchUp,
    /// Clear the projection's tables and checkpoints, then replay from the
    /// journal's origin.
    Rebuild,
}

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Admitted, not started.
    Queued,
    /// Being executed by its owner.
    Running,
    /// Reached the tail (or `until`).
    Completed,
    /// Stopped by an error; committed batches stay.
    Failed,
    /// Stopped on request; committed batches stay.
    Cancelled,
}

macro_rules! names {
    ($t:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            /// The stable name stored by SQL adapters.
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }
        }
        impl std::str::FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                match s {
                    $($s => Ok(Self::$v),)*
                    _ => Err(Error::invalid(format_args!("unknown {} {s:?}", stringify!($t)))),
                }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(RunKind { CatchUp => "catch_up", Rebuild => "rebuild" });
names!(RunState {
    Queued => "queued",
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
});

impl RunState {
    /// Whether the run can still change (queued or running).
    pub const fn is_active(self) -> bool {
        matches!(self, RunState::Queued | RunState::Running)
    }
}

/// A persisted run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunRecord {
    /// Unique, increasing.
    pub id: u64,
    /// Catch-up or rebuild.
    pub kind: RunKind,
    /// The projection it works on (its scope: one active run per projection).
    pub projection: ProjectionName,
    /// The state.
    pub state: RunState,
    /// Only events after this global position are considered; the ones at or
    /// before it are taken as already reflected (a catch-up's lower bound;
    /// never set on a rebuild).
    pub since: Option<u64>,
    /// Stop at this global position (events after it are left for later).
    pub until: Option<u64>,
    /// The run's cursor: the global position it has committed through. Every
    /// event after `since` and at or before it has been applied (or found
    /// applied); `None` before the first committed page. A catch-up with
    /// `since` set to it resumes the run.
    pub position: Option<u64>,
    /// Events processed so far.
    pub processed: u64,
    /// The last event committed: (stream, seq).
    pub last_stream: Option<StreamId>,
    /// The last event committed: (stream, seq).
    pub last_seq: Option<Seq>,
    /// A short machine-readable code when failed (`apply`, `storage`, ...).
    pub error_code: Option<String>,
    /// The error message when failed.
    pub error_message: Option<String>,
    /// Set by a cancel request; the owner stops at its next batch boundary.
    pub cancel_requested: bool,
    /// Who executes it.
    pub owner: WorkerId,
    /// The owner's claim on the run expires at this time unless renewed; an
    /// active run whose claim expired is abandoned and no longer blocks its scope.
    pub lease_expires_at: Timestamp,
    /// When admitted.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// The global-position bounds of a run, for
/// [`RunStore::admit_bounded_run`](crate::RunStore::admit_bounded_run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RunBounds {
    /// Only events with a global position above it (exclusive).
    pub since: Option<u64>,
    /// Only events with a global position at or below it (inclusive).
    pub until: Option<u64>,
}

impl RunBounds {
    /// No bounds: the whole journal.
    pub const fn new() -> Self {
        Self {
            since: None,
            until: None,
        }
    }

    /// Only events after global position `since`.
    #[must_use]
    pub const fn with_since(mut self, since: Option<u64>) -> Self {
        self.since = since;
        self
    }

    /// Only events at or before global position `until`.
    #[must_use]
    pub const fn with_until(mut self, until: Option<u64>) -> Self {
        self.until = until;
        self
    }

    /// Whether global position `position` is inside the bounds.
    pub const fn contains(&self, position: u64) -> bool {
        let above = match self.since {
            Some(s) => position > s,
            None => true,
        };
        let below = match self.until {
            Some(u) => position <= u,
            None => true,
        };
        above && below
    }

    /// Refuses bounds a run of `kind` cannot have: a rebuild with `since`
    /// (a rebuild replays from the origin), and `since` at or above `until`
    /// (an empty range).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] saying which.
    pub fn validate(&self, kind: RunKind) -> Result<()> {
        if kind == RunKind::Rebuild && self.since.is_some() {
            return Err(Error::invalid(
                "a rebuild replays from the journal's origin: it takes no `since`",
            ));
        }
        if let (Some(since), Some(until)) = (self.since, self.until)
            && since >= until
        {
            return Err(Error::invalid(format_args!(
                "`since` ({since}) must be below `until` ({until}): the range is empty"
            )));
        }
        Ok(())
    }
}

/// A run's progress, for
/// [`RunStore::record_progress`](crate::RunStore::record_progress).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunProgress<'a> {
    /// Events processed so far.
    pub processed: u64,
    /// The last event committed, when one was (kept otherwise).
    pub last: Option<(&'a StreamId, Seq)>,
    /// The global position committed through, when it moved (kept otherwise).
    pub position: Option<u64>,
}

/// How a run ended, for [`RunStore::finish_run`](crate::RunStore::finish_run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Completed.
    Completed,
    /// Failed with a code and a message.
    Failed {
        /// Short code.
        code: String,
        /// Message.
        message: String,
    },
    /// Cancelled.
    Cancelled,
}

impl RunEnd {
    /// The terminal state.
    pub fn state(&self) -> RunState {
        match self {
            RunEnd::Completed => RunState::Completed,
            RunEnd::Failed { .. } => RunState::Failed,
            RunEnd::Cancelled => RunState::Cancelled,
        }
    }
}
