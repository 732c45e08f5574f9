//! Named crash points for the crash harness (`cargo xtask crash`).
//!
//! [`failpoint`] compiles to nothing unless the `failpoints` feature is on,
//! which only the crash harness (`outbox-crash`) enables: production builds
//! never do. With it, `OUTBOX_CRASH_AT=name:N` (read once) makes the N-th
//! hit of point `name` in this process call [`std::process::abort`]: like a
//! `kill -9` at that exact instruction, with no destructor, no rollback and
//! no flush.
//!
//! The points: `after_claim` (a claim returned rows), `after_apply` (the
//! projection transaction committed, the rows are not completed yet),
//! `after_complete` (the rows are completed) in the worker, and
//! `after_append` (the journal append committed, nothing applied inline and
//! nothing returned to the caller yet) in [`crate::Outbox::append_batch`].
//! A generation build ([`crate::Outbox::rebuild_blue_green`],
//! [`crate::Outbox::promote`]) has its own: `build_page` (a page committed,
//! its position not recorded), `build_position` (recorded), `before_swap`
//! and `after_swap` (the swap committed, nothing reported yet).

/// The named points, for the harness to choose from (`FAILPOINTS` at the
/// crate root, with the feature).
#[cfg(any(feature = "failpoints", test))]
#[cfg_attr(not(feature = "failpoints"), allow(unreachable_pub))]
pub const POINTS: &[&str] = &["after_claim", "after_apply", "after_complete", "after_append"];

/// The named points of a generation build.
#[cfg(any(feature = "failpoints", test))]
#[cfg_attr(not(feature = "failpoints"), allow(unreachable_pub))]
pub const GENERATION_POINTS: &[&str] = &["build_page", "build_position", "before_swap", "after_swap"];

/// A crash point: aborts the process on the configured hit when the
/// `failpoints` feature is on; nothing at all otherwise.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn failpoint(_name: &'static str) {}

/// A crash point: aborts the process on the configured hit of `name`
/// (`OUTBOX_CRASH_AT=name:N`, counted from 1).
#[cfg(feature = "failpoints")]
pub(crate) fn failpoint(name: &'static str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((point, n)) = TARGET.get_or_init(|| parse(std::env::var("OUTBOX_CRASH_AT").ok().as_deref()))
    else {
        return;
    };
    if point != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n {
        // stderr is unbuffered: the line is out before the abort.
        eprintln!("failpoint {name}:{n} hit: aborting");
        std::process::abort();
    }
}

/// `name:N` (N ≥ 1) as (name, N); anything else (unset, empty, malformed)
/// is no crash point. A malformed value is said once on stderr.
#[cfg(any(feature = "failpoints", test))]
fn parse(value: Option<&str>) -> Option<(String, u64)> {
    let value = value?.trim();
    if value.is_empty() {
        return None;
    }
    let parsed = value
        .rsplit_once(':')
        .and_then(|(name, n)| Some((name, n.parse::<u64>().ok()?)))
        .filter(|(name, n)| *n >= 1 && (POINTS.contains(name) || GENERATION_POINTS.contains(name)));
    if parsed.is_none() {
        eprintln!("OUTBOX_CRASH_AT={value:?} is not `point:N` with a known point and N >= 1: ignored");
    }
    parsed.map(|(name, n)| (name.to_owned(), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_point_and_a_count() {
        assert_eq!(parse(Some("after_apply:3")), Some(("after_apply".into(), 3)));
        assert_eq!(parse(None), None);
        assert_eq!(parse(Some("")), None);
        assert_eq!(parse(Some("after_apply")), None);
        assert_eq!(parse(Some("after_apply:0")), None);
        assert_eq!(parse(Some("nowhere:1")), None);
        assert_eq!(parse(Some("before_swap:1")), Some(("before_swap".into(), 1)));
    }
}
