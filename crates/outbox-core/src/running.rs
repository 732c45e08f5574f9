//! Running digests of view projections: an order-independent hash over a
//! projection's documents that every apply keeps current (ADR 0019).
//!
//! The full digest ([`Digest`](crate::Digest)) hashes every document in key
//! order, so it needs a scan. The running digest is a *multiset hash*: the
//! sum, lane by lane, of one SHA-256 per document, with the document count
//! beside it. Adding a document adds its hash, removing one subtracts it, so
//! an apply updates it from the documents it writes alone, in any order, and
//! the store records it in the apply's own transaction. A full scan
//! ([`RunningDigest::of_rows`]) recomputes it; `outbox verify` compares the two.

use std::fmt;

use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::{Error, ProjectionName, Result, Seq, StreamId, Timestamp};

/// The number of 32-bit lanes of a [`RunningDigest`] (256 bits in all).
pub const RUNNING_DIGEST_LANES: usize = 8;

/// The SHA-256 of one document (its table, key and JSON text, framed
/// unambiguously), as eight 32-bit lanes: what a [`RunningDigest`] adds up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DocumentHash([u32; RUNNING_DIGEST_LANES]);

impl DocumentHash {
    /// The hash of the document at `key` of `table` whose JSON text is `value`.
    pub fn of(table: &str, key: &str, value: &str) -> Self {
        let mut h = Sha256::new();
        h.update(b"outbox.view-document.v1");
        for part in [table, key, value] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let bytes: [u8; 32] = h.finalize().into();
        let mut lanes = [0u32; RUNNING_DIGEST_LANES];
        for (lane, chunk) in lanes.iter_mut().zip(bytes.chunks_exact(4)) {
            *lane = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        DocumentHash(lanes)
    }
}

/// An order-independent digest of a multiset of documents: each lane is the
/// sum modulo 2^32 of that lane of every document's [`DocumentHash`], and
/// `documents` counts them.
///
/// It is also the type of a *change* to a running digest (what one
/// transaction adds and removes), which is why the count is signed: the
/// change of a transaction that only deletes is negative. Equal multisets
/// have equal digests whatever order the documents were written, overwritten
/// or deleted in.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RunningDigest {
    lanes: [u32; RUNNING_DIGEST_LANES],
    documents: i64,
}

impl RunningDigest {
    /// The digest of no documents.
    pub const EMPTY: RunningDigest = RunningDigest {
        lanes: [0; RUNNING_DIGEST_LANES],
        documents: 0,
    };

    /// A digest from its stored parts: eight lanes, each `0..2^32`, and the
    /// document count. A lane out of range is [`Error::InvalidInput`].
    pub fn from_parts(lanes: [i64; RUNNING_DIGEST_LANES], documents: i64) -> Result<Self> {
        let mut out = [0u32; RUNNING_DIGEST_LANES];
        for (i, (o, l)) in out.iter_mut().zip(lanes).enumerate() {
            *o = u32::try_from(l).map_err(|_| {
                Error::invalid(format_args!("running digest lane {i} is {l}, outside 0..2^32"))
            })?;
        }
        Ok(RunningDigest {
            lanes: out,
            documents,
        })
    }

    /// The lanes, each `0..2^32`, as the stores keep them (integers).
    pub fn lanes(&self) -> [i64; RUNNING_DIGEST_LANES] {
        self.lanes.map(i64::from)
    }

    /// How many documents (for a change: how many more or fewer).
    pub fn documents(&self) -> i64 {
        self.documents
    }

    /// Whether it is [`RunningDigest::EMPTY`] (for a change: no change).
    pub fn is_empty(&self) -> bool {
        *self == Self::EMPTY
    }

    /// Adds one document.
    pub fn add(&mut self, h: &DocumentHash) {
        for (l, x) in self.lanes.iter_mut().zip(h.0) {
            *l = l.wrapping_add(x);
        }
        self.documents += 1;
    }

    /// Removes one document.
    pub fn remove(&mut self, h: &DocumentHash) {
        for (l, x) in self.lanes.iter_mut().zip(h.0) {
            *l = l.wrapping_sub(x);
        }
        self.documents -= 1;
    }

    /// Replaces the document hashing to `old` (if any) by the one hashing
    /// to `new` (if any).
    pub fn replace(&mut self, old: Option<&DocumentHash>, new: Option<&DocumentHash>) {
        if let Some(old) = old {
            self.remove(old);
        }
        if let Some(new) = new {
            self.add(new);
        }
    }

    /// Adds a change (another digest, or the change of a transaction).
    pub fn merge(&mut self, change: &RunningDigest) {
        for (l, x) in self.lanes.iter_mut().zip(change.lanes) {
            *l = l.wrapping_add(x);
        }
        self.documents += change.documents;
    }

    /// The digest of `rows` of (table, key, JSON text): the full-scan
    /// recomputation, in any order.
    pub fn of_rows<'a>(rows: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let mut d = RunningDigest::EMPTY;
        for (t, k, v) in rows {
            d.add(&DocumentHash::of(t, k, v));
        }
        d
    }
}

/// Sixty-four hex digits, lane 0 first.
impl fmt::Display for RunningDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lanes.iter().try_for_each(|l| write!(f, "{l:08x}"))
    }
}

impl fmt::Debug for RunningDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunningDigest({self}, {} documents)", self.documents)
    }
}

impl Serialize for RunningDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A view projection's running digest as its store recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ViewDigest {
    /// The projection.
    pub projection: ProjectionName,
    /// The running digest; `None` when the store holds documents of the
    /// projection written before it kept running digests (an upgraded
    /// database): a rebuild of the projection starts one.
    pub digest: Option<RunningDigest>,
    /// The documents it counts (`digest`'s count, 0 when `None`).
    pub documents: i64,
    /// The last event applied to the projection by the last committed
    /// transaction that changed its documents (`None`: none since the
    /// documents were last cleared): the documents are as of this event.
    pub last_event: Option<(StreamId, Seq)>,
    /// When it last changed, by the store's clock (`None`: never).
    pub updated_at: Option<Timestamp>,
}

impl ViewDigest {
    /// The running digest of a projection with no documents and no history.
    pub fn empty(projection: &ProjectionName) -> Self {
        ViewDigest {
            projection: projection.clone(),
            digest: Some(RunningDigest::EMPTY),
            documents: 0,
            last_event: None,
            updated_at: None,
        }
    }
}

/// The recorded running digest of a projection beside the one recomputed by
/// a full scan of its documents, read in one snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ViewDigestCheck {
    /// What the store recorded.
    pub recorded: ViewDigest,
    /// What a scan of every document gives.
    pub scanned: RunningDigest,
}

impl ViewDigestCheck {
    /// Whether the recorded digest equals the scan.
    pub fn matches(&self) -> bool {
        self.recorded.digest == Some(self.scanned)
    }

    /// One line saying what differs, or `None` when it matches.
    pub fn mismatch(&self) -> Option<String> {
        let p = &self.recorded.projection;
        match self.recorded.digest {
            _ if self.matches() => None,
            None => Some(format!(
                "projection `{p}` has no running digest (its documents predate running digests): \
                 rebuild it (`outbox rebuild --projection {p}`) to start one"
            )),
            Some(r) => Some(format!(
                "projection `{p}`: running digest {r} over {} documents, but a scan gives {} over {} documents",
                r.documents, self.scanned, self.scanned.documents
            )),
        }
    }
}

/// Decodes a stored running digest row: eight lanes (all NULL for an
/// untracked projection), the count, the last event and the time.
pub fn stored_view_digest(
    projection: &ProjectionName,
    lanes: [Option<i64>; RUNNING_DIGEST_LANES],
    documents: i64,
    last: Option<(String, i64)>,
    updated_at: Option<i64>,
) -> Result<ViewDigest> {
    let bad = |e: Error| crate::spi::projection_undecodable("running digest", e);
    let digest = if lanes.iter().all(Option::is_none) {
        None
    } else {
        let mut l = [0i64; RUNNING_DIGEST_LANES];
        for (i, (o, x)) in l.iter_mut().zip(lanes).enumerate() {
            *o = x.ok_or_else(|| bad(Error::invalid(format_args!("lane {i} is NULL"))))?;
        }
        Some(RunningDigest::from_parts(l, documents).map_err(bad)?)
    };
    let last_event = match last {
        Some((s, q)) => Some((
            StreamId::new(s).map_err(bad)?,
            Seq::new(u64::try_from(q).unwrap_or(0)).map_err(bad)?,
        )),
        None => None,
    };
    Ok(ViewDigest {
        projection: projection.clone(),
        digest,
        documents: if digest.is_some() { documents } else { 0 },
        last_event,
        updated_at: updated_at.map(Timestamp::from_millis),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(t: &str, k: &str, v: &str) -> DocumentHash {
        DocumentHash::of(t, k, v)
    }

    #[test]
    fn order_does_not_matter_and_removal_undoes_addition() {
        let docs = [("t", "a", "1"), ("t", "b", "2"), ("u", "a", "\"x\"")];
        let forward = RunningDigest::of_rows(docs);
        let backward = RunningDigest::of_rows(docs.iter().rev().copied());
        assert_eq!(forward, backward);
        assert_eq!(forward.documents(), 3);
        let mut d = forward;
        d.remove(&h("t", "b", "2"));
        assert_eq!(d, RunningDigest::of_rows([docs[0], docs[2]]));
        d.remove(&h("t", "a", "1"));
        d.remove(&h("u", "a", "\"x\""));
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn framing_is_unambiguous() {
        assert_ne!(h("ab", "c", "1"), h("a", "bc", "1"));
        assert_ne!(h("t", "k1", "2"), h("t", "k", "12"));
        assert_ne!(h("t", "k", "1"), h("t", "k", "1 "));
    }

    #[test]
    fn overwrite_equals_the_final_state_and_changes_merge() {
        let mut running = RunningDigest::EMPTY;
        let mut change = RunningDigest::EMPTY;
        change.replace(None, Some(&h("t", "k", "1")));
        change.replace(Some(&h("t", "k", "1")), Some(&h("t", "k", "2")));
        change.replace(None, Some(&h("t", "j", "3")));
        change.replace(Some(&h("t", "j", "3")), None);
        running.merge(&change);
        assert_eq!(running, RunningDigest::of_rows([("t", "k", "2")]));
        let mut deletion = RunningDigest::EMPTY;
        deletion.replace(Some(&h("t", "k", "2")), None);
        assert_eq!(deletion.documents(), -1);
        running.merge(&deletion);
        assert_eq!(running, RunningDigest::EMPTY);
    }

    #[test]
    fn lanes_round_trip_and_out_of_range_lanes_are_refused() {
        let d = RunningDigest::of_rows([("t", "k", "1"), ("t", "l", "2")]);
        assert_eq!(RunningDigest::from_parts(d.lanes(), d.documents()).unwrap(), d);
        assert!(d.lanes().iter().all(|l| (0..1 << 32).contains(l)));
        let mut bad = d.lanes();
        bad[3] = 1 << 32;
        let e = RunningDigest::from_parts(bad, 2).unwrap_err();
        assert!(e.to_string().contains("lane 3"), "{e}");
        bad[3] = -1;
        assert!(RunningDigest::from_parts(bad, 2).is_err());
        assert_eq!(d.to_string().len(), 64);
        assert_eq!(RunningDigest::EMPTY.to_string(), "0".repeat(64));
    }

    #[test]
    fn checks_report_one_line() {
        let p = ProjectionName::new("p").unwrap();
        let scanned = RunningDigest::of_rows([("t", "k", "1")]);
        let mut ok = ViewDigestCheck {
            recorded: ViewDigest {
                digest: Some(scanned),
                documents: 1,
                ..ViewDigest::empty(&p)
            },
            scanned,
        };
        assert!(ok.matches() && ok.mismatch().is_none());
        ok.recorded.digest = Some(RunningDigest::EMPTY);
        let line = ok.mismatch().unwrap();
        assert!(
            line.contains("but a scan gives") && !line.contains('\n'),
            "{line}"
        );
        ok.recorded.digest = None;
        assert!(ok.mismatch().unwrap().contains("rebuild"));
    }

    proptest::proptest! {
        /// Any history of puts, overwrites and deletes leaves the running
        /// digest equal to the digest of the documents left, whatever their
        /// order.
        #[test]
        fn running_equals_a_scan_after_any_history(
            ops in proptest::collection::vec((0u8..3, 0u8..2, 0u8..5, 0u16..50), 0..200),
            changes in 1usize..5,
        ) {
            use std::collections::BTreeMap;
            let mut docs: BTreeMap<(String, String), String> = BTreeMap::new();
            // Split the history into `changes` transactions, each a change
            // merged into the running digest.
            let mut running = RunningDigest::EMPTY;
            for chunk in ops.chunks(ops.len().div_ceil(changes).max(1)) {
                let mut change = RunningDigest::EMPTY;
                for (op, t, k, v) in chunk {
                    let slot = (format!("t{t}"), format!("k{k}"));
                    let old = docs.get(&slot).map(|v| h(&slot.0, &slot.1, v));
                    let new = (*op != 2).then(|| v.to_string());
                    change.replace(old.as_ref(), new.as_ref().map(|v| h(&slot.0, &slot.1, v)).as_ref());
                    match new {
                        Some(v) => docs.insert(slot, v),
                        None => docs.remove(&slot),
                    };
                }
                running.merge(&change);
            }
            let scan = RunningDigest::of_rows(docs.iter().map(|((t, k), v)| (t.as_str(), k.as_str(), v.as_str())));
            proptest::prop_assert_eq!(running, scan);
            proptest::prop_assert_eq!(running.documents(), docs.len() as i64);
            let reversed = RunningDigest::of_rows(docs.iter().rev().map(|((t, k), v)| (t.as_str(), k.as_str(), v.as_str())));
            proptest::prop_assert_eq!(scan, reversed);
        }
    }

    #[test]
    fn stored_rows_decode() {
        let p = ProjectionName::new("p").unwrap();
        let d = RunningDigest::of_rows([("t", "k", "1")]);
        let v = stored_view_digest(&p, d.lanes().map(Some), 1, Some(("s".into(), 4)), Some(7)).unwrap();
        assert_eq!(v.digest, Some(d));
        assert_eq!(
            v.last_event.as_ref().map(|(s, q)| (s.as_str(), q.get())),
            Some(("s", 4))
        );
        let untracked = stored_view_digest(&p, [None; RUNNING_DIGEST_LANES], 0, None, None).unwrap();
        assert_eq!(untracked.digest, None);
        let mut half = d.lanes().map(Some);
        half[0] = None;
        assert!(stored_view_digest(&p, half, 1, None, None).is_err());
    }
}
