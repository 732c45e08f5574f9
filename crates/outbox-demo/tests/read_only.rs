//! Inspection with read access only (issue 44): `report`, `row` and the
//! other read-only commands, and `serve` with its background figures, run
//! on SQLite databases given as `sqlite://path?mode=ro`, on files this user
//! cannot write (chmod 0400) and in a read-only directory, and leave every
//! file beside them exactly as it was (names, bytes, modification times:
//! no migration, no WAL switch, no `-wal` or `-shm` file, no checkpoint).
//! The monitor refuses every action with one line saying the journal is
//! read-only; the commands that write refuse a `?mode=ro` URL with one
//! line, before anything is opened; a schema behind this build is refused
//! with one line naming `migrate`. Nothing here waits on a clock.

mod support;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::SystemTime;

use support::{Server, Site, TOKEN};

const LISTENING: &str = "serving the";

/// Every file of the site's directory: its bytes and modification time.
fn files(dir: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            let e = e.expect("entry");
            let meta = e.metadata().expect("metadata");
            (
                e.file_name().to_string_lossy().into_owned(),
                (
                    std::fs::read(e.path()).expect("read"),
                    meta.modified().expect("mtime"),
                ),
            )
        })
        .collect()
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// The cursed campaign `c-bad` (dead at seq 4, three rows behind) and a
/// clean one, every process closed (no `-wal` file left).
fn site() -> Site {
    let site = Site::migrated();
    site.seed_with_dead(&[("c-bad", true), ("c-ok1", false)]);
    site
}

/// The URLs of the site's two databases with `?mode=ro`.
fn read_only_urls(site: &Site) -> [(&'static str, String); 2] {
    [
        (
            "OUTBOX_JOURNAL_URL",
            format!("sqlite://{}?mode=ro", site.journal.display()),
        ),
        (
            "OUTBOX_PROJECTION_URL",
            format!("sqlite://{}?mode=ro", site.projection.display()),
        ),
    ]
}

/// The read-only commands answer from the files as they are.
fn inspect(site: &Site, env: &[(&str, &str)], how: &str) {
    let report = site.ok_env(&["report", "--json", "--limit", "10"], env);
    let report: serde_json::Value = serde_json::from_str(&report).expect("report JSON");
    assert_eq!(report["dead"], 1, "{how}: {report}");
    assert_eq!(report["pending"], 3, "{how}: {report}");
    let row = site.ok_env(&["row", "--stream", "c-bad", "--seq", "4", "--json"], env);
    assert!(row.contains("\"dead\""), "{how}: {row}");
    let text = site.ok_env(&["report", "--blocked"], env);
    assert!(text.contains("c-bad/4"), "{how}: {text}");
    for args in [
        &["workers"][..],
        &["leases"],
        &["runs", "list"],
        &["partitions"],
        &["sinks"],
        &["consumers"],
        &["skipped"],
    ] {
        site.ok_env(args, env);
    }
}

/// The monitor on read-only databases, with the operator token set: pages
/// and `/metrics` answer (the figures were computed), every action is
/// refused with one line saying the journal is read-only.
fn monitor(site: &Site, env: &[(&str, &str)], how: &str) {
    let mut cmd = site.command(&["serve", "--addr", "127.0.0.1:0"]);
    cmd.env("OUTBOX_SERVE_TOKEN", TOKEN).envs(env.iter().copied());
    let server = Server::spawn(cmd, LISTENING);
    let overview = server.get("/");
    assert_eq!(overview.status, 200, "{how}: {overview:?}");
    assert!(
        overview
            .body
            .contains("<span id=\"count-dead\" class=\"dead\">1</span>"),
        "{how}: {}",
        overview.body
    );
    assert!(
        overview.body.contains("id=\"read-only\"") && overview.body.contains("the journal is open read-only"),
        "{how}: {}",
        overview.body
    );
    assert!(
        overview.body.contains("id=\"figures-as-of\"") && !overview.body.contains("figures-error"),
        "{how}: the background figures were computed: {}",
        overview.body
    );
    for path in ["/blocked", "/dead", "/row?stream=c-bad&seq=4"] {
        let r = server.get(path);
        assert_eq!(r.status, 200, "{how} {path}: {r:?}");
        assert!(
            !r.body.contains("method=\"post\""),
            "{how} {path}: no action form"
        );
    }
    let metrics = server.get("/metrics");
    assert_eq!(metrics.status, 200, "{how}: {metrics:?}");
    assert!(
        metrics.body.contains("outbox_rows{status=\"dead\"} 1"),
        "{how}: {}",
        metrics.body
    );
    let auth = format!("Bearer {TOKEN}");
    for (path, body) in [
        ("/actions/requeue", format!("stream=c-bad&seq=4&token={TOKEN}")),
        ("/actions/retry", format!("stream=c-bad&seq=5&token={TOKEN}")),
        ("/actions/requeue-dead", format!("limit=10&token={TOKEN}")),
        (
            "/actions/pause-consumer",
            format!("sink=projection:campaigns&token={TOKEN}"),
        ),
    ] {
        let r = server.post(path, &body, &[("Authorization", &auth)]);
        assert_eq!(r.status, 403, "{how} {path}: {r:?}");
        assert!(
            r.body.contains("the journal is open read-only") && r.body.lines().count() == 1,
            "{how} {path}: {r:?}"
        );
    }
    let status = server.stop();
    assert!(status.success(), "{how}: {status:?}");
}

#[test]
fn a_journal_given_with_mode_ro_is_inspected_and_served_without_a_write() {
    let site = site();
    let before = files(&site.dir);
    let urls = read_only_urls(&site);
    let env: Vec<(&str, &str)> = urls.iter().map(|(k, v)| (*k, v.as_str())).collect();
    inspect(&site, &env, "?mode=ro");
    monitor(&site, &env, "?mode=ro");
    // The commands that write refuse at once, one line, nothing opened.
    for args in [
        &["requeue", "--stream", "c-bad", "--seq", "4"][..],
        &["requeue-dead", "--limit", "10"],
        &["retry", "--stream", "c-bad", "--seq", "5"],
        &["migrate"],
        &["work", "--once"],
        &["leases", "--break", "c-bad", "--yes"],
        // It builds the runtime, which sets the projections up.
        &["wait", "--stream", "c-ok1", "--seq", "1"],
    ] {
        let (code, out, err) = site.run_env(args, &env);
        assert_eq!(code, Some(2), "`{}`: {err}", args.join(" "));
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("writes to the databases, which are given read-only (?mode=ro)"),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
    assert_eq!(files(&site.dir), before, "a file was created or changed");
}

#[test]
fn files_this_user_cannot_write_are_inspected_and_served_without_a_write() {
    let site = site();
    chmod(&site.journal, 0o400);
    chmod(&site.projection, 0o400);
    let before = files(&site.dir);
    inspect(&site, &[], "chmod 0400");
    monitor(&site, &[], "chmod 0400");
    // A command that writes is refused with one line, the file unchanged.
    let (code, _, err) = site.run_env(&["requeue", "--stream", "c-bad", "--seq", "4"], &[]);
    assert_ne!(code, Some(0), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("read-only"), "{err}");
    assert_eq!(files(&site.dir), before, "a file was created or changed");
    chmod(&site.journal, 0o600);
    chmod(&site.projection, 0o600);
}

#[test]
fn a_read_only_directory_is_inspected_and_served_without_a_write() {
    let site = site();
    let before = files(&site.dir);
    chmod(&site.dir, 0o500);
    inspect(&site, &[], "read-only directory");
    monitor(&site, &[], "read-only directory");
    chmod(&site.dir, 0o700);
    assert_eq!(files(&site.dir), before, "a file was created or changed");
}

#[test]
fn a_schema_behind_this_build_on_a_read_only_journal_names_migrate() {
    let site = site();
    // Undo the journal's last migration's record: its schema is behind.
    outbox_sqlite::rusqlite::Connection::open(&site.journal)
        .and_then(|c| {
            c.execute_batch(
                "DELETE FROM _outbox_migrations WHERE version = (SELECT MAX(version) FROM _outbox_migrations)",
            )
        })
        .expect("delete");
    chmod(&site.journal, 0o400);
    let before = files(&site.dir);
    for args in [&["report"][..], &["serve", "--addr", "127.0.0.1:0"]] {
        let (code, out, err) = site.run_env(args, &[]);
        assert_eq!(code, Some(5), "`{}`: {err}", args.join(" "));
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("open read-only")
                && err.contains("`outbox-demo migrate`")
                && err.contains("older than"),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
    assert_eq!(files(&site.dir), before, "a file was created or changed");
    chmod(&site.journal, 0o600);
}

/// A monitor that read the journal as a snapshot (read-only, no `-wal`
/// beside it) says so once a process opens the journal for writing: its
/// pages do not show that process's writes.
#[test]
fn a_snapshot_monitor_warns_once_a_process_opens_the_journal() {
    let site = site();
    let urls = read_only_urls(&site);
    let mut cmd = site.command(&["serve", "--addr", "127.0.0.1:0"]);
    cmd.envs(urls.iter().map(|(k, v)| (*k, v.as_str())));
    let server = Server::spawn(cmd, LISTENING);
    let warning = "these pages do not show its writes";
    let page = server.get("/").body;
    assert!(!page.contains(warning), "{page}");
    let writer = support::block_on(outbox_sqlite::SqliteJournal::open(
        &site.journal,
        outbox_sqlite::SqliteOptions::default(),
    ))
    .expect("a writer opens the journal");
    let page = server.get("/").body;
    assert!(page.contains(warning), "{page}");
    support::block_on(writer.close());
    let status = server.stop();
    assert!(status.success(), "{status:?}");
}
