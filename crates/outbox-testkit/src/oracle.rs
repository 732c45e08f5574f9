//! The test oracle: a projection that cannot hide a lost or doubled event.
//!
//! Per stream it keeps a running **sum** of the events' values and an
//! append-only **list** of the seqs it applied; an **applied ledger** counts
//! every apply of every (stream, seq). Losing an event changes the sum and
//! leaves a hole in the list; applying one twice changes the sum, repeats a
//! seq in the list and counts 2 in the ledger. [`check_history`] verifies all
//! three against the journal. The oracle is a [`ViewProjection`], so the same
//! code runs on every adapter.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::spi::ViewStorage;
use outbox_core::{
    BoxError, Error, Event, EventTypeRegistry, NewEvent, Projection, ProjectionName, Seq, StreamId,
    ViewProjection, ViewReader, ViewStore, ViewTx, view_projection,
};
use serde::{Deserialize, Serialize};

/// The event type the oracle applies.
pub const ORACLE_EVENT: &str = "oracle.add";
/// An audit-only event type the oracle never sees.
pub const ORACLE_AUDIT: &str = "oracle.audit";

/// A registry with the oracle's two event types.
pub fn oracle_registry() -> EventTypeRegistry {
    let mut r = EventTypeRegistry::new();
    r.apply(ORACLE_EVENT)
        .and_then(|r| r.audit_only(ORACLE_AUDIT))
        .expect("valid names");
    r
}

/// An oracle event carrying `value`.
pub fn add(value: i64) -> NewEvent {
    oracle_registry()
        .event(ORACLE_EVENT, value.to_string().into_bytes())
        .expect("registered")
}

/// An audit-only event.
pub fn audit() -> NewEvent {
    oracle_registry()
        .event(ORACLE_AUDIT, b"audit".to_vec())
        .expect("registered")
}

/// Decodes an oracle event's value.
pub fn value_of(event: &Event) -> Result<i64, BoxError> {
    Ok(std::str::from_utf8(&event.payload)?.parse()?)
}

/// One stream's committed oracle state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleStream {
    /// Sum of applied values.
    pub sum: i64,
    /// Applied seqs, in apply order.
    pub seqs: Vec<u64>,
}

/// The committed state of one oracle projection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OracleState {
    /// Per stream.
    pub streams: BTreeMap<String, OracleStream>,
    /// Every ledger entry (stream, seq), once per apply, ordered by stream and seq.
    pub ledger: Vec<(String, u64)>,
}

/// Injected failures, shared by clones.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    inner: Arc<Mutex<HashMap<(String, u64), u32>>>,
}

impl Faults {
    /// Makes the next `times` applies of (stream, seq) fail (`u32::MAX`: always).
    pub fn fail(&self, stream: &StreamId, seq: u64, times: u32) {
        self.inner
            .lock()
            .expect("faults lock")
            .insert((stream.to_string(), seq), times);
    }

    /// Removes every injected failure ("the fix is deployed").
    pub fn clear(&self) {
        self.inner.lock().expect("faults lock").clear();
    }

    fn check(&self, stream: &StreamId, seq: Seq) -> Result<(), BoxError> {
        let mut map = self.inner.lock().expect("faults lock");
        let key = (stream.to_string(), seq.get());
        match map.get_mut(&key) {
            Some(0) | None => Ok(()),
            Some(n) => {
                if *n != u32::MAX {
                    *n -= 1;
                }
                Err(format!("injected failure at {stream}/{seq}").into())
            }
        }
    }
}

/// The oracle projection, written once as a [`ViewProjection`], so it runs
/// unchanged on every adapter.
///
/// Documents: table `streams`, one per stream (`{"sum": .., "seqs": [..]}`),
/// and table `ledger`, one per applied (stream, seq) whose value counts the
/// applies: a key-value store cannot hold a row twice, so a duplicate apply
/// shows as a count of 2 instead (and as a repeated seq in `seqs`).
pub struct OracleProjection {
    name: ProjectionName,
    faults: Faults,
}

/// The oracle's table of per-stream states.
const STREAMS: &str = "streams";
/// The oracle's apply ledger.
const LEDGER: &str = "ledger";

fn ledger_key(stream: &str, seq: u64) -> String {
    format!("{stream}/{seq:020}")
}

impl OracleProjection {
    /// An oracle projection called `name`.
    pub fn new(name: &str) -> Self {
        OracleProjection {
            name: ProjectionName::new(name).expect("valid projection name"),
            faults: Faults::default(),
        }
    }

    /// The fault switchboard (clone it before sharing the projection).
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// As a projection of any store (`Tx` is the store's transaction handle).
    pub fn shared<Tx: ViewStorage + 'static>(self) -> Arc<dyn Projection<Tx>> {
        view_projection(Arc::new(self))
    }
}

#[async_trait]
impl ViewProjection for OracleProjection {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        self.faults.check(&event.stream, event.seq)?;
        let value = value_of(event)?;
        let stream = event.stream.as_str();
        view.update(STREAMS, stream, |s: &mut OracleStream| {
            s.sum += value;
            s.seqs.push(event.seq.get());
        })
        .await?;
        view.update(LEDGER, &ledger_key(stream, event.seq.get()), |n: &mut u64| {
            *n += 1
        })
        .await?;
        Ok(())
    }
}

/// Reads the committed state of oracle projection `name` from any store.
pub async fn read_state<S: ViewStore + ?Sized>(store: &S, name: &str) -> Result<OracleState, Error> {
    let reader = ViewReader::new(store, ProjectionName::new(name)?);
    let mut state = OracleState::default();
    let mut after: Option<String> = None;
    loop {
        let page: Vec<(String, OracleStream)> = reader.scan(STREAMS, after.as_deref(), 1000).await?;
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        state.streams.extend(page);
    }
    let mut after: Option<String> = None;
    loop {
        let page: Vec<(String, u64)> = reader.scan(LEDGER, after.as_deref(), 1000).await?;
        let Some((last, _)) = page.last() else { break };
        after = Some(last.clone());
        for (key, count) in page {
            let (stream, seq) = key
                .rsplit_once('/')
                .and_then(|(s, q)| Some((s.to_owned(), q.parse::<u64>().ok()?)))
                .ok_or_else(|| Error::invalid(format_args!("malformed oracle ledger key {key:?}")))?;
            for _ in 0..count {
                state.ledger.push((stream.clone(), seq));
            }
        }
    }
    Ok(state)
}

/// What a stream should look like after processing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// Applied seqs are exactly `1..=through`.
    pub through: u64,
    /// The sum of the values of events `1..=through` (audit-only ones excluded).
    pub sum: i64,
}

/// The history checker: every stream in `expected` has exactly its seqs
/// `1..=through` applied once each, in order, with the right sum, and the
/// ledger has exactly one row per applied (stream, seq). Streams not in
/// `expected` must have applied nothing. Audit-only seqs must be listed in
/// `skipped` (they advance checkpoints but are never applied).
pub fn check_history(
    state: &OracleState,
    expected: &BTreeMap<String, Expected>,
    skipped: &BTreeMap<String, Vec<u64>>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for (stream, want) in expected {
        let none = Vec::new();
        let skip = skipped.get(stream).unwrap_or(&none);
        let want_seqs: Vec<u64> = (1..=want.through).filter(|s| !skip.contains(s)).collect();
        let got = state.streams.get(stream).cloned().unwrap_or_default();
        if got.seqs != want_seqs {
            problems.push(format!(
                "{stream}: applied seqs {:?}, want {:?}",
                got.seqs, want_seqs
            ));
        }
        if got.sum != want.sum {
            problems.push(format!("{stream}: sum {}, want {}", got.sum, want.sum));
        }
    }
    for stream in state.streams.keys() {
        if !expected.contains_key(stream) && !state.streams[stream].seqs.is_empty() {
            problems.push(format!("{stream}: applied events but none were expected"));
        }
    }
    let mut counts: BTreeMap<(&str, u64), usize> = BTreeMap::new();
    for (s, q) in &state.ledger {
        *counts.entry((s.as_str(), *q)).or_default() += 1;
    }
    for ((s, q), n) in &counts {
        if *n != 1 {
            problems.push(format!("{s}/{q}: applied {n} times (ledger)"));
        }
    }
    let listed: usize = state.streams.values().map(|s| s.seqs.len()).sum();
    if listed != state.ledger.len() {
        problems.push(format!(
            "{} ledger rows for {listed} listed applies",
            state.ledger.len()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}
