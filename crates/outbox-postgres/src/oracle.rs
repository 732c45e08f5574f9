//! The test oracle's storage for `PgConnection` (feature `oracle`).

use outbox_core::{BoxError, Result};
use outbox_testkit::{OracleState, OracleStorage, OracleStream};
use sqlx::{PgConnection, Row};

use crate::PgProjectionStore;
use crate::db::storage;

/// The oracle's storage in two tables of the projection schema:
/// `oracle_streams` (one row per projection and stream: the sum and the seq
/// list) and `oracle_ledger` (one row per apply, no unique constraint, so a
/// duplicate apply is a second row).
#[derive(Clone, Copy, Debug, Default)]
pub struct PgOracle;

#[outbox_core::async_trait]
impl OracleStorage<PgConnection> for PgOracle {
    async fn setup(&self, tx: &mut PgConnection) -> Result<(), BoxError> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oracle_streams (projection text COLLATE \"C\" NOT NULL, \
             stream text COLLATE \"C\" NOT NULL, sum bigint NOT NULL, seqs text NOT NULL, \
             PRIMARY KEY (projection, stream))",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS oracle_ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
             projection text NOT NULL, stream text NOT NULL, seq bigint NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        Ok(())
    }

    async fn load(
        &self,
        tx: &mut PgConnection,
        projection: &str,
        stream: &str,
    ) -> Result<Option<OracleStream>, BoxError> {
        let row: Option<(i64, String)> =
            sqlx::query_as("SELECT sum, seqs FROM oracle_streams WHERE projection = $1 AND stream = $2")
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
        tx: &mut PgConnection,
        projection: &str,
        stream: &str,
        state: &OracleStream,
    ) -> Result<(), BoxError> {
        sqlx::query(
            "INSERT INTO oracle_streams (projection, stream, sum, seqs) VALUES ($1, $2, $3, $4) \
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
        tx: &mut PgConnection,
        projection: &str,
        stream: &str,
        seq: u64,
    ) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO oracle_ledger (projection, stream, seq) VALUES ($1, $2, $3)")
            .bind(projection)
            .bind(stream)
            .bind(i64::try_from(seq)?)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn clear(&self, tx: &mut PgConnection, projection: &str) -> Result<(), BoxError> {
        sqlx::query("DELETE FROM oracle_streams WHERE projection = $1")
            .bind(projection)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM oracle_ledger WHERE projection = $1")
            .bind(projection)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }

    async fn dump(
        &self,
        tx: &mut PgConnection,
        projection: &str,
    ) -> Result<Vec<(String, OracleStream)>, BoxError> {
        let rows: Vec<(String, i64, String)> = sqlx::query_as(
            "SELECT stream, sum, seqs FROM oracle_streams WHERE projection = $1 ORDER BY stream",
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

/// Reads oracle projection `name`'s committed state from the store's schema
/// (empty if the oracle's tables do not exist yet).
pub async fn read_oracle(store: &PgProjectionStore, name: &str) -> Result<OracleState> {
    let err = |e| storage("reading the oracle", e);
    let mut conn = store.pool().acquire().await.map_err(err)?;
    let mut state = OracleState::default();
    let exists: bool = sqlx::query_scalar(
        "SELECT to_regclass('oracle_streams') IS NOT NULL AND to_regclass('oracle_ledger') IS NOT NULL",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    if !exists {
        return Ok(state);
    }
    let rows =
        sqlx::query("SELECT stream, sum, seqs FROM oracle_streams WHERE projection = $1 ORDER BY stream")
            .bind(name)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
    for r in rows {
        let stream: String = r.try_get(0).map_err(err)?;
        let seqs: String = r.try_get(2).map_err(err)?;
        let seqs = OracleStream::parse_seqs(&seqs)
            .map_err(|e| outbox_core::Error::storage("undecodable oracle seq list", e))?;
        state.streams.insert(
            stream,
            OracleStream {
                sum: r.try_get(1).map_err(err)?,
                seqs,
            },
        );
    }
    let ledger: Vec<(String, i64)> =
        sqlx::query_as("SELECT stream, seq FROM oracle_ledger WHERE projection = $1 ORDER BY id")
            .bind(name)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
    state.ledger = ledger
        .into_iter()
        .map(|(s, q)| (s, u64::try_from(q).unwrap_or(0)))
        .collect();
    Ok(state)
}
