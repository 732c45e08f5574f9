//! The test oracle: a projection that cannot hide a lost or doubled event.
//!
//! Per stream it keeps a running **sum** of the events' values and an
//! append-only **list** of the seqs it applied; an **applied ledger** gets one
//! row per apply with no unique constraint. Losing an event changes the sum
//! and leaves a hole in the list; applying one twice changes the sum, repeats
//! a seq in the list and doubles a ledger row. [`check_history`] verifies all
//! three against the journal.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::{
    BoxError, DigestBuilder, DigestValue, Event, EventTypeRegistry, NewEvent, Projection, ProjectionName,
    Seq, StreamId,
};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OracleStream {
    /// Sum of applied values.
    pub sum: i64,
    /// Applied seqs, in apply order.
    pub seqs: Vec<u64>,
}

impl OracleStream {
    /// The seq list as stored by the adapters' oracle storage: `"1,2,3"`.
    pub fn seqs_text(&self) -> String {
        self.seqs.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
    }

    /// Parses a seq list written by [`OracleStream::seqs_text`].
    pub fn parse_seqs(text: &str) -> Result<Vec<u64>, BoxError> {
        text.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| Ok(s.parse()?))
            .collect()
    }
}

/// The committed state of one oracle projection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OracleState {
    /// Per stream.
    pub streams: BTreeMap<String, OracleStream>,
    /// Every ledger row (stream, seq), in insertion order.
    pub ledger: Vec<(String, u64)>,
}

/// How an adapter stores the oracle inside its projection transaction.
///
/// Implementations keep three things per projection name: a row per stream
/// with the sum and the seq list (the list may be stored as text, e.g.
/// `"1,2,3"`), and a ledger table with no unique constraint.
#[async_trait]
pub trait OracleStorage<Tx: Send>: Send + Sync {
    /// Creates the tables if needed.
    async fn setup(&self, tx: &mut Tx) -> Result<(), BoxError>;
    /// The stream's (sum, seq list) or `None`.
    async fn load(
        &self,
        tx: &mut Tx,
        projection: &str,
        stream: &str,
    ) -> Result<Option<OracleStream>, BoxError>;
    /// Stores the stream's (sum, seq list).
    async fn store(
        &self,
        tx: &mut Tx,
        projection: &str,
        stream: &str,
        state: &OracleStream,
    ) -> Result<(), BoxError>;
    /// Inserts a ledger row (never deduplicated).
    async fn ledger(&self, tx: &mut Tx, projection: &str, stream: &str, seq: u64) -> Result<(), BoxError>;
    /// Deletes the projection's rows (streams and ledger).
    async fn clear(&self, tx: &mut Tx, projection: &str) -> Result<(), BoxError>;
    /// Every stream row of the projection, ordered by stream.
    async fn dump(&self, tx: &mut Tx, projection: &str) -> Result<Vec<(String, OracleStream)>, BoxError>;
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

/// The oracle projection over an adapter's [`OracleStorage`].
pub struct OracleProjection<Tx: Send> {
    name: ProjectionName,
    storage: Arc<dyn OracleStorage<Tx>>,
    faults: Faults,
}

impl<Tx: Send + 'static> OracleProjection<Tx> {
    /// An oracle projection called `name`.
    pub fn new(name: &str, storage: Arc<dyn OracleStorage<Tx>>) -> Self {
        OracleProjection {
            name: ProjectionName::new(name).expect("valid projection name"),
            storage,
            faults: Faults::default(),
        }
    }

    /// The fault switchboard (clone it before boxing the projection).
    pub fn faults(&self) -> Faults {
        self.faults.clone()
    }

    /// As a trait object.
    pub fn shared(self) -> Arc<dyn Projection<Tx>> {
        Arc::new(self)
    }
}

#[async_trait]
impl<Tx: Send + 'static> Projection<Tx> for OracleProjection<Tx> {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn setup(&self, tx: &mut Tx) -> Result<(), BoxError> {
        self.storage.setup(tx).await
    }

    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError> {
        self.faults.check(&event.stream, event.seq)?;
        let value = value_of(event)?;
        let name = self.name.as_str();
        let stream = event.stream.as_str();
        let mut state = self.storage.load(tx, name, stream).await?.unwrap_or_default();
        state.sum += value;
        state.seqs.push(event.seq.get());
        self.storage.store(tx, name, stream, &state).await?;
        self.storage.ledger(tx, name, stream, event.seq.get()).await
    }

    async fn reset(&self, tx: &mut Tx) -> Result<(), BoxError> {
        self.storage.clear(tx, self.name.as_str()).await
    }

    async fn digest(&self, tx: &mut Tx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        out.table("oracle");
        for (stream, s) in self.storage.dump(tx, self.name.as_str()).await? {
            out.row(&[
                DigestValue::Text(&stream),
                DigestValue::Int(s.sum),
                DigestValue::Text(&s.seqs_text()),
            ]);
        }
        Ok(())
    }
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
