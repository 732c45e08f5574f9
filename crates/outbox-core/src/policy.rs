//! Pure policies: retry backoff, dead-letter threshold, mode selection.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Exponential backoff with a cap, and a dead-letter threshold.
///
/// The delay before retry number `n` (after the `n`-th consecutive failure) is
/// `min(base * 2^(n-1), cap)`; the row is dead-lettered on failure number
/// `dead_letter_after`. Defaults: base 1 s, cap 5 min, dead after 8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
    dead_letter_after: u32,
}

/// What to do with a row that has just failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureDecision {
    /// Retry after this delay.
    Retry(Duration),
    /// The threshold is reached: park the row as dead.
    DeadLetter,
}

impl RetryPolicy {
    /// The longest cap accepted: one day. Longer waits hide outages.
    pub const MAX_CAP: Duration = Duration::from_secs(86_400);
    /// The largest threshold accepted.
    pub const MAX_THRESHOLD: u32 = 1_000;

    /// A validated policy.
    ///
    /// Rejects a zero or sub-millisecond base, a cap below the base or above
    /// [`Self::MAX_CAP`], and a threshold outside `1..=MAX_THRESHOLD`.
    pub fn new(base: Duration, cap: Duration, dead_letter_after: u32) -> Result<Self> {
        if base < Duration::from_millis(1) {
            return Err(Error::Config(format!(
                "retry base delay must be at least 1ms, got {base:?}"
            )));
        }
        if cap < base {
            return Err(Error::Config(format!(
                "retry cap {cap:?} is below the base delay {base:?}"
            )));
        }
        if cap > Self::MAX_CAP {
            return Err(Error::Config(format!(
                "retry cap {cap:?} is above the maximum of {:?}",
                Self::MAX_CAP
            )));
        }
        if dead_letter_after == 0 || dead_letter_after > Self::MAX_THRESHOLD {
            return Err(Error::Config(format!(
                "dead-letter threshold must be between 1 and {}, got {dead_letter_after}",
                Self::MAX_THRESHOLD
            )));
        }
        Ok(RetryPolicy {
            base,
            cap,
            dead_letter_after,
        })
    }

    /// The same policy with another cap (validated).
    pub fn with_cap(self, cap: Duration) -> Result<Self> {
        Self::new(self.base, cap, self.dead_letter_after)
    }

    /// The same policy with another threshold (validated).
    pub fn with_dead_letter_after(self, n: u32) -> Result<Self> {
        Self::new(self.base, self.cap, n)
    }

    /// The base delay.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The cap.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// Failures after which a row is dead.
    pub fn dead_letter_after(&self) -> u32 {
        self.dead_letter_after
    }

    /// The delay after failure number `attempt` (1-based; 0 is treated as 1).
    /// Never panics or overflows: large attempts give the cap.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.max(1) - 1;
        let factor = 1u32.checked_shl(exp).filter(|_| exp < 32);
        factor
            .and_then(|f| self.base.checked_mul(f))
            .map_or(self.cap, |d| d.min(self.cap))
    }

    /// The decision after failure number `attempt` (the row's attempt count
    /// including this failure).
    pub fn decide(&self, attempt: u32) -> FailureDecision {
        if attempt >= self.dead_letter_after {
            FailureDecision::DeadLetter
        } else {
            FailureDecision::Retry(self.delay(attempt))
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            dead_letter_after: 8,
        }
    }
}

/// The start-up flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModeFlags {
    /// `OUTBOX_ENABLED`: appends enqueue outbox rows.
    pub outbox: bool,
    /// `OUTBOX_WORKER_ENABLED`: run the apply worker.
    pub apply_worker: bool,
    /// `OUTBOX_SHADOW_WORKER_ENABLED`: run the shadow worker.
    pub shadow_worker: bool,
    /// `OUTBOX_INLINE_APPLY` (default true): the append call may apply
    /// projections. Off with the outbox on and no worker is
    /// [`Mode::ProducerOnly`].
    #[serde(default = "yes")]
    pub inline_apply: bool,
}

fn yes() -> bool {
    true
}

impl Default for ModeFlags {
    /// Outbox off, no worker, inline apply allowed ([`Mode::InlineApplyOnly`]).
    fn default() -> Self {
        ModeFlags {
            outbox: false,
            apply_worker: false,
            shadow_worker: false,
            inline_apply: true,
        }
    }
}

/// How projections are kept up to date (see ADR 0002).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No outbox: the append call applies projections inline. No worker.
    InlineApplyOnly,
    /// Outbox on, no worker: the append enqueues, applies inline and deletes
    /// the rows it applied; rows whose inline apply failed stay for a worker,
    /// `outbox work --once` or gap repair.
    OutboxInline,
    /// Outbox on, apply worker on: the worker is the only path that applies.
    OutboxApplyOnly,
    /// Outbox on, shadow worker on: projections are applied inline (rows are
    /// kept); the shadow worker claims, loads and completes rows with full
    /// lease, retry and dead-letter bookkeeping, and never mutates projections.
    ShadowOnly,
    /// Outbox on, no worker, no inline apply: the process only appends (ADR
    /// 0002). Its rows wait for an apply worker in another process; it
    /// starts no task and does no start-up repair.
    ProducerOnly,
}

impl Mode {
    /// Every mode.
    pub const ALL: [Mode; 5] = [
        Mode::InlineApplyOnly,
        Mode::OutboxInline,
        Mode::OutboxApplyOnly,
        Mode::ShadowOnly,
        Mode::ProducerOnly,
    ];
    /// Whether appends insert outbox rows.
    pub const fn enqueues(self) -> bool {
        !matches!(self, Mode::InlineApplyOnly)
    }
    /// Whether the append call applies projections on the request path.
    pub const fn applies_inline(self) -> bool {
        !matches!(self, Mode::OutboxApplyOnly | Mode::ProducerOnly)
    }
    /// Whether a successful inline apply deletes the rows it applied.
    pub const fn inline_deletes_rows(self) -> bool {
        matches!(self, Mode::OutboxInline)
    }
    /// Whether the apply worker runs.
    pub const fn runs_apply_worker(self) -> bool {
        matches!(self, Mode::OutboxApplyOnly)
    }
    /// Whether the shadow worker runs.
    pub const fn runs_shadow_worker(self) -> bool {
        matches!(self, Mode::ShadowOnly)
    }
    /// The stable name used in logs and JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::InlineApplyOnly => "inline_apply_only",
            Mode::OutboxInline => "outbox_inline",
            Mode::OutboxApplyOnly => "outbox_apply_only",
            Mode::ShadowOnly => "shadow_only",
            Mode::ProducerOnly => "producer_only",
        }
    }
    /// The inverse of [`Mode::as_str`].
    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of [`select_mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModeSelection {
    /// The mode.
    pub mode: Mode,
    /// True when both workers were enabled and the shadow worker was turned
    /// off because the apply worker takes precedence (worth a warning).
    pub shadow_overridden: bool,
}

/// Resolves the start-up flags to a [`Mode`].
///
/// | outbox | apply worker | shadow worker | mode |
/// |---|---|---|---|
/// | off | off | off | [`Mode::InlineApplyOnly`] |
/// | off | on or shadow on | | error: a worker needs the outbox |
/// | on | off | off | [`Mode::OutboxInline`] |
/// | on | on | any | [`Mode::OutboxApplyOnly`] (shadow overridden if on) |
/// | on | off | on | [`Mode::ShadowOnly`] |
///
/// `inline_apply` (on by default) matters only where the mode would apply
/// inline: off with the outbox on and no worker is [`Mode::ProducerOnly`];
/// off with the outbox off, or with only the shadow worker (which needs
/// inline apply), is an error. The apply worker never applies inline, so
/// there it is ignored.
pub fn select_mode(flags: ModeFlags) -> Result<ModeSelection> {
    let ModeFlags {
        outbox,
        apply_worker,
        shadow_worker,
        inline_apply,
    } = flags;
    if !outbox && (apply_worker || shadow_worker) {
        let which = match (apply_worker, shadow_worker) {
            (true, true) => "OUTBOX_WORKER_ENABLED and OUTBOX_SHADOW_WORKER_ENABLED are",
            (true, false) => "OUTBOX_WORKER_ENABLED is",
            _ => "OUTBOX_SHADOW_WORKER_ENABLED is",
        };
        return Err(Error::Config(format!(
            "{which} set but OUTBOX_ENABLED is not: workers drain outbox rows, so the outbox must be enabled"
        )));
    }
    if !inline_apply && !apply_worker && (!outbox || shadow_worker) {
        let why = if outbox {
            "the shadow worker checks rows while the append call applies, so it needs inline apply"
        } else {
            "nothing would apply the events or record them for a worker (set OUTBOX_ENABLED for a producer-only process)"
        };
        return Err(Error::Config(format!("OUTBOX_INLINE_APPLY is false but {why}")));
    }
    let mode = match (outbox, apply_worker, shadow_worker) {
        (false, _, _) => Mode::InlineApplyOnly,
        (true, true, _) => Mode::OutboxApplyOnly,
        (true, false, true) => Mode::ShadowOnly,
        (true, false, false) if !inline_apply => Mode::ProducerOnly,
        (true, false, false) => Mode::OutboxInline,
    };
    Ok(ModeSelection {
        mode,
        shadow_overridden: apply_worker && shadow_worker,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_schedule_matches_the_source_documents() {
        let p = RetryPolicy::default();
        let secs: Vec<u64> = (1..=10).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(p.delay(0), Duration::from_secs(1));
        for n in 1..8 {
            assert_eq!(p.decide(n), FailureDecision::Retry(p.delay(n)));
        }
        assert_eq!(p.decide(8), FailureDecision::DeadLetter);
        assert_eq!(p.decide(u32::MAX), FailureDecision::DeadLetter);
    }

    #[test]
    fn constructor_rejects_nonsense() {
        let s = Duration::from_secs;
        assert!(RetryPolicy::new(Duration::ZERO, s(1), 8).is_err());
        assert!(RetryPolicy::new(Duration::from_micros(10), s(1), 8).is_err());
        assert!(RetryPolicy::new(s(2), s(1), 8).is_err());
        assert!(RetryPolicy::new(s(1), s(86_401), 8).is_err());
        assert!(RetryPolicy::new(s(1), s(1), 0).is_err());
        assert!(RetryPolicy::new(s(1), s(1), 1001).is_err());
        assert!(RetryPolicy::new(s(1), s(1), 1).is_ok());
        assert!(RetryPolicy::default().with_cap(s(0)).is_err());
    }

    /// Every one of the 8 flag combinations, spelled out.
    #[test]
    fn mode_table() {
        use Mode::*;
        let cases = [
            ((false, false, false), Some((InlineApplyOnly, false))),
            ((false, true, false), None),
            ((false, false, true), None),
            ((false, true, true), None),
            ((true, false, false), Some((OutboxInline, false))),
            ((true, true, false), Some((OutboxApplyOnly, false))),
            ((true, false, true), Some((ShadowOnly, false))),
            ((true, true, true), Some((OutboxApplyOnly, true))),
        ];
        for ((outbox, apply_worker, shadow_worker), want) in cases {
            let got = select_mode(ModeFlags {
                outbox,
                apply_worker,
                shadow_worker,
                inline_apply: true,
            });
            match want {
                Some((mode, overridden)) => {
                    let sel = got.unwrap();
                    assert_eq!((sel.mode, sel.shadow_overridden), (mode, overridden));
                }
                None => {
                    let msg = got.unwrap_err().to_string();
                    assert!(msg.contains("OUTBOX_ENABLED is not"), "{msg}");
                }
            }
        }
    }

    /// The same eight combinations with inline apply off.
    #[test]
    fn mode_table_without_inline_apply() {
        use Mode::*;
        let cases = [
            ((false, false, false), Err("nothing would apply")),
            ((false, true, false), Err("OUTBOX_ENABLED is not")),
            ((false, false, true), Err("OUTBOX_ENABLED is not")),
            ((false, true, true), Err("OUTBOX_ENABLED is not")),
            ((true, false, false), Ok(ProducerOnly)),
            ((true, true, false), Ok(OutboxApplyOnly)),
            ((true, false, true), Err("needs inline apply")),
            ((true, true, true), Ok(OutboxApplyOnly)),
        ];
        for ((outbox, apply_worker, shadow_worker), want) in cases {
            let got = select_mode(ModeFlags {
                outbox,
                apply_worker,
                shadow_worker,
                inline_apply: false,
            });
            match want {
                Ok(mode) => assert_eq!(got.unwrap().mode, mode),
                Err(part) => {
                    let msg = got.unwrap_err().to_string();
                    assert!(msg.contains(part) && !msg.contains('\n'), "{msg}");
                }
            }
        }
        assert_eq!(Mode::parse("producer_only"), Some(ProducerOnly));
    }

    #[test]
    fn mode_properties_are_consistent() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.as_str()), Some(m));
            // At most one worker; every mode but the producer-only one has
            // some path in this process that applies projections.
            assert!(!(m.runs_apply_worker() && m.runs_shadow_worker()));
            assert_eq!(
                m.applies_inline() || m.runs_apply_worker(),
                m != Mode::ProducerOnly,
                "{m}"
            );
            // Without an outbox there are no rows to delete or drain.
            if !m.enqueues() {
                assert!(!m.inline_deletes_rows() && !m.runs_apply_worker() && !m.runs_shadow_worker());
            }
        }
    }

    proptest! {
        #[test]
        fn delay_is_monotone_capped_and_total(
            base_ms in 1u64..10_000,
            extra_ms in 0u64..86_000_000,
            threshold in 1u32..=1000,
            a in any::<u32>(),
            b in any::<u32>(),
        ) {
            let base = Duration::from_millis(base_ms);
            let cap = Duration::from_millis((base_ms + extra_ms).min(86_400_000));
            let p = RetryPolicy::new(base, cap, threshold).unwrap();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(p.delay(lo) <= p.delay(hi));
            prop_assert!(p.delay(a) <= cap);
            prop_assert!(p.delay(a) >= base.min(cap));
            prop_assert_eq!(p.decide(a) == FailureDecision::DeadLetter, a >= threshold);
        }

        #[test]
        fn mode_selection_is_total(outbox: bool, apply_worker: bool, shadow_worker: bool, inline_apply: bool) {
            let r = select_mode(ModeFlags { outbox, apply_worker, shadow_worker, inline_apply });
            let contradiction = !inline_apply && !apply_worker && (!outbox || shadow_worker);
            prop_assert_eq!(r.is_err(), !outbox && (apply_worker || shadow_worker) || contradiction);
            if let Ok(sel) = r {
                prop_assert_eq!(sel.mode.enqueues(), outbox);
                prop_assert_eq!(sel.mode.runs_apply_worker(), outbox && apply_worker);
                prop_assert_eq!(sel.mode == Mode::ProducerOnly, outbox && !apply_worker && !inline_apply);
            }
        }
    }
}
