//! Waiting for one's own write (ADR 0032): an append returns the last seq
//! it wrote on each stream ([`AppendToken`]), and
//! [`Outbox::wait_for`] resolves once the projections asked for have
//! applied through it, or says which one cannot (dead or paused there) or
//! is failing when the time is up.
//!
//! In the process that applies, a waiter wakes on every committed apply.
//! A waiter in another process wakes on the projection store's progress
//! source when the runtime has one (`OutboxBuilder::progress_source`: on
//! SQLite, the projection file's change counter, the mechanism workers wake
//! on), with a check every second as the safety net; without one it reads
//! the checkpoints again after a short backoff (1 ms doubling to 50 ms).
//! The reads are the waiter's own, off the workers' path.

use std::time::Duration;

use outbox_core::{
    Appended, ConsumerRegistry, Error, ProjectionName, ProjectionStore, Result, Seq, SinkStatus, SinkStore,
    StreamId, projection_consumer,
};
use serde::Serialize;

use crate::outbox::{AppendOutcome, JournalBackend, Outbox, ProjectionBackend};

/// What to wait for: the last seq an append wrote on each of its streams.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AppendToken {
    /// (stream, seq): applied once each projection's checkpoint of the
    /// stream is at the seq or past it.
    pub positions: Vec<(StreamId, Seq)>,
}

impl AppendToken {
    /// The token of one stream and seq (an event written elsewhere).
    pub fn at(stream: StreamId, seq: Seq) -> Self {
        AppendToken {
            positions: vec![(stream, seq)],
        }
    }

    /// The token of what a journal append returned.
    pub fn of(appended: &[Appended]) -> Self {
        AppendToken {
            positions: appended.iter().map(|a| (a.stream.clone(), a.last_seq)).collect(),
        }
    }
}

impl AppendOutcome {
    /// What to pass to [`Outbox::wait_for`] to read this append's writes.
    pub fn token(&self) -> AppendToken {
        AppendToken::of(&self.appended)
    }
}

/// Where a token stands for one projection, when it is not applied yet.
enum Standing {
    /// It will not get there without an operator: dead there, or paused.
    Blocked(String),
    /// It is on its way (or failing and retried): what it waits on.
    Waiting(String),
}

/// The longest pause between two reads of a waiter that no apply of its
/// own process wakes.
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// How long a waiter with a progress source waits for it before reading
/// the checkpoints anyway (a missed or failed wake-up costs at most this).
const SAFETY_NET: Duration = Duration::from_secs(1);

impl<J: JournalBackend, P: ProjectionBackend> Outbox<J, P> {
    /// Waits until `projections` (every registered projection of this
    /// runtime when `None`) have applied every position of `token`, at most
    /// `timeout`.
    ///
    /// - `Ok(())`: each has applied through each position.
    /// - `InvalidState` at once when one cannot get there without an
    ///   operator: it is dead on that stream (requeue it) or paused (resume
    ///   it); the message names the projection, the stream and why.
    /// - A temporary `Storage` error when `timeout` passes first, naming
    ///   the first projection still behind and whether it is failing.
    /// - `NotFound` for a projection this runtime does not have.
    pub async fn wait_for(
        &self,
        token: &AppendToken,
        projections: Option<&[ProjectionName]>,
        timeout: Duration,
    ) -> Result<()> {
        let names: Vec<ProjectionName> = match projections {
            Some(list) => {
                for p in list {
                    self.projection(p.as_str())?;
                }
                list.to_vec()
            }
            None => self.inner.projections.iter().map(|p| p.name().clone()).collect(),
        };
        let mut progress = self.inner.progress.subscribe();
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(1);
        loop {
            // Marked seen before the reads: an apply committed after them wakes us.
            progress.borrow_and_update();
            let standing = match self.standing(token, &names).await? {
                None => return Ok(()),
                Some(Standing::Blocked(why)) => return Err(Error::InvalidState(why)),
                Some(Standing::Waiting(why)) => why,
            };
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(Error::Storage {
                    message: format!("not applied within {timeout:?}: {standing}"),
                    temporary: true,
                    source: None,
                });
            }
            let source = self.inner.progress_source.as_deref();
            // With a progress source the timer is only the safety net.
            let nap = if source.is_some() { SAFETY_NET } else { backoff };
            tokio::select! {
                changed = progress.changed() => {
                    if changed.is_err() {
                        tokio::time::sleep(backoff.min(left)).await;
                    }
                }
                () = crate::worker::woken_by(source) => {}
                () = tokio::time::sleep(nap.min(left)) => {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// `None` when every projection of `names` has applied every position
    /// of `token`; otherwise one that cannot get there (dead or paused), or
    /// else where the first one behind stands.
    async fn standing(&self, token: &AppendToken, names: &[ProjectionName]) -> Result<Option<Standing>> {
        let mut paused: Option<Vec<String>> = None;
        let mut waiting: Option<String> = None;
        for (stream, seq) in &token.positions {
            for name in names {
                let cp = self.inner.store.checkpoint(name, stream).await?;
                if cp >= seq.get() {
                    continue;
                }
                let key = projection_consumer(name)?;
                let state = self
                    .inner
                    .journal
                    .sink_states(&key, std::slice::from_ref(stream))
                    .await?
                    .remove(0);
                let error = state.last_error.as_deref().unwrap_or("");
                if state.status == SinkStatus::Dead {
                    return Ok(Some(Standing::Blocked(format!(
                        "projection {name} is dead on {stream}/{} after {} attempt(s), short of {stream}/{seq}: \
                         {error} (requeue it after the fix)",
                        state.seq + 1,
                        state.attempt_count
                    ))));
                }
                if paused.is_none() {
                    let all = self.inner.journal.consumers().await?;
                    paused = Some(
                        all.iter()
                            .filter(|c| c.paused)
                            .filter_map(|c| c.projection().map(str::to_owned))
                            .collect(),
                    );
                }
                if paused
                    .as_ref()
                    .is_some_and(|p| p.iter().any(|p| p == name.as_str()))
                {
                    return Ok(Some(Standing::Blocked(format!(
                        "projection {name} is paused, at {stream}/{cp} short of {stream}/{seq} (resume it)"
                    ))));
                }
                if waiting.is_some() {
                    continue;
                }
                waiting = Some(if state.status == SinkStatus::Failed && state.attempt_count > 0 {
                    format!(
                        "projection {name} is failing on {stream}/{} ({} attempt(s), next at {}): {error}",
                        state.seq + 1,
                        state.attempt_count,
                        state.next_attempt_at
                    )
                } else {
                    format!("projection {name} is at {stream}/{cp}, short of {stream}/{seq}")
                });
            }
        }
        Ok(waiting.map(Standing::Waiting))
    }
}
