//! Model-based test: random operation sequences run against the memory
//! adapter and against a deliberately naive reference model (linear scans,
//! no indexes); every result and the observable state must agree.
//!
//! proptest prints the failing case (shrunk) and the seed is recorded in
//! `proptest-regressions/` when a case fails.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{
    AppendOptions, AppendRequest, Clock, DeadLetters, Error, EventJournal, EventType, ExpectedVersion,
    FailureOutcome, Intent, Lease, LeaseStore, ManualClock, NewEvent, OutboxInspector, OutboxQueue,
    OutboxStatus, RetryPolicy, Seq, StreamId, WorkerId,
};
use outbox_memory::MemoryJournal;
use proptest::prelude::*;

fn add(v: i64) -> NewEvent {
    NewEvent::new(
        EventType::new("add").unwrap(),
        Intent::Apply,
        v.to_string().into_bytes(),
    )
}

const STREAMS: u8 = 2;
const WORKERS: u8 = 2;
const TTL_MS: i64 = 5_000;
const THRESHOLD: u32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Append { stream: u8, n: u8, stale: bool },
    Acquire { worker: u8, stream: u8 },
    Release { worker: u8, stream: u8 },
    Claim { worker: u8, stream: u8, max: u8 },
    Complete { stream: u8, through: u8 },
    FailHead { worker: u8, stream: u8 },
    Requeue { stream: u8, seq: u8 },
    RequeueDead { limit: u8 },
    Advance { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..STREAMS;
    let w = 0..WORKERS;
    prop_oneof![
        3 => (s.clone(), 1u8..4, any::<bool>()).prop_map(|(stream, n, stale)| Op::Append { stream, n, stale: stale && n == 1 }),
        3 => (w.clone(), s.clone()).prop_map(|(worker, stream)| Op::Acquire { worker, stream }),
        1 => (w.clone(), s.clone()).prop_map(|(worker, stream)| Op::Release { worker, stream }),
        3 => (w.clone(), s.clone(), 1u8..4).prop_map(|(worker, stream, max)| Op::Claim { worker, stream, max }),
        2 => (s.clone(), 1u8..8).prop_map(|(stream, through)| Op::Complete { stream, through }),
        3 => (w, s.clone()).prop_map(|(worker, stream)| Op::FailHead { worker, stream }),
        1 => (s, 1u8..8).prop_map(|(stream, seq)| Op::Requeue { stream, seq }),
        1 => (1u8..4).prop_map(|limit| Op::RequeueDead { limit }),
        2 => (0u16..9_000).prop_map(|ms| Op::Advance { ms }),
    ]
}

#[derive(Clone, Debug, PartialEq)]
struct MRow {
    status: OutboxStatus,
    attempts: u32,
    next_at: i64,
    /// Applied alone (ADR 0029): found unfinished by a claim once.
    alone: bool,
}

#[derive(Clone, Debug, Default)]
struct MLease {
    owner: Option<u8>,
    epoch: u64,
    expires: i64,
}

/// The reference model: the contract, written as plainly as possible.
#[derive(Debug, Default)]
struct Model {
    now: i64,
    heads: [u64; STREAMS as usize],
    rows: BTreeMap<(u8, u64), MRow>,
    leases: HashMap<u8, MLease>,
}

impl Model {
    fn head_row(&self, s: u8) -> Option<(u64, &MRow)> {
        self.rows
            .iter()
            .find(|((st, _), _)| *st == s)
            .map(|((_, q), r)| (*q, r))
    }
    fn lease_valid(&self, s: u8, w: u8, epoch: u64) -> bool {
        self.leases
            .get(&s)
            .is_some_and(|l| l.owner == Some(w) && l.epoch == epoch && l.expires > self.now)
    }
    fn due_streams(&self) -> Vec<u8> {
        let mut v: Vec<(i64, u8)> = (0..STREAMS)
            .filter_map(|s| {
                let (_, r) = self.head_row(s)?;
                let free = self
                    .leases
                    .get(&s)
                    .is_none_or(|l| l.owner.is_none() || l.expires <= self.now);
                (r.status != OutboxStatus::Dead && r.next_at <= self.now && free).then_some((r.next_at, s))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, s)| s).collect()
    }
}

fn sid(s: u8) -> StreamId {
    StreamId::new(format!("s{s}")).unwrap()
}

fn wid(w: u8) -> WorkerId {
    WorkerId::new(format!("w{w}")).unwrap()
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Conflict { .. } => "conflict",
        Error::NotFound(_) => "not_found",
        Error::InvalidState(_) => "invalid_state",
        Error::LeaseLost { .. } => "lease_lost",
        Error::InvalidInput(_) => "invalid_input",
        _ => "other",
    }
}

async fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::default();
    let t0 = clock.now().as_millis();
    let sut = MemoryJournal::with_clock(Arc::new(clock.clone()));
    let policy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(8), THRESHOLD).unwrap();
    let mut m = Model::default();
    // The lease objects each worker holds (the SUT's), by (worker, stream).
    let mut held: HashMap<(u8, u8), Lease> = HashMap::new();

    for (i, op) in ops.into_iter().enumerate() {
        match op {
            Op::Append { stream, n, stale } => {
                let head = m.heads[stream as usize];
                let expected = if stale && head > 0 {
                    ExpectedVersion::Exact(head - 1)
                } else {
                    ExpectedVersion::Exact(head)
                };
                let r = sut
                    .append(
                        &[AppendRequest::new(
                            sid(stream),
                            expected,
                            (0..n).map(|v| add(v.into())).collect(),
                        )],
                        AppendOptions::enqueue(),
                    )
                    .await;
                if stale && head > 0 {
                    prop_assert_eq!(
                        r.as_ref().map_err(kind).err(),
                        Some("conflict"),
                        "op {}: stale append",
                        i
                    );
                } else {
                    prop_assert!(r.is_ok(), "op {}: append failed: {:?}", i, r);
                    for k in 1..=n as u64 {
                        m.rows.insert(
                            (stream, head + k),
                            MRow {
                                status: OutboxStatus::Pending,
                                attempts: 0,
                                next_at: m.now,
                                alone: false,
                            },
                        );
                    }
                    m.heads[stream as usize] += n as u64;
                }
            }
            Op::Acquire { worker, stream } => {
                let got = sut
                    .acquire(&sid(stream), &wid(worker), Duration::from_millis(TTL_MS as u64))
                    .await
                    .unwrap();
                let now = m.now;
                let l = m.leases.entry(stream).or_default();
                let held_by_other = l.owner.is_some() && l.owner != Some(worker) && l.expires > now;
                if held_by_other {
                    prop_assert!(got.is_none(), "op {}: acquire of a held lease succeeded", i);
                } else {
                    let same = l.owner == Some(worker) && l.expires > now;
                    if !same {
                        l.epoch += 1;
                    }
                    l.owner = Some(worker);
                    l.expires = now + TTL_MS;
                    let lease = got.expect("acquire of a free lease");
                    prop_assert_eq!(lease.epoch, l.epoch, "op {}: epoch", i);
                    held.insert((worker, stream), lease);
                }
            }
            Op::Release { worker, stream } => {
                if let Some(lease) = held.get(&(worker, stream)) {
                    let released = sut.release(lease).await.unwrap();
                    let valid = m.lease_valid(stream, worker, lease.epoch);
                    prop_assert_eq!(released, valid, "op {}: release", i);
                    if valid {
                        let now = m.now;
                        let l = m.leases.get_mut(&stream).unwrap();
                        l.owner = None;
                        l.expires = now;
                    }
                }
            }
            Op::Claim { worker, stream, max } => {
                let Some(lease) = held.get(&(worker, stream)) else {
                    continue;
                };
                let r = sut.claim(lease, max as usize).await;
                if !m.lease_valid(stream, worker, lease.epoch) {
                    prop_assert_eq!(
                        r.as_ref().map_err(kind).err(),
                        Some("lease_lost"),
                        "op {}: claim without lease",
                        i
                    );
                    continue;
                }
                let got: Vec<u64> = r.unwrap().iter().map(|r| r.seq.get()).collect();
                let mut want = Vec::new();
                let now = m.now;
                let rows: Vec<(u64, MRow)> = m
                    .rows
                    .iter()
                    .filter(|((s, _), _)| *s == stream)
                    .map(|((_, q), r)| (*q, r.clone()))
                    .collect();
                for (idx, (q, r)) in rows.iter().enumerate().take(max as usize) {
                    if (idx > 0 && *q != rows[idx - 1].0 + 1)
                        || r.status == OutboxStatus::Dead
                        || r.next_at > now
                    {
                        break;
                    }
                    // A row applied alone (or unfinished) is claimed by
                    // itself, as the head.
                    let by_itself = r.alone || r.status == OutboxStatus::Processing;
                    if idx > 0 && by_itself {
                        break;
                    }
                    want.push(*q);
                    if by_itself {
                        break;
                    }
                }
                for q in &want {
                    let row = m.rows.get_mut(&(stream, *q)).unwrap();
                    if row.status == OutboxStatus::Processing {
                        // Claimed again unfinished: alone from now on; the
                        // claim itself counts no attempt.
                        row.alone = true;
                    }
                    row.status = OutboxStatus::Processing;
                }
                prop_assert_eq!(got, want, "op {}: claimed seqs", i);
            }
            Op::Complete { stream, through } => {
                let n = sut
                    .complete(&sid(stream), Seq::new(through.into()).unwrap())
                    .await
                    .unwrap();
                let before = m.rows.len();
                m.rows.retain(|(s, q), _| !(*s == stream && *q <= through as u64));
                prop_assert_eq!(n as usize, before - m.rows.len(), "op {}: completed count", i);
            }
            Op::FailHead { worker, stream } => {
                let Some(lease) = held.get(&(worker, stream)) else {
                    continue;
                };
                let Some((seq, _)) = m.head_row(stream) else {
                    continue;
                };
                let r = sut.fail(lease, Seq::new(seq).unwrap(), "boom", &policy).await;
                let valid = m.lease_valid(stream, worker, lease.epoch);
                let now = m.now;
                let row = m.rows.get_mut(&(stream, seq)).unwrap();
                if !valid {
                    prop_assert_eq!(r.as_ref().map_err(kind).err(), Some("lease_lost"), "op {}", i);
                } else if row.status != OutboxStatus::Processing {
                    prop_assert_eq!(r.as_ref().map_err(kind).err(), Some("invalid_state"), "op {}", i);
                } else {
                    row.attempts += 1;
                    if row.attempts >= THRESHOLD {
                        row.status = OutboxStatus::Dead;
                        row.next_at = now;
                        prop_assert_eq!(
                            r.unwrap(),
                            FailureOutcome::Dead {
                                attempt: row.attempts
                            },
                            "op {}",
                            i
                        );
                    } else {
                        row.status = OutboxStatus::Failed;
                        row.next_at = now + 1000 * (1 << (row.attempts - 1));
                        let want = FailureOutcome::Retry {
                            attempt: row.attempts,
                            next_attempt_at: outbox_core::Timestamp::from_millis(t0 + row.next_at),
                        };
                        prop_assert_eq!(r.unwrap(), want, "op {}", i);
                    }
                }
            }
            Op::Requeue { stream, seq } => {
                let r = sut.requeue(&sid(stream), Seq::new(seq.into()).unwrap()).await;
                let now = m.now;
                match m.rows.get_mut(&(stream, seq as u64)) {
                    None => prop_assert_eq!(r.as_ref().map_err(kind).err(), Some("not_found"), "op {}", i),
                    Some(row) if row.status != OutboxStatus::Dead => {
                        prop_assert_eq!(r.as_ref().map_err(kind).err(), Some("invalid_state"), "op {}", i)
                    }
                    Some(row) => {
                        *row = MRow {
                            status: OutboxStatus::Pending,
                            attempts: 0,
                            next_at: now,
                            alone: false,
                        };
                        prop_assert!(r.is_ok(), "op {}", i);
                    }
                }
            }
            Op::RequeueDead { limit } => {
                let got: Vec<(String, u64)> = sut
                    .requeue_dead(limit.into())
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| (r.stream.to_string(), r.seq.get()))
                    .collect();
                let mut dead: Vec<(i64, u8, u64)> = m
                    .rows
                    .iter()
                    .filter(|(_, r)| r.status == OutboxStatus::Dead)
                    .map(|((s, q), r)| (r.next_at, *s, *q))
                    .collect();
                dead.sort();
                let now = m.now;
                let want: Vec<(String, u64)> = dead
                    .into_iter()
                    .take(limit.into())
                    .map(|(_, s, q)| {
                        m.rows.insert(
                            (s, q),
                            MRow {
                                status: OutboxStatus::Pending,
                                attempts: 0,
                                next_at: now,
                                alone: false,
                            },
                        );
                        (format!("s{s}"), q)
                    })
                    .collect();
                prop_assert_eq!(got, want, "op {}: requeue_dead order", i);
            }
            Op::Advance { ms } => {
                clock.advance(Duration::from_millis(ms.into()));
                m.now += i64::from(ms);
            }
        }
        // The observable state must agree after every operation.
        let due: Vec<String> = sut
            .due_streams(10)
            .await
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        let want_due: Vec<String> = m.due_streams().iter().map(|s| format!("s{s}")).collect();
        prop_assert_eq!(due, want_due, "after op {}: due streams", i);
        let summary = sut.summary().await.unwrap();
        for status in OutboxStatus::ALL {
            let n = m.rows.values().filter(|r| r.status == status).count() as u64;
            prop_assert_eq!(summary.count(status), n, "after op {}: {} count", i, status);
        }
        for (&(s, q), r) in &m.rows {
            let row = sut
                .row(&sid(s), Seq::new(q).unwrap())
                .await
                .unwrap()
                .expect("row exists");
            prop_assert_eq!(
                (row.status, row.attempt_count, row.alone),
                (r.status, r.attempts, r.alone),
                "after op {}: row s{}/{}",
                i,
                s,
                q
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn memory_adapter_matches_the_reference_model(ops in prop::collection::vec(op(), 1..100)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(run(ops))?;
    }
}
