//! The test oracle's storage for the memory adapter (feature `oracle`).

use outbox_core::BoxError;
use outbox_testkit::{OracleState, OracleStorage, OracleStream};

use crate::{MemoryTx, Tables};

fn streams_table(projection: &str) -> String {
    format!("oracle_streams/{projection}")
}

fn ledger_table(projection: &str) -> String {
    format!("oracle_ledger/{projection}")
}

fn decode(v: &[u8]) -> Result<OracleStream, BoxError> {
    let s = std::str::from_utf8(v)?;
    let (sum, seqs) = s.split_once('|').ok_or("malformed oracle row")?;
    Ok(OracleStream {
        sum: sum.parse()?,
        seqs: OracleStream::parse_seqs(seqs)?,
    })
}

fn encode(s: &OracleStream) -> Vec<u8> {
    format!("{}|{}", s.sum, s.seqs_text()).into_bytes()
}

/// The oracle's storage on [`MemoryTx`]: a table per projection for the
/// stream rows, another for the ledger (keys are insertion counters, so
/// nothing is deduplicated).
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryOracle;

#[outbox_core::async_trait]
impl OracleStorage<MemoryTx> for MemoryOracle {
    async fn setup(&self, _tx: &mut MemoryTx) -> Result<(), BoxError> {
        Ok(())
    }
    async fn load(
        &self,
        tx: &mut MemoryTx,
        projection: &str,
        stream: &str,
    ) -> Result<Option<OracleStream>, BoxError> {
        tx.get(&streams_table(projection), stream).map(decode).transpose()
    }
    async fn store(
        &self,
        tx: &mut MemoryTx,
        projection: &str,
        stream: &str,
        state: &OracleStream,
    ) -> Result<(), BoxError> {
        tx.put(&streams_table(projection), stream, encode(state));
        Ok(())
    }
    async fn ledger(
        &self,
        tx: &mut MemoryTx,
        projection: &str,
        stream: &str,
        seq: u64,
    ) -> Result<(), BoxError> {
        let table = ledger_table(projection);
        let key = format!("{:012}", tx.len(&table));
        tx.put(&table, &key, format!("{stream}|{seq}").into_bytes());
        Ok(())
    }
    async fn clear(&self, tx: &mut MemoryTx, projection: &str) -> Result<(), BoxError> {
        tx.clear(&streams_table(projection));
        tx.clear(&ledger_table(projection));
        Ok(())
    }
    async fn dump(
        &self,
        tx: &mut MemoryTx,
        projection: &str,
    ) -> Result<Vec<(String, OracleStream)>, BoxError> {
        tx.scan(&streams_table(projection))
            .map(|(k, v)| Ok((k.to_owned(), decode(v)?)))
            .collect()
    }
}

/// Reads oracle projection `projection`'s committed state from the tables.
pub fn read_oracle(tables: &Tables, projection: &str) -> OracleState {
    let mut state = OracleState::default();
    if let Some(t) = tables.get(&streams_table(projection)) {
        for (k, v) in t {
            state.streams.insert(k.clone(), decode(v).expect("oracle row"));
        }
    }
    if let Some(t) = tables.get(&ledger_table(projection)) {
        for v in t.values() {
            let s = std::str::from_utf8(v).expect("utf8");
            let (stream, seq) = s.rsplit_once('|').expect("ledger row");
            state.ledger.push((stream.to_owned(), seq.parse().expect("seq")));
        }
    }
    state
}
