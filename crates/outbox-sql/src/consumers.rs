//! [`ConsumerRegistry`](outbox_core::ConsumerRegistry) on the shared
//! statements: the consumers the journal database knows (ADR 0032). The
//! adapters implement the port by calling these.

use outbox_core::spi::journal_undecodable;
use outbox_core::{ConsumerInfo, ConsumerKind, Result, SinkName, Timestamp, WorkerId, validate_code_version};

use crate::{Arg, Database};

/// [`ConsumerRegistry::register_consumers`](outbox_core::ConsumerRegistry::register_consumers):
/// one upsert per consumer, in one transaction.
pub async fn register_consumers(
    db: &(impl Database + ?Sized),
    consumers: &[(SinkName, ConsumerKind)],
    version: &str,
    worker: &WorkerId,
) -> Result<()> {
    validate_code_version(version)?;
    if consumers.is_empty() {
        return Ok(());
    }
    let what = "registering consumers";
    let sql = db.dialect().sql(
        "INSERT INTO outbox_consumers (consumer, kind, version, first_seen, last_seen, last_worker) \
         VALUES ($1, $2, $3, {now}, {now}, $4) ON CONFLICT (consumer) DO UPDATE SET kind = excluded.kind, \
         version = excluded.version, last_seen = excluded.last_seen, last_worker = excluded.last_worker",
    );
    let mut tx = db.begin().await?;
    for (key, kind) in consumers {
        tx.execute(
            what,
            &sql,
            &[
                Arg::Text(key.as_str()),
                Arg::Text(kind.as_str()),
                Arg::Text(version),
                Arg::Text(worker.as_str()),
            ],
        )
        .await?;
    }
    tx.commit(what).await
}

/// [`ConsumerRegistry::consumers`](outbox_core::ConsumerRegistry::consumers).
pub async fn consumers(db: &(impl Database + ?Sized)) -> Result<Vec<ConsumerInfo>> {
    let mut conn = db.read().await?;
    let rows = conn
        .fetch(
            "listing consumers",
            "SELECT consumer, kind, version, first_seen, last_seen, last_worker, paused FROM outbox_consumers \
             ORDER BY consumer",
            &[],
        )
        .await?;
    let bad = |e: &dyn std::fmt::Display| journal_undecodable("consumer", e.to_string());
    rows.iter()
        .map(|r| {
            Ok(ConsumerInfo {
                key: SinkName::new(r.text(0)?).map_err(|e| bad(&e))?,
                kind: r.text(1)?.parse().map_err(|e: outbox_core::Error| bad(&e))?,
                version: r.text(2)?,
                first_seen: Timestamp::from_millis(r.int(3)?),
                last_seen: Timestamp::from_millis(r.int(4)?),
                last_worker: WorkerId::new(r.text(5)?).map_err(|e| bad(&e))?,
                paused: r.int(6)? != 0,
            })
        })
        .collect()
}

/// [`ConsumerRegistry::set_paused`](outbox_core::ConsumerRegistry::set_paused).
pub async fn set_paused(db: &(impl Database + ?Sized), key: &SinkName, paused: bool) -> Result<bool> {
    let what = "pausing or resuming a consumer";
    let mut tx = db.begin().await?;
    let changed = tx
        .execute(
            what,
            &db.dialect()
                .sql("UPDATE outbox_consumers SET paused = $2 WHERE consumer = $1 AND paused <> $2"),
            &[Arg::Text(key.as_str()), Arg::Int(i64::from(paused))],
        )
        .await?;
    if changed == 0 {
        let known = tx
            .fetch_optional(
                what,
                &db.dialect()
                    .sql("SELECT paused FROM outbox_consumers WHERE consumer = $1"),
                &[Arg::Text(key.as_str())],
            )
            .await?;
        if known.is_none() {
            return Err(outbox_core::Error::NotFound(format!(
                "no consumer {key} is registered"
            )));
        }
    }
    tx.commit(what).await?;
    Ok(changed > 0)
}

/// [`ConsumerRegistry::retire_consumer`](outbox_core::ConsumerRegistry::retire_consumer):
/// the registry row and the per-stream states, in one transaction.
pub async fn retire_consumer(db: &(impl Database + ?Sized), key: &SinkName) -> Result<bool> {
    let what = "retiring a consumer";
    let args = [Arg::Text(key.as_str())];
    let mut tx = db.begin().await?;
    let registered = tx
        .execute(
            what,
            &db.dialect()
                .sql("DELETE FROM outbox_consumers WHERE consumer = $1"),
            &args,
        )
        .await?;
    let states = tx
        .execute(
            what,
            &db.dialect()
                .sql("DELETE FROM outbox_sink_streams WHERE sink = $1"),
            &args,
        )
        .await?;
    tx.commit(what).await?;
    Ok(registered + states > 0)
}
