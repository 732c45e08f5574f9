//! [`RunStore`](outbox_core::RunStore) on the projection database: the
//! `outbox_runs` table, written once for both dialects.
//!
//! Every decision is one statement, so it holds against concurrent writers
//! on both databases without a dialect hook (SQLite serializes writers with
//! `BEGIN IMMEDIATE`; Postgres re-checks an `UPDATE`'s condition on the
//! latest row version and enforces one active run per projection with the
//! partial unique index `outbox_runs_active`):
//! - admission (serialized per projection on Postgres by a
//!   transaction-scoped advisory lock, so a refused admission consumes no
//!   identity value) marks the projection's expired active runs `failed`
//!   (`abandoned`), then inserts a queued run unless an active one exists
//!   (`ADMIT`); when it inserted nothing, a second read names the run
//!   that refused it;
//! - `update_run`, `finish_run` and `cancel_run` are one conditional
//!   `UPDATE ... RETURNING`; when it changed nothing, a read of the run says
//!   why (`NotFound` or `InvalidState`).
//!
//! Every time is the projection store's database clock (`{now}`).

use std::time::Duration;

use outbox_core::spi::{
    StoredRun, duration_millis, projection_undecodable, truncate_error, validate_limit, validate_ttl,
};
use outbox_core::{
    Error, MAX_PAGE, ProjectionName, Result, RunBounds, RunEnd, RunKind, RunProgress, RunRecord, WorkerId,
};

use crate::{Arg, Database, Row};

/// The columns of a run, in [`decode`]'s order.
const COLUMNS: &str = "id, kind, projection, state, until_position, processed, last_stream, last_seq, \
     error_code, error_message, cancel_requested, owner, lease_expires_at, created_at, updated_at, \
     since_position, cursor_position";

/// A run from the columns of [`COLUMNS`] (`cancel_requested` is a boolean on
/// Postgres, 0 or 1 on SQLite: [`Row::bool`] reads both).
fn decode(r: &Row) -> Result<RunRecord> {
    let bad = |e: Error| projection_undecodable("run", e);
    StoredRun {
        id: r.int(0).map_err(bad)?,
        kind: r.text(1).map_err(bad)?,
        projection: r.text(2).map_err(bad)?,
        state: r.text(3).map_err(bad)?,
        until_position: r.opt_int(4).map_err(bad)?,
        processed: r.int(5).map_err(bad)?,
        last_stream: r.opt_text(6).map_err(bad)?,
        last_seq: r.opt_int(7).map_err(bad)?,
        error_code: r.opt_text(8).map_err(bad)?,
        error_message: r.opt_text(9).map_err(bad)?,
        cancel_requested: r.bool(10).map_err(bad)?,
        owner: r.text(11).map_err(bad)?,
        lease_expires_at: r.int(12).map_err(bad)?,
        created_at: r.int(13).map_err(bad)?,
        updated_at: r.int(14).map_err(bad)?,
        since_position: r.opt_int(15).map_err(bad)?,
        cursor_position: r.opt_int(16).map_err(bad)?,
    }
    .into_record()
}

fn not_found(id: u64) -> Error {
    Error::NotFound(format!("run {id}"))
}

/// Marks the projection's (`$1`) active runs whose claim expired as failed
/// (`abandoned`).
const SWEEP: &str = "UPDATE outbox_runs SET state = 'failed', error_code = 'abandoned', \
     error_message = 'the run''s owner stopped renewing its claim', updated_at = {now} \
     WHERE projection = $1 AND state IN ('queued', 'running') AND lease_expires_at <= {now}";

/// Inserts a queued run (kind `$1`, projection `$2`, until `$3`, owner `$4`,
/// claim for `$5` ms, since `$6`) unless the projection has an active run.
///
/// On SQLite the `NOT EXISTS` decides (writers are serialized). On Postgres
/// it sees the runs committed when the statement started, and the partial
/// unique index `outbox_runs_active` decides between concurrent admissions:
/// the second waits on the first's index entry, then inserts nothing. The
/// `ON CONFLICT` names no target because SQLite's index of active runs is
/// not unique (a target must name a unique index there); the only other
/// unique key on both is the generated id, which never conflicts. (SQLite
/// needs the `WHERE` of an `INSERT ... SELECT` before an `ON CONFLICT`;
/// this one has it.)
const ADMIT: &str = "INSERT INTO outbox_runs (kind, projection, state, until_position, owner, lease_expires_at, \
     created_at, updated_at, since_position) SELECT $1, $2, 'queued', $3, $4, {now} + $5, {now}, {now}, $6 \
     WHERE NOT EXISTS (SELECT 1 FROM outbox_runs WHERE projection = $2 AND state IN ('queued', 'running')) \
     ON CONFLICT DO NOTHING";

/// [`RunStore::admit_bounded_run`](outbox_core::RunStore::admit_bounded_run):
/// the bounds validated, then in one transaction, the expired-claim sweep and `ADMIT`; when that inserts
/// nothing, the active run that refused it, read by a new statement (so on
/// Postgres a new snapshot that sees the concurrent winner). That run can
/// finish between the two statements: then the admission is tried again, a
/// few times (each retry means another admission or completion raced with
/// this one).
pub async fn admit_run(
    db: &(impl Database + ?Sized),
    kind: RunKind,
    projection: &ProjectionName,
    bounds: RunBounds,
    owner: &WorkerId,
    ttl: Duration,
) -> Result<RunRecord> {
    validate_ttl(ttl)?;
    bounds.validate(kind)?;
    let what = "admitting a run";
    let until = bounds.until.map(|u| i64::try_from(u).unwrap_or(i64::MAX));
    let since = bounds.since.map(|u| i64::try_from(u).unwrap_or(i64::MAX));
    let d = db.dialect();
    let (sweep, admit) = (d.sql(SWEEP), d.sql(&format!("{ADMIT} RETURNING {COLUMNS}")));
    let active = d.sql(&format!(
        "SELECT {COLUMNS} FROM outbox_runs WHERE projection = $1 AND state IN ('queued', 'running') \
         ORDER BY id LIMIT 1"
    ));
    let lock = d.lock_admission().map(|l| d.sql(l));
    for _ in 0..5 {
        let mut tx = db.begin().await?;
        if let Some(lock) = &lock {
            tx.execute(what, lock, &[Arg::Text(projection.as_str())]).await?;
        }
        tx.execute(what, &sweep, &[Arg::Text(projection.as_str())])
            .await?;
        let args = [
            Arg::Text(kind.as_str()),
            Arg::Text(projection.as_str()),
            Arg::OptInt(until),
            Arg::Text(owner.as_str()),
            Arg::Int(duration_millis(ttl)),
            Arg::OptInt(since),
        ];
        if let Some(row) = tx.fetch_optional(what, &admit, &args).await? {
            let run = decode(&row)?;
            tx.commit(what).await?;
            return Ok(run);
        }
        let refused_by = tx
            .fetch_optional(what, &active, &[Arg::Text(projection.as_str())])
            .await?;
        tx.commit(what).await?;
        if let Some(row) = refused_by {
            let run = decode(&row)?;
            return Err(Error::InvalidState(format!(
                "{} run {} is already {} on projection `{}` (owner {}); wait for it or cancel it \
                 with `outbox runs cancel {}`",
                run.kind, run.id, run.state, run.projection, run.owner, run.id
            )));
        }
    }
    Err(Error::Storage {
        message: format!(
            "admitting a run on projection `{projection}`: concurrent admissions kept racing; try again"
        ),
        temporary: true,
        source: None,
    })
}

/// [`RunStore::reclaim_run`](outbox_core::RunStore::reclaim_run): in one
/// transaction, the projection's active run; when its owner is not in
/// `live`, a conditional `UPDATE` (still active, still that owner, idle for
/// `idle` by the store clock) marks it failed (`abandoned`).
pub async fn reclaim_run(
    db: &(impl Database + ?Sized),
    projection: &ProjectionName,
    live: &[WorkerId],
    idle: Duration,
) -> Result<Option<RunRecord>> {
    let what = "reclaiming a run";
    let d = db.dialect();
    let mut tx = db.begin().await?;
    let active = tx
        .fetch_optional(
            what,
            &d.sql(&format!(
                "SELECT {COLUMNS} FROM outbox_runs WHERE projection = $1 AND state IN ('queued', 'running') \
                 ORDER BY id LIMIT 1"
            )),
            &[Arg::Text(projection.as_str())],
        )
        .await?;
    let Some(run) = active.map(|r| decode(&r)).transpose()? else {
        tx.commit(what).await?;
        return Ok(None);
    };
    if live.contains(&run.owner) {
        tx.commit(what).await?;
        return Ok(None);
    }
    let reclaimed = tx
        .fetch_optional(
            what,
            &d.sql(&format!(
                "UPDATE outbox_runs SET state = 'failed', error_code = 'abandoned', \
                 error_message = 'the run''s owner is gone from the worker registry', updated_at = {{now}} \
                 WHERE id = $1 AND owner = $2 AND state IN ('queued', 'running') AND updated_at <= {{now}} - $3 \
                 RETURNING {COLUMNS}"
            )),
            &[
                Arg::Int(i64::try_from(run.id).unwrap_or(i64::MAX)),
                Arg::Text(run.owner.as_str()),
                Arg::Int(duration_millis(idle)),
            ],
        )
        .await?
        .map(|r| decode(&r))
        .transpose()?;
    tx.commit(what).await?;
    Ok(reclaimed)
}

/// Runs `update` (an `UPDATE` of run `$1` whose `WHERE` admits only the
/// states and owner the caller may change; [`COLUMNS`] are returned) with
/// `args` in one transaction. When it changes nothing, reads the run in the
/// same transaction: an unknown run is `NotFound`, and `refusal` says why a
/// known one was refused. A run that `refusal` does not refuse did not exist
/// for the `UPDATE` (on Postgres it was committed after the statement's
/// snapshot), so it is `NotFound` too, as it was for the statement.
async fn change(
    db: &(impl Database + ?Sized),
    what: &str,
    id: u64,
    update: &str,
    args: &[Arg<'_>],
    refusal: impl FnOnce(&RunRecord) -> Option<String>,
) -> Result<RunRecord> {
    let d = db.dialect();
    let mut tx = db.begin().await?;
    if let Some(row) = tx
        .fetch_optional(what, &d.sql(&format!("{update} RETURNING {COLUMNS}")), args)
        .await?
    {
        let run = decode(&row)?;
        tx.commit(what).await?;
        return Ok(run);
    }
    let row = tx
        .fetch_optional(
            what,
            &d.sql(&format!("SELECT {COLUMNS} FROM outbox_runs WHERE id = $1")),
            &args[..1],
        )
        .await?;
    let run = row
        .map(|r| decode(&r))
        .transpose()?
        .ok_or_else(|| not_found(id))?;
    Err(refusal(&run).map_or_else(|| not_found(id), Error::InvalidState))
}

/// Why `owner` may not update or finish `run`: it is not active or owned by
/// another worker.
fn not_owned_active(run: &RunRecord, owner: &WorkerId) -> Option<String> {
    (!run.state.is_active() || &run.owner != owner).then(|| {
        format!(
            "run {} is {} and owned by {}; {owner} cannot update it",
            run.id, run.state, run.owner
        )
    })
}

/// [`RunStore::record_progress`](outbox_core::RunStore::record_progress).
pub async fn record_progress(
    db: &(impl Database + ?Sized),
    id: u64,
    owner: &WorkerId,
    progress: RunProgress<'_>,
    ttl: Duration,
) -> Result<RunRecord> {
    let RunProgress {
        processed,
        last,
        position,
    } = progress;
    validate_ttl(ttl)?;
    let Ok(key) = i64::try_from(id) else {
        return Err(not_found(id));
    };
    const UPDATE: &str = "UPDATE outbox_runs SET state = 'running', processed = $3, \
         last_stream = COALESCE($4, last_stream), last_seq = COALESCE($5, last_seq), \
         cursor_position = COALESCE($7, cursor_position), lease_expires_at = {now} + $6, updated_at = {now} \
         WHERE id = $1 AND owner = $2 AND state IN ('queued', 'running')";
    let args = [
        Arg::Int(key),
        Arg::Text(owner.as_str()),
        Arg::Int(i64::try_from(processed).unwrap_or(i64::MAX)),
        Arg::OptText(last.map(|(s, _)| s.as_str())),
        Arg::OptInt(last.map(|(_, q)| q.as_i64())),
        Arg::Int(duration_millis(ttl)),
        Arg::OptInt(position.map(|p| i64::try_from(p).unwrap_or(i64::MAX))),
    ];
    change(db, "updating a run", id, UPDATE, &args, |run| {
        not_owned_active(run, owner)
    })
    .await
}

/// [`RunStore::finish_run`](outbox_core::RunStore::finish_run).
pub async fn finish_run(
    db: &(impl Database + ?Sized),
    id: u64,
    owner: &WorkerId,
    end: RunEnd,
) -> Result<RunRecord> {
    let Ok(key) = i64::try_from(id) else {
        return Err(not_found(id));
    };
    // Postgres text cannot hold NUL: an applier's message may (taken from a
    // payload); replace it so the failure is recorded, not lost.
    let storable = match &end {
        RunEnd::Failed { message, .. } => Some(message.replace('\0', "\u{fffd}")),
        _ => None,
    };
    let (code, message) = match &end {
        RunEnd::Failed { code, .. } => (Some(code.as_str()), storable.as_deref().map(truncate_error)),
        _ => (None, None),
    };
    const FINISH: &str = "UPDATE outbox_runs SET state = $3, error_code = $4, error_message = $5, \
         updated_at = {now} WHERE id = $1 AND owner = $2 AND state IN ('queued', 'running')";
    let args = [
        Arg::Int(key),
        Arg::Text(owner.as_str()),
        Arg::Text(end.state().as_str()),
        Arg::OptText(code),
        Arg::OptText(message),
    ];
    change(db, "finishing a run", id, FINISH, &args, |run| {
        not_owned_active(run, owner)
    })
    .await
}

/// [`RunStore::cancel_run`](outbox_core::RunStore::cancel_run): a queued run
/// becomes `cancelled`, a running one gets `cancel_requested` (bound as
/// [`Arg::Bool`]: a boolean on Postgres, 1 on SQLite).
pub async fn cancel_run(db: &(impl Database + ?Sized), id: u64) -> Result<RunRecord> {
    let Ok(key) = i64::try_from(id) else {
        return Err(not_found(id));
    };
    const CANCEL: &str = "UPDATE outbox_runs SET \
         state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END, \
         cancel_requested = CASE WHEN state = 'running' THEN $2 ELSE cancel_requested END, \
         updated_at = {now} WHERE id = $1 AND state IN ('queued', 'running')";
    change(
        db,
        "cancelling a run",
        id,
        CANCEL,
        &[Arg::Int(key), Arg::Bool(true)],
        |run| (!run.state.is_active()).then(|| format!("run {id} is already {}", run.state)),
    )
    .await
}

/// [`RunStore::run`](outbox_core::RunStore::run).
pub async fn run(db: &(impl Database + ?Sized), id: u64) -> Result<Option<RunRecord>> {
    let Ok(key) = i64::try_from(id) else {
        return Ok(None);
    };
    let sql = db
        .dialect()
        .sql(&format!("SELECT {COLUMNS} FROM outbox_runs WHERE id = $1"));
    let mut conn = db.read().await?;
    let row = conn
        .fetch_optional("reading a run", &sql, &[Arg::Int(key)])
        .await?;
    row.map(|r| decode(&r)).transpose()
}

/// [`RunStore::runs`](outbox_core::RunStore::runs): newest (highest id) first.
pub async fn runs(db: &(impl Database + ?Sized), limit: usize) -> Result<Vec<RunRecord>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let sql = db.dialect().sql(&format!(
        "SELECT {COLUMNS} FROM outbox_runs ORDER BY id DESC LIMIT $1"
    ));
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "listing runs",
            &sql,
            &[Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX))],
        )
        .await?;
    rows.iter().map(decode).collect()
}

/// [`RunStore::prune_runs`](outbox_core::RunStore::prune_runs): one `DELETE`
/// of finished runs by the database's clock.
pub async fn prune_runs(db: &(impl Database + ?Sized), older_than: Duration) -> Result<u64> {
    let what = "pruning finished runs";
    let mut tx = db.begin().await?;
    let n = tx
        .execute(
            what,
            &db.dialect().sql(
                "DELETE FROM outbox_runs WHERE state IN ('completed', 'failed', 'cancelled') \
                 AND updated_at <= {now} - $1",
            ),
            &[Arg::Int(duration_millis(older_than))],
        )
        .await?;
    tx.commit(what).await?;
    Ok(n)
}
