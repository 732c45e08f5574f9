//! [`WatermarkStore`] contract checks.

use outbox_core::{Watermark, WatermarkStore};

use super::support::{adds, apply_ok, oracle, recorded};
use crate::{Harness, one, sid};

/// `watermark`: `None` for a stream never applied.
pub async fn watermark_is_none_for_unsaved_stream<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let other = sid("other");
    let evs = recorded(&f.journal, &other, adds(&[1])).await;
    apply_ok(&f.projections, &other, &evs, &one(p)).await;
    assert_eq!(f.projections.watermark(&sid("s")).await.unwrap(), None);
}

/// The watermark is raised by applies and never lowered; `watermark` returns
/// what is stored, also to another instance.
pub async fn watermark_never_decreases<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3, 4, 5, 6, 7])).await;
    apply_ok(&f.projections, &s, &evs[..5], &one(p.clone())).await;
    let w = f.projections.watermark(&s).await.unwrap().expect("watermark");
    assert_eq!(
        (w.stream.clone(), w.applied_through, w.expected_next),
        (s.clone(), 5, 6)
    );
    apply_ok(&f.projections, &s, &evs[..3], &one(p.clone())).await;
    assert_eq!(
        f.projections
            .watermark(&s)
            .await
            .unwrap()
            .map(|w| w.applied_through),
        Some(5),
        "a run of duplicates below it leaves it as it is"
    );
    apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    let w = f.projections.watermark(&s).await.unwrap().expect("watermark");
    assert_eq!((w.applied_through, w.expected_next), (7, 8));
    let other = h.reopen_projections(&f.ctx).await;
    assert_eq!(
        other.watermark(&s).await.unwrap(),
        Some(w),
        "stored in the database"
    );
}

/// `apply` raises the stream's watermark to the run's last seq in the same
/// transaction; an all-duplicate run never lowers it.
pub async fn watermark_is_raised_by_apply<H: Harness>(h: &H) {
    let f = h.open().await;
    let (p, _) = oracle(h, &f, "p").await;
    let s = sid("s");
    let evs = recorded(&f.journal, &s, adds(&[1, 2, 3])).await;
    apply_ok(&f.projections, &s, &evs[..2], &one(p.clone())).await;
    assert_eq!(
        f.projections
            .watermark(&s)
            .await
            .unwrap()
            .map(|w| w.applied_through),
        Some(2)
    );
    apply_ok(&f.projections, &s, &evs, &one(p.clone())).await;
    let w = f.projections.watermark(&s).await.unwrap().expect("watermark");
    assert_eq!((w.applied_through, w.expected_next), (3, 4));
    apply_ok(&f.projections, &s, &evs[..1], &one(p.clone())).await;
    assert_eq!(
        f.projections
            .watermark(&s)
            .await
            .unwrap()
            .map(|w| w.applied_through),
        Some(3),
        "never lowered"
    );
}

/// `watermarks`: pages by stream id, strictly after `after`, at most `limit`.
pub async fn watermarks_page_by_stream_id<H: Harness>(h: &H) {
    let f = h.open().await;
    let (proj, _) = oracle(h, &f, "p").await;
    for (name, n) in [("d", 4), ("b", 2), ("e", 5), ("a", 1), ("c", 3)] {
        let s = sid(name);
        let values: Vec<i64> = (1..=n).collect();
        let evs = recorded(&f.journal, &s, adds(&values)).await;
        apply_ok(&f.projections, &s, &evs, &one(proj.clone())).await;
    }
    let page = |v: Vec<Watermark>| {
        v.into_iter()
            .map(|w| (w.stream.to_string(), w.applied_through))
            .collect::<Vec<_>>()
    };
    let p = |s: &str, n: u64| (s.to_string(), n);
    assert_eq!(
        page(f.projections.watermarks(None, 2).await.unwrap()),
        [p("a", 1), p("b", 2)]
    );
    assert_eq!(
        page(f.projections.watermarks(Some(&sid("b")), 2).await.unwrap()),
        [p("c", 3), p("d", 4)]
    );
    assert_eq!(
        page(f.projections.watermarks(Some(&sid("d")), 2).await.unwrap()),
        [p("e", 5)]
    );
    assert!(
        f.projections
            .watermarks(Some(&sid("e")), 2)
            .await
            .unwrap()
            .is_empty(),
        "past the last"
    );
    assert_eq!(
        page(f.projections.watermarks(Some(&sid("bb")), 1).await.unwrap()),
        [p("c", 3)]
    );
}
