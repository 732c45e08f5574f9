//! Skip records of the projection database (ADR 0032): written and taken
//! inside the apply transaction, listed for operators.

use outbox_core::spi::{projection_undecodable, truncate_error, validate_limit};
use outbox_core::{MAX_PAGE, ProjectionName, Result, Seq, SkippedEvent, StreamId, Timestamp};

use crate::{Arg, Conn, Database, Dialect};

/// [`ApplyTx::record_skip`](outbox_core::spi::ApplyTx::record_skip) on the
/// transaction's connection.
pub async fn record_skip_in(
    dialect: &Dialect,
    tx: &mut (impl Conn + ?Sized),
    projection: &ProjectionName,
    stream: &StreamId,
    seq: Seq,
    error: &str,
) -> Result<()> {
    tx.execute(
        "recording a skipped event",
        &dialect.sql(
            "INSERT INTO outbox_skipped (projection, stream, seq, error, skipped_at) \
             VALUES ($1, $2, $3, $4, {now}) ON CONFLICT (projection, stream, seq) DO UPDATE \
             SET error = excluded.error, skipped_at = excluded.skipped_at",
        ),
        &[
            Arg::Text(projection.as_str()),
            Arg::Text(stream.as_str()),
            Arg::Int(i64::try_from(seq.get()).unwrap_or(i64::MAX)),
            Arg::Text(truncate_error(error)),
        ],
    )
    .await?;
    Ok(())
}

/// [`ApplyTx::take_skip`](outbox_core::spi::ApplyTx::take_skip) on the
/// transaction's connection (on Postgres the delete waits for a concurrent
/// one, then finds nothing).
pub async fn take_skip_in(
    dialect: &Dialect,
    tx: &mut (impl Conn + ?Sized),
    projection: &ProjectionName,
    stream: &StreamId,
    seq: Seq,
) -> Result<bool> {
    let deleted = tx
        .execute(
            "taking a skip record",
            &dialect.sql("DELETE FROM outbox_skipped WHERE projection = $1 AND stream = $2 AND seq = $3"),
            &[
                Arg::Text(projection.as_str()),
                Arg::Text(stream.as_str()),
                Arg::Int(i64::try_from(seq.get()).unwrap_or(i64::MAX)),
            ],
        )
        .await?;
    Ok(deleted > 0)
}

/// Deletes every skip record of `projection` (a reset applies everything again).
pub async fn clear_skips_in(
    dialect: &Dialect,
    tx: &mut (impl Conn + ?Sized),
    projection: &ProjectionName,
) -> Result<()> {
    tx.execute(
        "clearing skip records",
        &dialect.sql("DELETE FROM outbox_skipped WHERE projection = $1"),
        &[Arg::Text(projection.as_str())],
    )
    .await?;
    Ok(())
}

/// [`SkippedEvents::skipped`](outbox_core::SkippedEvents::skipped).
pub async fn skipped(
    db: &(impl Database + ?Sized),
    projection: Option<&ProjectionName>,
    limit: usize,
) -> Result<Vec<SkippedEvent>> {
    let limit = validate_limit(limit, MAX_PAGE)?;
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "listing skipped events",
            &db.dialect().sql(
                "SELECT projection, stream, seq, error, skipped_at FROM outbox_skipped \
                 WHERE ($1 = '' OR projection = $1) ORDER BY projection, stream, seq LIMIT $2",
            ),
            &[
                Arg::Text(projection.map_or("", ProjectionName::as_str)),
                Arg::Int(i64::try_from(limit).unwrap_or(i64::MAX)),
            ],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let bad = |e: outbox_core::Error| projection_undecodable("skip record", e);
            Ok(SkippedEvent {
                projection: ProjectionName::new(r.text(0).map_err(bad)?).map_err(bad)?,
                stream: StreamId::new(r.text(1).map_err(bad)?).map_err(bad)?,
                seq: Seq::new(u64::try_from(r.int(2).map_err(bad)?).unwrap_or(0)).map_err(bad)?,
                error: r.text(3).map_err(bad)?,
                skipped_at: Timestamp::from_millis(r.int(4).map_err(bad)?),
            })
        })
        .collect()
}
