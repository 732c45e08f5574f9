//! [`LeaseStore`] contract checks: epochs, expiry by the store's clock,
//! renew, release and the ttl range.

use std::sync::Arc;

use outbox_core::{Error, Lease, LeaseStore, MAX_LEASE_TTL, MIN_LEASE_TTL, OutboxInspector, OutboxQueue};

use super::support::{TTL, ms, now, owner, secs, take};
use crate::{Harness, sid};

/// `acquire`: the first lease of a stream has epoch 1, the given owner and
/// expires `ttl` after the store's now.
pub async fn lease_first_acquire_has_epoch_1<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let before = now(&f.journal).await;
    let l = take(&f.journal, &s, "w").await;
    let after = now(&f.journal).await;
    assert_eq!(
        (l.stream.clone(), l.owner.clone(), l.epoch),
        (s.clone(), owner("w"), 1),
        "first lease"
    );
    assert!(
        before.saturating_add(TTL) <= l.expires_at && l.expires_at <= after.saturating_add(TTL),
        "expires_at {} is not the store's now + ttl (now in [{before}, {after}])",
        l.expires_at
    );
    assert_eq!(
        f.journal.lease(&s).await.unwrap(),
        Some(l),
        "`lease` shows the current record"
    );
}

/// `lease`: `None` for a stream never leased.
pub async fn lease_of_unknown_stream_is_none<H: Harness>(h: &H) {
    let f = h.open().await;
    take(&f.journal, &sid("other"), "w").await;
    assert_eq!(f.journal.lease(&sid("s")).await.unwrap(), None);
}

/// `acquire`: `None` while another owner holds an unexpired lease (judged by
/// the store's clock); the holder's lease is unchanged.
pub async fn lease_acquire_refused_while_other_owner_holds_it<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let held = take(&f.journal, &s, "a").await;
    assert_eq!(
        f.journal.acquire(&s, &owner("b"), TTL).await.unwrap(),
        None,
        "held by a"
    );
    h.advance(&f.ctx, TTL - secs(1)).await;
    assert_eq!(
        f.journal.acquire(&s, &owner("b"), TTL).await.unwrap(),
        None,
        "still held just before expiry"
    );
    assert_eq!(
        f.journal.lease(&s).await.unwrap(),
        Some(held),
        "a refused acquire changes nothing"
    );
}

/// `acquire`: the owner re-acquiring its unexpired lease keeps the epoch; only the expiry moves.
pub async fn lease_same_owner_reacquire_keeps_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let first = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, secs(10)).await;
    let stored = f
        .journal
        .lease(&s)
        .await
        .unwrap()
        .expect("the held lease's record");
    let again = take(&f.journal, &s, "w").await;
    assert_eq!(again.epoch, first.epoch, "same owner, same epoch");
    assert!(
        again.expires_at > stored.expires_at,
        "the expiry moved: {} -> {}",
        stored.expires_at,
        again.expires_at
    );
    h.advance(&f.ctx, TTL - secs(5)).await;
    assert_eq!(
        f.journal.acquire(&s, &owner("x"), TTL).await.unwrap(),
        None,
        "the moved expiry still holds"
    );
    assert!(
        f.journal.claim(&first, 1).await.is_ok(),
        "the first lease value is still the current lease"
    );
}

/// `acquire`: after expiry another owner takes over with epoch + 1.
pub async fn lease_takeover_after_expiry_bumps_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "a").await;
    h.advance(&f.ctx, TTL + ms(1)).await;
    let b = take(&f.journal, &s, "b").await;
    assert_eq!(
        (b.owner.clone(), b.epoch),
        (owner("b"), a.epoch + 1),
        "takeover after expiry"
    );
    h.advance(&f.ctx, TTL + secs(1)).await;
    let c = take(&f.journal, &s, "a").await;
    assert_eq!(c.epoch, b.epoch + 1, "every takeover bumps the epoch");
}

/// `acquire`: after release another owner takes over at once with epoch + 1.
pub async fn lease_takeover_after_release_bumps_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "a").await;
    assert!(f.journal.release(&a).await.unwrap());
    let b = take(&f.journal, &s, "b").await;
    assert_eq!(b.epoch, a.epoch + 1, "takeover after release");
}

/// `acquire`: the same owner acquiring again after releasing gets epoch + 1
/// (a released lease is not "already held"), so its old lease value is stale.
pub async fn lease_reacquire_after_release_bumps_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "w").await;
    assert!(f.journal.release(&a).await.unwrap());
    let again = take(&f.journal, &s, "w").await;
    assert_eq!(
        again.epoch,
        a.epoch + 1,
        "re-acquire after release is a new epoch"
    );
    let r = f.journal.claim(&a, 1).await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "the released lease value is stale: {r:?}"
    );
}

/// `acquire`: the same owner acquiring again after its lease expired gets
/// epoch + 1 (an expired lease is not "already held"), so a zombie reusing its
/// owner id is told apart from the new holder.
pub async fn lease_reacquire_after_expiry_bumps_epoch<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let again = take(&f.journal, &s, "w").await;
    assert_eq!(again.epoch, a.epoch + 1, "re-acquire after expiry is a new epoch");
}

/// `renew`: extends an unexpired lease of the same owner and epoch to `now + ttl`.
pub async fn lease_renew_extends_held_lease<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let l = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, TTL - secs(1)).await;
    let before = now(&f.journal).await;
    let r = f.journal.renew(&l, secs(60)).await.expect("renew");
    let after = now(&f.journal).await;
    assert_eq!(
        (r.owner.clone(), r.epoch),
        (l.owner.clone(), l.epoch),
        "renew keeps owner and epoch"
    );
    assert!(
        before.saturating_add(secs(60)) <= r.expires_at && r.expires_at <= after.saturating_add(secs(60)),
        "renewed expiry {} is not now + 60 s (now in [{before}, {after}])",
        r.expires_at
    );
    h.advance(&f.ctx, secs(30)).await;
    assert_eq!(
        f.journal.acquire(&s, &owner("x"), TTL).await.unwrap(),
        None,
        "the renewed lease still holds"
    );
    assert!(f.journal.renew(&r, TTL).await.is_ok(), "renewing again works");
}

/// `renew`: an expired lease is `LeaseLost` (even if nobody took over).
pub async fn lease_renew_of_expired_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let l = take(&f.journal, &s, "w").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let r = f.journal.renew(&l, TTL).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "expired: {r:?}");
}

/// `renew`: another owner's lease, a stale epoch or a released lease is `LeaseLost`.
pub async fn lease_renew_of_other_or_stale_is_lease_lost<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "a").await;
    let r = f
        .journal
        .renew(
            &Lease {
                owner: owner("b"),
                ..a.clone()
            },
            TTL,
        )
        .await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "other owner: {r:?}");
    h.advance(&f.ctx, TTL + secs(1)).await;
    let b = take(&f.journal, &s, "b").await;
    let r = f.journal.renew(&a, TTL).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "stale epoch: {r:?}");
    assert!(f.journal.release(&b).await.unwrap());
    let r = f.journal.renew(&b, TTL).await;
    assert!(matches!(r, Err(Error::LeaseLost { .. })), "released: {r:?}");
    let r = f
        .journal
        .renew(
            &Lease {
                stream: sid("never"),
                ..b
            },
            TTL,
        )
        .await;
    assert!(
        matches!(r, Err(Error::LeaseLost { .. })),
        "a stream never leased: {r:?}"
    );
}

/// `release`: frees the lease held by the same owner and epoch and returns
/// true; a stale, foreign or already released lease returns false, not an
/// error, and leaves the current lease alone.
pub async fn lease_release_reports_whether_it_freed<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "a").await;
    assert!(
        !f.journal
            .release(&Lease {
                owner: owner("b"),
                ..a.clone()
            })
            .await
            .unwrap(),
        "not b's lease"
    );
    assert!(f.journal.release(&a).await.unwrap(), "the holder frees it");
    assert!(
        !f.journal.release(&a).await.unwrap(),
        "releasing twice is false, not an error"
    );
    let b = take(&f.journal, &s, "b").await;
    assert!(
        !f.journal.release(&a).await.unwrap(),
        "a stale lease does not free the new holder's"
    );
    assert_eq!(
        f.journal.acquire(&s, &owner("c"), TTL).await.unwrap(),
        None,
        "b still holds it"
    );
    assert!(f.journal.release(&b).await.unwrap());
}

/// `release`: releasing an expired lease that was taken over is not an error.
pub async fn lease_release_of_lost_lease_is_not_an_error<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let a = take(&f.journal, &s, "a").await;
    h.advance(&f.ctx, TTL + secs(1)).await;
    let b = take(&f.journal, &s, "b").await;
    assert!(
        !f.journal
            .release(&a)
            .await
            .expect("a lost lease's release is not an error")
    );
    assert_eq!(
        f.journal.lease(&s).await.unwrap().map(|l| l.epoch),
        Some(b.epoch),
        "b's lease is untouched"
    );
    let c = f
        .journal
        .release(&Lease {
            stream: sid("never"),
            ..a
        })
        .await;
    assert!(matches!(c, Ok(false)), "a stream never leased: {c:?}");
}

/// Epochs never decrease for a stream, across expiry, release and re-acquire.
pub async fn lease_epochs_never_decrease<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    let mut last = 0;
    for round in 0..6 {
        let who = ["a", "b", "a"][round % 3];
        let l = take(&f.journal, &s, who).await;
        assert!(l.epoch > last, "round {round}: epoch {} after {last}", l.epoch);
        last = l.epoch;
        if round % 2 == 0 {
            assert!(f.journal.release(&l).await.unwrap());
        } else {
            h.advance(&f.ctx, TTL + secs(1)).await;
        }
        // A released lease has no holder, so `lease` may show no record for it.
        if let Some(seen) = f.journal.lease(&s).await.unwrap() {
            assert!(
                seen.epoch >= last,
                "round {round}: the lease record's epoch went back to {} from {last}",
                seen.epoch
            );
        }
    }
    // Another instance on the same database sees the same epochs.
    let other = h.reopen_journal(&f.ctx).await;
    let l = take(&other, &s, "c").await;
    assert_eq!(
        l.epoch,
        last + 1,
        "epochs live in the database, not in an instance"
    );
}

/// A `ttl` outside `MIN_LEASE_TTL..=MAX_LEASE_TTL` is `InvalidInput` for
/// `acquire` and `renew`, and changes nothing; the bounds themselves are accepted.
pub async fn lease_ttl_out_of_range_is_invalid_input<H: Harness>(h: &H) {
    let f = h.open().await;
    let s = sid("s");
    for bad in [ms(0), MIN_LEASE_TTL - ms(1), MAX_LEASE_TTL + ms(1)] {
        let r = f.journal.acquire(&s, &owner("w"), bad).await;
        assert!(
            matches!(r, Err(Error::InvalidInput(_))),
            "acquire with ttl {bad:?}: {r:?}"
        );
    }
    assert_eq!(
        f.journal.lease(&s).await.unwrap(),
        None,
        "refused acquires take no lease"
    );
    // The bounds themselves are accepted. (The MIN_LEASE_TTL lease is taken
    // on another stream: on a SQL store's running clock it may expire before
    // the next statement, so nothing here depends on it staying alive.)
    f.journal
        .acquire(&sid("short"), &owner("w"), MIN_LEASE_TTL)
        .await
        .unwrap()
        .expect("MIN_LEASE_TTL is accepted");
    let l = f
        .journal
        .acquire(&s, &owner("w"), TTL)
        .await
        .unwrap()
        .expect("a free stream is acquired");
    let l = f
        .journal
        .renew(&l, MAX_LEASE_TTL)
        .await
        .expect("MAX_LEASE_TTL is accepted");
    for bad in [ms(0), MAX_LEASE_TTL + secs(1)] {
        let r = f.journal.renew(&l, bad).await;
        assert!(
            matches!(r, Err(Error::InvalidInput(_))),
            "renew with ttl {bad:?}: {r:?}"
        );
    }
    assert_eq!(
        f.journal.lease(&s).await.unwrap(),
        Some(l),
        "refused renews change nothing"
    );
}

/// Two instances racing to acquire the same free stream: exactly one wins.
pub async fn lease_concurrent_acquire_exactly_one_wins<H: Harness>(h: &H) {
    let f = h.open().await;
    let j1 = Arc::new(h.reopen_journal(&f.ctx).await);
    let j2 = Arc::new(h.reopen_journal(&f.ctx).await);
    for i in 0..16 {
        let s = sid(&format!("s{i}"));
        let (x, y, sa, sb) = (j1.clone(), j2.clone(), s.clone(), s.clone());
        let ta = tokio::spawn(async move { x.acquire(&sa, &owner("a"), TTL).await });
        let tb = tokio::spawn(async move { y.acquire(&sb, &owner("b"), TTL).await });
        let (ra, rb) = (
            ta.await.unwrap().expect("acquire a"),
            tb.await.unwrap().expect("acquire b"),
        );
        assert!(
            ra.is_some() != rb.is_some(),
            "{s}: exactly one winner, got {ra:?} and {rb:?}"
        );
        let won = ra.or(rb).unwrap();
        assert_eq!(won.epoch, 1, "{s}: one takeover, epoch 1");
        assert_eq!(
            f.journal.lease(&s).await.unwrap(),
            Some(won),
            "{s}: the winner's lease is the stored one"
        );
    }
}
