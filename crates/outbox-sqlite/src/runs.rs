//! [`RunStore`] on the projection database: the `outbox_runs` table.

use std::time::Duration;

use outbox_core::{
    Error, MAX_PAGE, ProjectionName, Result, RunEnd, RunKind, RunRecord, RunState, RunStore, Seq, StoredRun,
    StreamId, WorkerId, duration_millis, truncate_error, validate_limit, validate_ttl,
};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::SqliteProjectionStore;
use crate::db::{now_ms, storage};

const COLUMNS: &str = "id, kind, projection, state, until_position, processed, last_stream, last_seq, \
     error_code, error_message, cancel_requested, owner, lease_expires_at, created_at, updated_at";

fn decode(row: &SqliteRow) -> Result<RunRecord> {
    let err = |e| storage("reading a run", e);
    StoredRun {
        id: row.try_get("id").map_err(err)?,
        kind: row.try_get("kind").map_err(err)?,
        projection: row.try_get("projection").map_err(err)?,
        state: row.try_get("state").map_err(err)?,
        until_position: row.try_get("until_position").map_err(err)?,
        processed: row.try_get("processed").map_err(err)?,
        last_stream: row.try_get("last_stream").map_err(err)?,
        last_seq: row.try_get("last_seq").map_err(err)?,
        error_code: row.try_get("error_code").map_err(err)?,
        error_message: row.try_get("error_message").map_err(err)?,
        cancel_requested: row.try_get::<i64, _>("cancel_requested").map_err(err)? != 0,
        owner: row.try_get("owner").map_err(err)?,
        lease_expires_at: row.try_get("lease_expires_at").map_err(err)?,
        created_at: row.try_get("created_at").map_err(err)?,
        updated_at: row.try_get("updated_at").map_err(err)?,
    }
    .into_record()
}

async fn fetch(conn: &mut SqliteConnection, id: u64) -> Result<Option<RunRecord>> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM outbox_runs WHERE id = ?1"
    )))
    .bind(id as i64)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| storage("reading a run", e))?;
    row.as_ref().map(decode).transpose()
}

async fn owned_active(conn: &mut SqliteConnection, id: u64, owner: &WorkerId) -> Result<RunRecord> {
    let run = fetch(conn, id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
    if !run.state.is_active() || &run.owner != owner {
        return Err(Error::InvalidState(format!(
            "run {id} is {} and owned by {}; {owner} cannot update it",
            run.state, run.owner
        )));
    }
    Ok(run)
}

impl SqliteProjectionStore {
    async fn run_write<T>(
        &self,
        what: &'static str,
        f: impl AsyncFnOnce(&mut SqliteConnection) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.db.begin().await?;
        let out = f(&mut tx).await?;
        tx.commit().await.map_err(|e| storage(self.db.context(what), e))?;
        Ok(out)
    }
}

impl RunStore for SqliteProjectionStore {
    async fn admit_run(
        &self,
        kind: RunKind,
        projection: &ProjectionName,
        until: Option<u64>,
        owner: &WorkerId,
        ttl: Duration,
    ) -> Result<RunRecord> {
        validate_ttl(ttl)?;
        let until = until.map(|u| i64::try_from(u).unwrap_or(i64::MAX));
        self.run_write("admitting a run", async |tx| {
            let err = |e| storage("admitting a run", e);
            sqlx::query(concat!(
                "UPDATE outbox_runs SET state = 'failed', error_code = 'abandoned', \
                 error_message = 'the run''s owner stopped renewing its claim', updated_at = ",
                now_ms!(),
                " WHERE projection = ?1 AND state IN ('queued', 'running') AND lease_expires_at <= ",
                now_ms!()
            ))
            .bind(projection.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            let active: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM outbox_runs WHERE projection = ?1 AND state IN ('queued', 'running') ORDER BY id LIMIT 1",
            )
            .bind(projection.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
            if let Some(id) = active {
                let run = fetch(tx, id as u64).await?.ok_or_else(|| Error::NotFound(format!("run {id}")))?;
                return Err(Error::InvalidState(format!(
                    "{} run {} is already {} on projection `{}` (owner {}); wait for it or cancel it with `outbox runs cancel {}`",
                    run.kind, run.id, run.state, run.projection, run.owner, run.id
                )));
            }
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO outbox_runs (kind, projection, state, until_position, owner, lease_expires_at, \
                 created_at, updated_at) VALUES (?1, ?2, 'queued', ?3, ?4, {now} + ?5, {now}, {now}) RETURNING {COLUMNS}",
                now = now_ms!()
            )))
            .bind(kind.as_str())
            .bind(projection.as_str())
            .bind(until)
            .bind(owner.as_str())
            .bind(duration_millis(ttl))
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
            decode(&row)
        })
        .await
    }

    async fn update_run(
        &self,
        id: u64,
        owner: &WorkerId,
        processed: u64,
        last: Option<(&StreamId, Seq)>,
        ttl: Duration,
    ) -> Result<RunRecord> {
        validate_ttl(ttl)?;
        self.run_write("updating a run", async |tx| {
            owned_active(tx, id, owner).await?;
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE outbox_runs SET state = 'running', processed = ?2, \
                 last_stream = COALESCE(?3, last_stream), last_seq = COALESCE(?4, last_seq), \
                 lease_expires_at = {now} + ?5, updated_at = {now} WHERE id = ?1 RETURNING {COLUMNS}",
                now = now_ms!()
            )))
            .bind(id as i64)
            .bind(i64::try_from(processed).unwrap_or(i64::MAX))
            .bind(last.map(|(s, _)| s.as_str()))
            .bind(last.map(|(_, q)| q.as_i64()))
            .bind(duration_millis(ttl))
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| storage("updating a run", e))?;
            decode(&row)
        })
        .await
    }

    async fn finish_run(&self, id: u64, owner: &WorkerId, end: RunEnd) -> Result<RunRecord> {
        let state = end.state();
        let (code, message) = match &end {
            RunEnd::Failed { code, message } => (Some(code.as_str()), Some(truncate_error(message))),
            _ => (None, None),
        };
        self.run_write("finishing a run", async |tx| {
            owned_active(tx, id, owner).await?;
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE outbox_runs SET state = ?2, error_code = ?3, error_message = ?4, updated_at = {now} \
                 WHERE id = ?1 RETURNING {COLUMNS}",
                now = now_ms!()
            )))
            .bind(id as i64)
            .bind(state.as_str())
            .bind(code)
            .bind(message)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| storage("finishing a run", e))?;
            decode(&row)
        })
        .await
    }

    async fn cancel_run(&self, id: u64) -> Result<RunRecord> {
        self.run_write("cancelling a run", async |tx| {
            let run = fetch(tx, id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("run {id}")))?;
            let set = match run.state {
                RunState::Queued => "state = 'cancelled'",
                RunState::Running => "cancel_requested = 1",
                _ => return Err(Error::InvalidState(format!("run {id} is already {}", run.state))),
            };
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE outbox_runs SET {set}, updated_at = {now} WHERE id = ?1 RETURNING {COLUMNS}",
                now = now_ms!()
            )))
            .bind(id as i64)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| storage("cancelling a run", e))?;
            decode(&row)
        })
        .await
    }

    async fn run(&self, id: u64) -> Result<Option<RunRecord>> {
        let mut conn = self.db.read().await?;
        fetch(&mut conn, id).await
    }

    async fn runs(&self, limit: usize) -> Result<Vec<RunRecord>> {
        let limit = validate_limit(limit, MAX_PAGE)?;
        let mut conn = self.db.read().await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM outbox_runs ORDER BY id DESC LIMIT ?1"
        )))
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| storage("listing runs", e))?;
        rows.iter().map(decode).collect()
    }
}
