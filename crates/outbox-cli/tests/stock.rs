//! The stock `outbox` binary (no projections) against an application's
//! databases: the commands that need no projections work and never touch the
//! projection database; the ones that apply events refuse with one line.
// SQLite stores and the SQLite `App` registration: the default feature.
#![cfg(feature = "sqlite")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use outbox_core::{
    BoxError, Event, EventTypeRegistry, ExpectedVersion, ProjectionName, RetryPolicy, StreamId,
    ViewProjection, ViewTx, async_trait,
};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox");

/// An application that is not the demo: parcels and their scans; a scan of
/// an unknown parcel is an applier error.
struct Parcels(ProjectionName);

#[async_trait]
impl ViewProjection for Parcels {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event) -> Result<(), BoxError> {
        let parcel = e.stream.as_str();
        match e.event_type.as_str() {
            "registered" => view.put("parcels", parcel, &0u64).await?,
            "scanned" => {
                let scans: u64 = view
                    .get("parcels", parcel)
                    .await?
                    .ok_or("scanned before registered")?;
                view.put("parcels", parcel, &(scans + 1)).await?;
            }
            other => return Err(format!("unknown event type {other}").into()),
        }
        Ok(())
    }
}

struct Site {
    _tmp: tempfile::TempDir,
    journal: PathBuf,
    projection: PathBuf,
}

/// The application's databases: three parcels applied by its worker, a
/// fourth whose first event is dead (scanned before registered), one row
/// behind it.
async fn application() -> Site {
    let tmp = tempfile::tempdir().expect("tempdir");
    let journal = tmp.path().join("parcels-journal.db");
    let projection = tmp.path().join("parcels-views.db");
    let opts = SqliteOptions::default();
    let j = SqliteJournal::open(&journal, opts.clone())
        .await
        .expect("journal");
    let p = SqliteProjectionStore::open(&projection, opts)
        .await
        .expect("projections");
    let mut types = EventTypeRegistry::new();
    types.apply("registered").unwrap().apply("scanned").unwrap();
    let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
    let rt = Outbox::builder(j.clone(), p.clone())
        .config(Config::apply_worker().with_retry(retry))
        .event_types(types)
        .view(Parcels(ProjectionName::new("parcels").unwrap()))
        .build()
        .await
        .expect("runtime");
    for n in 1..=3 {
        let s = StreamId::new(format!("parcel-{n}")).unwrap();
        let events = vec![
            rt.event("registered", "{}").unwrap(),
            rt.event("scanned", "{}").unwrap(),
        ];
        rt.append(&s, ExpectedVersion::NoStream, events).await.unwrap();
    }
    let lost = StreamId::new("parcel-lost").unwrap();
    let events = vec![
        rt.event("scanned", "{}").unwrap(),
        rt.event("registered", "{}").unwrap(),
    ];
    rt.append(&lost, ExpectedVersion::NoStream, events).await.unwrap();
    let mut dead = 0;
    for _ in 0..100 {
        let t = rt.tick().await.expect("tick");
        dead += t.dead_lettered;
        if dead == 1 && t.claimed == 0 {
            break;
        }
    }
    assert_eq!(dead, 1, "the lost parcel's first scan is dead");
    j.close().await;
    p.close().await;
    Site {
        _tmp: tmp,
        journal,
        projection,
    }
}

fn outbox(site: &Site, args: &[&str]) -> Output {
    outbox_on(&site.journal, &site.projection, args)
}

/// `outbox` on these two files, with no OUTBOX_* variable of the test's
/// environment.
fn outbox_on(journal: &Path, projection: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OUTBOX_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("--journal")
        .arg(format!("sqlite://{}", journal.display()))
        .arg("--projection-db")
        .arg(format!("sqlite://{}", projection.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run outbox")
}

fn ok_json(site: &Site, args: &[&str]) -> Value {
    let out = outbox(site, args);
    assert!(
        out.status.success(),
        "`outbox {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("`outbox {}`: not JSON: {e}", args.join(" ")))
}

/// The projection database's files (the main file and any -wal/-shm) with their bytes.
fn projection_files(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let dir = path.parent().unwrap();
    let stem = path.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&stem)
                .then(|| (name, std::fs::read(e.path()).unwrap()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_commands_leave_the_projection_database_byte_for_byte() {
    let site = application().await;
    let before = projection_files(&site.projection);
    assert!(!before.is_empty());

    let report = ok_json(&site, &["report", "--json"]);
    assert_eq!(
        (&report["dead"], &report["total"]),
        (&0.into(), &0.into()),
        "every row is done: {report}"
    );
    let x = &report["projection_exceptions"];
    assert_eq!(x["dead"], 1, "the projection is dead on one stream: {report}");
    let dead = &x["listed"][0];
    assert_eq!(
        (&dead["projection"], &dead["stream"], &dead["seq"]),
        (&"parcels".into(), &"parcel-lost".into(), &1.into()),
        "{report}"
    );
    assert!(
        dead["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("scanned before registered")),
        "{report}"
    );
    assert!(
        report["digests"].is_null(),
        "no projections, no digests: {report}"
    );

    let workers = ok_json(&site, &["workers", "--json"]);
    assert_eq!(
        workers,
        serde_json::json!([]),
        "the application's worker deregistered"
    );
    let runs = ok_json(&site, &["runs", "list", "--json"]);
    assert_eq!(runs, serde_json::json!([]));

    let missing = outbox(&site, &["row", "--stream", "parcel-1", "--seq", "1"]);
    assert_eq!(missing.status.code(), Some(3), "an applied event has no row");
    assert_eq!(String::from_utf8_lossy(&missing.stderr).lines().count(), 1);
    let done = ok_json(
        &site,
        &["requeue", "--stream", "parcel-lost", "--seq", "1", "--json"],
    );
    assert!(done["row"].is_null(), "{done}");
    let requeued = &done["projections"][0];
    assert_eq!(
        (
            &requeued["projection"],
            &requeued["status"],
            &requeued["attempt_count"]
        ),
        (&"parcels".into(), &"failed".into(), &0.into()),
        "{done}"
    );
    let report = ok_json(&site, &["report", "--json", "--status", "failed"]);
    assert_eq!(
        (
            report["projection_exceptions"]["dead"].as_u64(),
            report["projection_exceptions"]["failed"].as_u64()
        ),
        (Some(0), Some(1)),
        "{report}"
    );

    let requeued = ok_json(&site, &["requeue-dead", "--limit", "10", "--json"]);
    assert_eq!(
        requeued,
        serde_json::json!({"rows": [], "projections": []}),
        "nothing dead any more"
    );

    let retried = ok_json(
        &site,
        &["retry", "--stream", "parcel-lost", "--seq", "1", "--json"],
    );
    assert_eq!(retried["projections"][0]["status"], "failed", "{retried}");
    let leases = ok_json(&site, &["leases", "--json"]);
    assert_eq!(
        leases,
        serde_json::json!([]),
        "the application's worker released its leases"
    );
    assert!(report["lag"].is_null(), "no projections, no lag: {report}");

    // The application's projection is known from the store; a typo is not.
    let checks = ok_json(&site, &["verify", "--projection", "parcels", "--json"]);
    assert_eq!(checks[0]["recorded"]["projection"], "parcels", "{checks}");
    let listed = ok_json(&site, &["generations", "--projection", "parcels", "--json"]);
    assert_eq!(listed[0]["projection"], "parcels", "{listed}");
    for args in [
        &["verify", "--projection", "parcel"][..],
        &["generations", "--projection", "parcel"],
    ] {
        let out = outbox(&site, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "`outbox {}`: {stderr}",
            args.join(" ")
        );
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("projection `parcel`"), "{stderr}");
    }

    assert_eq!(
        projection_files(&site.projection),
        before,
        "the stock commands changed the projection database"
    );

    // No demo (or any other) projection exists in it: only the application's documents.
    let p = SqliteProjectionStore::open(&site.projection, SqliteOptions::default())
        .await
        .unwrap();
    let (projections, tables): (Vec<String>, Vec<String>) = p
        .read(|conn| {
            let all = |sql: &str| -> outbox_sqlite::rusqlite::Result<Vec<String>> {
                conn.prepare(sql)?.query_map([], |r| r.get(0))?.collect()
            };
            Ok((
                all("SELECT DISTINCT projection FROM outbox_views ORDER BY 1")?,
                all(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'outbox%' \
                     AND name NOT LIKE '\\_outbox%' ESCAPE '\\' AND name NOT LIKE 'sqlite%' ORDER BY 1",
                )?,
            ))
        })
        .await
        .unwrap();
    assert_eq!(projections, ["parcels"]);
    assert_eq!(tables, Vec::<String>::new(), "tables outside the outbox's own");
    p.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_apply_events_refuse_without_projections() {
    let site = application().await;
    let before = projection_files(&site.projection);
    for args in [
        &["work", "--once"][..],
        &["replay", "--all"],
        &["rebuild", "--projection", "parcels"],
        &["gaps"],
    ] {
        let out = outbox(&site, args);
        assert_eq!(out.status.code(), Some(2), "`outbox {}`", args.join(" "));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("needs projections and this binary has none"),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
    assert_eq!(projection_files(&site.projection), before);
}

/// An application's projection database of an older schema (created before
/// this build's last projection migration) is refused by the inspection
/// commands, with every file left as it was; `migrate` upgrades it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_is_refused_unchanged_until_migrated() {
    let site = application().await;
    // Roll the projection database back to the schema before the last migration.
    {
        let conn = outbox_sqlite::rusqlite::Connection::open(&site.projection).unwrap();
        let last: i64 = conn
            .query_row("SELECT MAX(version) FROM _outbox_migrations", [], |r| r.get(0))
            .unwrap();
        conn.execute("DELETE FROM _outbox_migrations WHERE version = ?1", [last])
            .unwrap();
        // The last projection migration (0008) adds the skip records' table.
        assert_eq!(
            last, 8,
            "this test undoes migration 0008: update it with the last migration"
        );
        conn.execute_batch("DROP TABLE outbox_skipped").unwrap();
    }
    let before = projection_files(&site.projection);
    for args in [&["report", "--json"][..], &["runs", "list"], &["workers"]] {
        let out = outbox(&site, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(5),
            "`outbox {}`: {stderr}",
            args.join(" ")
        );
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains("older than this build"), "{stderr}");
        assert!(stderr.contains("run `migrate`"), "{stderr}");
    }
    assert_eq!(
        projection_files(&site.projection),
        before,
        "refused: nothing changed"
    );
    let out = outbox(&site, &["migrate"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = ok_json(&site, &["report", "--json"]);
    assert_eq!(report["projection_exceptions"]["dead"], 1, "{report}");
}

/// A journal path that names another application's SQLite file (a typo at
/// 3 a.m.) is refused as holding no outbox tables, pointing at the path
/// before `migrate`, and the file is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_another_application_is_refused_as_holding_no_outbox() {
    let site = application().await;
    let foreign = site.journal.with_file_name("users.db");
    {
        outbox_sqlite::rusqlite::Connection::open(&foreign)
            .and_then(|c| c.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)"))
            .unwrap();
    }
    let before = std::fs::read(&foreign).unwrap();
    let out = outbox_on(&foreign, &site.projection, &["report"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("users.db holds no outbox tables") && stderr.contains("check the path"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&foreign).unwrap(), before, "the file changed");
}
