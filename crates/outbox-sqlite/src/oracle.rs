//! The test oracle's storage for the SQLite adapter (feature `oracle`), so
//! tests of code built on this adapter (the runtime's, an application's) can
//! run the oracle projection on SQLite files.

use outbox_core::BoxError;
use outbox_testkit::{OracleState, OracleStorage, OracleStream};
use sqlx::{Row, SqliteConnection};

use crate::SqliteProjectionStore;

/// The oracle's storage on [`SqliteConnection`]: a table `oracle_streams`
/// (projection, stream, sum, seq list as text) and a ledger `oracle_ledger`
/// with no unique constraint, so a duplicate apply shows up as a second row.
/// Both are created by the oracle projection's `setup`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqliteOracle;

#[outbox_core::async_trait]
impl OracleStorage<SqliteConnection> for SqliteOracle {
    async fn setup(&self, tx: &mut SqliteConnection) -> Result<(), BoxError> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oracle_streams (projection TEXT NOT NULL, stream TEXT NOT NULL, \
             sum INTEGER NOT NULL, seqs TEXT NOT NULL, PRIMARY KEY (projection, stream))",
        )
        .execute(&mut *tx)
        .await?;
        // No unique constraint: a duplicate apply shows up as a second row.
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oracle_ledger (projection TEXT NOT NULL, stream TEXT NOT NULL, \
             seq INTEGER NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn load(
        &self,
        tx: &mut SqliteConnection,
        projection: &str,
        stream: &str,
    ) -> Result<Option<OracleStream>, BoxError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT sum, seqs FROM oracle_streams WHERE projection = ?1 AND stream = ?2")
                .bind(projection)
                .bind(stream)
                .fetch_optional(&mut *tx)
                .await?;
        row.map(|(sum, seqs)| {
            Ok(OracleStream {
                sum,
                seqs: OracleStream::parse_seqs(&seqs)?,
            })
        })
        .transpose()
    }

    async fn store(
        &self,
        tx: &mut SqliteConnection,
        projection: &str,
        stream: &str,
        state: &OracleStream,
    ) -> Result<(), BoxError> {
        sqlx::query(
            "INSERT INTO oracle_streams (projection, stream, sum, seqs) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (projection, stream) DO UPDATE SET sum = excluded.sum, seqs = excluded.seqs",
        )
        .bind(projection)
        .bind(stream)
        .bind(state.sum)
        .bind(state.seqs_text())
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn ledger(
        &self,
        tx: &mut SqliteConnection,
        projection: &str,
        stream: &str,
        seq: u64,
    ) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO oracle_ledger (projection, stream, seq) VALUES (?1, ?2, ?3)")
            .bind(projection)
            .bind(stream)
            .bind(seq as i64)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn clear(&self, tx: &mut SqliteConnection, projection: &str) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM oracle_streams WHERE projection = ?1")
            .bind(projection)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM oracle_ledger WHERE projection = ?1")
            .bind(projection)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn dump(
        &self,
        tx: &mut SqliteConnection,
        projection: &str,
    ) -> Result<Vec<(String, OracleStream)>, BoxError> {
        let rows: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT stream, sum, seqs FROM oracle_streams WHERE projection = ?1 ORDER BY stream",
        )
        .bind(projection)
        .fetch_all(&mut *tx)
        .await?;
        rows.into_iter()
            .map(|(stream, sum, seqs)| {
                Ok((
                    stream,
                    OracleStream {
                        sum,
                        seqs: OracleStream::parse_seqs(&seqs)?,
                    },
                ))
            })
            .collect()
    }
}

/// Reads oracle projection `projection`'s committed state from the projection
/// file, on a read connection outside any apply (empty if the oracle's tables
/// were never set up). Panics on a read error: test support only.
pub async fn read_oracle(store: &SqliteProjectionStore, projection: &str) -> OracleState {
    let mut conn = store.read().await.expect("read connection");
    let mut state = OracleState::default();
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('oracle_streams', 'oracle_ledger')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("schema");
    if exists < 2 {
        return state;
    }
    let rows =
        sqlx::query("SELECT stream, sum, seqs FROM oracle_streams WHERE projection = ?1 ORDER BY stream")
            .bind(projection)
            .fetch_all(&mut *conn)
            .await
            .expect("oracle rows");
    for r in rows {
        let stream: String = r.get(0);
        let seqs: String = r.get(2);
        state.streams.insert(
            stream,
            OracleStream {
                sum: r.get(1),
                seqs: OracleStream::parse_seqs(&seqs).expect("seq list"),
            },
        );
    }
    let ledger: Vec<(String, i64)> =
        sqlx::query_as("SELECT stream, seq FROM oracle_ledger WHERE projection = ?1 ORDER BY rowid")
            .bind(projection)
            .fetch_all(&mut *conn)
            .await
            .expect("ledger rows");
    state.ledger = ledger.into_iter().map(|(s, q)| (s, q as u64)).collect();
    state
}
