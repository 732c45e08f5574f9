//! [`WorkerRegistry`] contract checks: heartbeats by the store's clock,
//! expiry, deregistration, pruning, the ttl range, the listing order and the
//! per-minute activity.

use std::time::Duration;

use outbox_core::{
    ActivityCounts, ActivityLog, Error, MAX_ACTIVITY_MINUTES, MAX_LEASE_TTL, MIN_LEASE_TTL, MINUTE_MS,
    MinuteActivity, Mode, Timestamp, WorkerInfo, WorkerRegistry,
};

use super::support::{ms, now, owner, secs};
use crate::Harness;

/// Beats `id` (host `h-<id>`, pid 42, `OutboxApplyOnly`) with `ttl`, which must succeed.
async fn beat<J: WorkerRegistry>(j: &J, id: &str, ttl: Duration) -> WorkerInfo {
    j.heartbeat(&owner(id), &format!("h-{id}"), 42, Mode::OutboxApplyOnly, ttl)
        .await
        .unwrap_or_else(|e| panic!("heartbeat of {id} failed: {e}"))
}

/// The ids `workers` lists, in its order.
async fn listed<J: WorkerRegistry>(j: &J) -> Vec<String> {
    j.workers()
        .await
        .expect("workers")
        .into_iter()
        .map(|w| w.id.to_string())
        .collect()
}

/// `heartbeat`: the first beat inserts the worker as given, with
/// `started_at = last_beat = now` and `expires_at = now + ttl` by the store's
/// clock; `workers` lists it exactly as returned (every [`Mode`], a pid up to
/// `u32::MAX` and any host text round-trip).
pub async fn registry_heartbeat_inserts_worker<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let modes = Mode::ALL;
    let ttl = secs(30);
    let mut returned = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let id = owner(&format!("w-{i}"));
        let host = format!("host-{i}.example, ünïcode");
        let pid = if i == 0 { u32::MAX } else { 1000 + i as u32 };
        let before = now(j).await;
        let w = j.heartbeat(&id, &host, pid, mode, ttl).await.expect("heartbeat");
        let after = now(j).await;
        assert_eq!(
            (&w.id, w.host.as_str(), w.pid, w.mode),
            (&id, host.as_str(), pid, mode),
            "heartbeat returns the worker as given"
        );
        assert_eq!(w.started_at, w.last_beat, "a first beat starts the worker now");
        assert!(
            before <= w.last_beat && w.last_beat <= after,
            "last_beat {} is not the store's now (in [{before}, {after}])",
            w.last_beat
        );
        assert_eq!(
            w.expires_at,
            w.last_beat.saturating_add(ttl),
            "expires_at is last_beat + ttl"
        );
        returned.push(w);
    }
    assert_eq!(
        j.workers().await.expect("workers"),
        returned,
        "workers lists every live entry as heartbeat returned it"
    );
}

/// `heartbeat`: a later beat refreshes the entry, `last_beat = now` and
/// `expires_at = now + ttl` by the store's clock, and keeps `started_at` from
/// the first beat.
pub async fn registry_heartbeat_refresh_keeps_started_at<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let first = beat(j, "w", secs(30)).await;
    h.advance(&f.ctx, secs(10)).await;
    let before = now(j).await;
    let again = beat(j, "w", secs(60)).await;
    let after = now(j).await;
    assert_eq!(again.started_at, first.started_at, "started_at is kept");
    assert!(
        again.last_beat >= first.last_beat.saturating_add(secs(10)),
        "last_beat moved with the store's clock: {} -> {}",
        first.last_beat,
        again.last_beat
    );
    assert!(
        before <= again.last_beat && again.last_beat <= after,
        "last_beat {} is not the store's now (in [{before}, {after}])",
        again.last_beat
    );
    assert_eq!(
        again.expires_at,
        again.last_beat.saturating_add(secs(60)),
        "expires_at is the new last_beat + the new ttl"
    );
    assert_eq!(
        j.workers().await.expect("workers"),
        vec![again.clone()],
        "one entry per id, as refreshed"
    );
    // The refreshed expiry holds past the first beat's expiry.
    h.advance(&f.ctx, secs(40)).await;
    assert_eq!(listed(j).await, ["w"], "listed past the first beat's expiry");
}

/// `workers`: an entry whose `expires_at` has passed by the store's clock is
/// not listed; a live one is; beating the expired one again lists it again.
pub async fn registry_expired_workers_are_not_listed<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    beat(j, "short", secs(5)).await;
    beat(j, "long", secs(60)).await;
    assert_eq!(listed(j).await, ["long", "short"], "both live");
    h.advance(&f.ctx, secs(5) + ms(1)).await;
    assert_eq!(listed(j).await, ["long"], "the expired entry is not listed");
    let back = beat(j, "short", secs(5)).await;
    assert!(
        back.expires_at > now(j).await,
        "a new beat makes the entry live again"
    );
    assert_eq!(
        listed(j).await,
        ["long", "short"],
        "listed again after a new beat"
    );
    h.advance(&f.ctx, secs(60)).await;
    assert!(listed(j).await.is_empty(), "every entry expired");
}

/// `deregister`: removes the entry and returns `true`; `false` for an id with
/// no entry (never registered, or already removed). An expired entry that was
/// not pruned still exists.
pub async fn registry_deregister_returns_whether_it_existed<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    beat(j, "a", secs(30)).await;
    beat(j, "b", secs(30)).await;
    assert!(j.deregister(&owner("a")).await.expect("deregister"), "a existed");
    assert_eq!(listed(j).await, ["b"], "only a was removed");
    assert!(
        !j.deregister(&owner("a")).await.expect("deregister"),
        "a no longer exists"
    );
    assert!(
        !j.deregister(&owner("never")).await.expect("deregister"),
        "never registered"
    );
    beat(j, "gone", ms(10)).await;
    h.advance(&f.ctx, secs(1)).await;
    assert_eq!(listed(j).await, ["b"], "gone expired");
    assert!(
        j.deregister(&owner("gone")).await.expect("deregister"),
        "an expired, unpruned entry still existed"
    );
    assert_eq!(
        j.prune(Duration::ZERO).await.expect("prune"),
        0,
        "deregistered entries are gone"
    );
}

/// `prune`: deletes the entries that expired more than `grace` ago, by the
/// store's clock, and returns how many; recently expired and live entries stay.
pub async fn registry_prune_deletes_only_long_expired<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    beat(j, "old", secs(10)).await;
    let started = beat(j, "recent", secs(60)).await.started_at;
    beat(j, "live", secs(200)).await;
    assert_eq!(
        j.prune(Duration::ZERO).await.expect("prune"),
        0,
        "nothing expired yet"
    );
    h.advance(&f.ctx, secs(70)).await;
    // old expired ~60 s ago, recent ~10 s ago, live in ~130 s.
    assert_eq!(
        j.prune(secs(30)).await.expect("prune"),
        1,
        "only the entry expired more than 30 s ago"
    );
    assert_eq!(
        j.prune(secs(30)).await.expect("prune"),
        0,
        "pruning again finds nothing"
    );
    assert!(
        !j.deregister(&owner("old")).await.expect("deregister"),
        "old was pruned"
    );
    assert_eq!(
        beat(j, "recent", secs(60)).await.started_at,
        started,
        "the recently expired entry survived the prune (its started_at is kept)"
    );
    let live = j.workers().await.expect("workers");
    assert!(
        live.iter().any(|w| w.id == owner("live")),
        "the live entry survived the prune: {live:?}"
    );
    assert!(
        j.deregister(&owner("recent")).await.expect("deregister"),
        "recent existed"
    );
    assert_eq!(
        j.prune(Duration::ZERO).await.expect("prune"),
        0,
        "a live entry is never pruned"
    );
    assert_eq!(listed(j).await, ["live"]);
}

/// `heartbeat`: a `ttl` outside the lease TTL range is `InvalidInput` and
/// registers nothing; the bounds themselves are accepted.
pub async fn registry_ttl_out_of_range_is_invalid_input<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    for ttl in [
        Duration::ZERO,
        MIN_LEASE_TTL - ms(1),
        MAX_LEASE_TTL + ms(1),
        Duration::MAX,
    ] {
        let r = j.heartbeat(&owner("w"), "h", 1, Mode::OutboxApplyOnly, ttl).await;
        assert!(matches!(r, Err(Error::InvalidInput(_))), "ttl {ttl:?}: {r:?}");
    }
    assert!(listed(j).await.is_empty(), "a rejected beat registers nothing");
    assert!(
        !j.deregister(&owner("w")).await.expect("deregister"),
        "not even an expired entry"
    );
    for ttl in [MIN_LEASE_TTL, MAX_LEASE_TTL] {
        let w = beat(j, "w", ttl).await;
        assert_eq!(
            w.expires_at,
            w.last_beat.saturating_add(ttl),
            "ttl {ttl:?} is accepted"
        );
    }
}

/// `workers`: ordered by id (byte order, as [`WorkerId`](outbox_core::WorkerId)
/// orders), whatever the order of registration.
pub async fn registry_workers_ordered_by_id<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    for id in ["w-c", "w-a", "W-z", "w-b", "w-a-1", "10", "9"] {
        beat(j, id, secs(30)).await;
    }
    let mut want = vec!["w-c", "w-a", "W-z", "w-b", "w-a-1", "10", "9"];
    want.sort_unstable();
    assert_eq!(
        want,
        ["10", "9", "W-z", "w-a", "w-a-1", "w-b", "w-c"],
        "byte order"
    );
    assert_eq!(listed(j).await, want, "workers are ordered by id");
}

/// `heartbeat`: while an entry is live (unexpired by the store's clock), a
/// beat for its id from another (host, pid) is `InvalidState` naming the id,
/// the holder's host and pid, and changes nothing; the holder's own beats go
/// on working (its mode may change). Once the entry expired, or after
/// `deregister`, another process may take the id.
pub async fn registry_heartbeat_refuses_a_second_live_holder<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let id = owner("w");
    let ttl = secs(30);
    let first = j
        .heartbeat(&id, "host-a", 1111, Mode::OutboxApplyOnly, ttl)
        .await
        .expect("first beat");
    for (host, pid) in [("host-b", 1111), ("host-a", 2222), ("host-b", 2222)] {
        let r = j.heartbeat(&id, host, pid, Mode::OutboxApplyOnly, ttl).await;
        match r {
            Err(Error::InvalidState(m)) => assert!(
                m.contains("`w`") && m.contains("host-a") && m.contains("1111"),
                "the refusal names the id and the live holder: {m}"
            ),
            other => panic!("a beat from {host}/{pid} while w is live must be refused: {other:?}"),
        }
    }
    assert_eq!(
        j.workers().await.expect("workers"),
        vec![first.clone()],
        "a refused beat changes nothing"
    );
    h.advance(&f.ctx, secs(10)).await;
    let again = j
        .heartbeat(&id, "host-a", 1111, Mode::ShadowOnly, ttl)
        .await
        .expect("the holder's own re-beat");
    assert_eq!(
        (again.mode, again.started_at),
        (Mode::ShadowOnly, first.started_at),
        "the holder re-beats, changing its mode"
    );
    h.advance(&f.ctx, ttl + ms(1)).await;
    let taken = j
        .heartbeat(&id, "host-b", 2222, Mode::OutboxApplyOnly, ttl)
        .await
        .expect("an expired entry's id may be taken");
    assert_eq!((taken.host.as_str(), taken.pid), ("host-b", 2222));
    assert!(
        matches!(
            j.heartbeat(&id, "host-a", 1111, Mode::OutboxApplyOnly, ttl).await,
            Err(Error::InvalidState(_))
        ),
        "the old holder is now refused"
    );
    assert!(j.deregister(&id).await.expect("deregister"));
    let back = j
        .heartbeat(&id, "host-a", 1111, Mode::OutboxApplyOnly, ttl)
        .await
        .expect("a deregistered id may be taken at once");
    assert_eq!((back.host.as_str(), back.pid), ("host-a", 1111));
}

/// Moves the store's clock to one second into the next minute and returns
/// that minute's start, so the calls that follow (well under 58 s of real
/// time) fall in one minute bucket.
async fn start_of_a_minute<H: Harness>(h: &H, f: &crate::Fixture<H>) -> Timestamp {
    let t = now(&f.journal).await.as_millis();
    let into = t.rem_euclid(MINUTE_MS);
    h.advance(&f.ctx, ms((MINUTE_MS - into + 1000) as u64)).await;
    let t = now(&f.journal).await.as_millis();
    Timestamp::from_millis(t - t.rem_euclid(MINUTE_MS))
}

/// Records `c` for worker `who`, which must succeed.
async fn record<J: ActivityLog>(j: &J, who: &str, c: ActivityCounts) {
    j.record_activity(&owner(who), c)
        .await
        .unwrap_or_else(|e| panic!("record_activity of {who} failed: {e}"));
}

fn counts(applied: u64, failed: u64, dead: u64) -> ActivityCounts {
    ActivityCounts {
        applied,
        failed,
        dead,
    }
}

/// `record_activity` adds to (current minute, worker); `activity` sums the
/// workers per minute, oldest first, and reports the current minute by the
/// store's clock; empty counts write nothing.
pub async fn registry_activity_sums_workers_per_minute<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let first = start_of_a_minute(h, &f).await;
    record(j, "a", counts(3, 1, 0)).await;
    record(j, "b", counts(4, 0, 1)).await;
    record(j, "a", counts(2, 0, 0)).await;
    let got = j.activity(60).await.expect("activity");
    assert_eq!(
        got.current_minute, first,
        "the current minute by the store's clock"
    );
    assert_eq!(
        got.minutes,
        vec![MinuteActivity {
            minute: first,
            counts: counts(9, 1, 1)
        }],
        "both workers' buckets summed in their minute"
    );
    h.advance(&f.ctx, ms(MINUTE_MS as u64)).await;
    let second = Timestamp::from_millis(first.as_millis() + MINUTE_MS);
    record(j, "b", counts(5, 2, 0)).await;
    j.record_activity(&owner("c"), ActivityCounts::default())
        .await
        .expect("empty counts are accepted");
    let got = j.activity(60).await.expect("activity");
    assert_eq!(got.current_minute, second);
    assert_eq!(
        got.minutes,
        vec![
            MinuteActivity {
                minute: first,
                counts: counts(9, 1, 1)
            },
            MinuteActivity {
                minute: second,
                counts: counts(5, 2, 0)
            },
        ],
        "one entry per minute with activity, oldest first"
    );
    let filled = got.filled(3);
    assert_eq!(filled.len(), 3);
    assert_eq!(
        filled[0].counts,
        ActivityCounts::default(),
        "a minute without activity fills as zeros"
    );
    assert_eq!((filled[1].minute, filled[2].minute), (first, second));
}

/// `activity(n)` covers the last `n` minutes, the current one included;
/// `n` of 0 or above the maximum is `InvalidInput`.
pub async fn registry_activity_window_and_range<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let first = start_of_a_minute(h, &f).await;
    record(j, "a", counts(1, 0, 0)).await;
    h.advance(&f.ctx, ms(3 * MINUTE_MS as u64)).await;
    let got = j.activity(3).await.expect("activity");
    assert_eq!(got.current_minute.as_millis(), first.as_millis() + 3 * MINUTE_MS);
    assert!(
        got.minutes.is_empty(),
        "a minute 3 minutes back is outside a 3-minute window: {:?}",
        got.minutes
    );
    let got = j.activity(4).await.expect("activity");
    assert_eq!(
        got.minutes,
        vec![MinuteActivity {
            minute: first,
            counts: counts(1, 0, 0)
        }],
        "and inside a 4-minute window"
    );
    for bad in [0, MAX_ACTIVITY_MINUTES + 1] {
        assert!(
            matches!(j.activity(bad).await, Err(Error::InvalidInput(_))),
            "a window of {bad} minutes is invalid input"
        );
    }
    assert!(
        j.activity(MAX_ACTIVITY_MINUTES).await.is_ok(),
        "the maximum window is accepted"
    );
}

/// `prune(grace)` deletes the activity minutes that ended `grace` or more
/// ago and keeps the newer ones.
pub async fn registry_prune_deletes_old_activity<H: Harness>(h: &H) {
    let f = h.open().await;
    let j = &f.journal;
    let first = start_of_a_minute(h, &f).await;
    record(j, "a", counts(1, 0, 0)).await;
    h.advance(&f.ctx, ms(2 * MINUTE_MS as u64)).await;
    record(j, "a", counts(2, 0, 0)).await;
    // Now: 2 min 1 s past `first`; its minute ended 61 s ago, the current one not yet.
    j.prune(secs(120)).await.expect("prune");
    assert_eq!(
        j.activity(10).await.expect("activity").minutes.len(),
        2,
        "a minute that ended 61 s ago survives a 120 s grace"
    );
    j.prune(secs(30)).await.expect("prune");
    let left = j.activity(10).await.expect("activity").minutes;
    assert_eq!(
        left,
        vec![MinuteActivity {
            minute: Timestamp::from_millis(first.as_millis() + 2 * MINUTE_MS),
            counts: counts(2, 0, 0)
        }],
        "the minute that ended 61 s ago is pruned with a 30 s grace, the current one kept"
    );
}
