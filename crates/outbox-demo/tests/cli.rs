//! Integration tests of the `outbox` commands as an application's binary
//! runs them (`outbox-demo`: every `outbox` command on the demo's
//! projections, plus `demo`): the real executable against real SQLite files
//! in a temporary directory.
//!
//! Fixtures are made by the binary itself (`migrate`, `demo`)
//! or, where the CLI has no command for it (appending events, producing dead
//! rows, an active run of another owner), through the library the binary is
//! built on. Databases are passed through `OUTBOX_JOURNAL_URL` and
//! `OUTBOX_PROJECTION_URL`, like a deployment would; every other `OUTBOX_*`
//! variable of the test's environment is removed.
//!
//! Refused input is checked for three things: the documented exit code, a
//! one-line message on stderr, and no change to any file (every file of the
//! directory is compared byte for byte, so a new file is a change too).

use outbox_core::OutboxQueueExt as _;
use outbox_core::SinkFeed as _;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, LeaseStore, NewEvent, OutboxInspector,
    OutboxQueue, ProjectionName, RetryPolicy, RunKind, RunStore, Seq, StreamId, WorkerId,
};
use outbox_demo::domain::{self, Faults, Payload};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-demo");
const PROJECTIONS: [&str; 3] = ["campaign_summary", "roster", "character_tally"];
/// Events per campaign appended by [`campaign`]; the dice roll at seq 4 is the cursed one.
const PER_CAMPAIGN: u64 = 7;
const CURSED_SEQ: u64 = 4;
/// Every bounded wait gives up after this long, with a message.
const PATIENCE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

/// A temporary directory with the two database paths (not created).
struct Site {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    journal: PathBuf,
    projection: PathBuf,
}

/// A finished command.
struct Run {
    args: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(args: &[&str], out: Output) -> Run {
        Run {
            args: args.join(" "),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn explain(&self) -> String {
        format!(
            "`outbox {}` exited with {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args, self.code, self.stdout, self.stderr
        )
    }
}

impl Site {
    fn new() -> Site {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().canonicalize().expect("canonical tempdir");
        Site {
            journal: dir.join("journal.db"),
            projection: dir.join("projections.db"),
            dir,
            _tmp: tmp,
        }
    }

    /// `outbox migrate`: both databases created and migrated.
    fn migrated() -> Site {
        let site = Site::new();
        site.ok(&["migrate"]);
        site
    }

    /// The binary with this site's databases and no inherited OUTBOX_* variable.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OUTBOX_") {
                cmd.env_remove(k);
            }
        }
        cmd.env(
            "OUTBOX_JOURNAL_URL",
            format!("sqlite://{}", self.journal.display()),
        )
        .env(
            "OUTBOX_PROJECTION_URL",
            format!("sqlite://{}", self.projection.display()),
        )
        .current_dir(&self.dir)
        .args(args)
        .stdin(Stdio::null());
        cmd
    }

    fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut cmd = self.command(args);
        cmd.envs(env.iter().copied());
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn outbox");
        Run::from(args, wait_output(child, &args.join(" ")))
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_env(args, &[])
    }

    /// Runs a command with its stdout going to `stdout` (its `Run` has
    /// an empty stdout).
    fn run_to(&self, args: &[&str], stdout: impl Into<Stdio>) -> Run {
        let out = self
            .command(args)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .output()
            .expect("run outbox");
        Run::from(args, out)
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        self.ok_env(args, &[])
    }

    fn ok_env(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let r = self.run_env(args, env);
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r.stdout
    }

    /// Runs a `--json` command that must succeed and parses its stdout.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("`outbox {}`: not JSON ({e}):\n{out}", args.join(" ")))
    }

    /// `report --json` without digests.
    fn report(&self) -> Value {
        self.json(&["report", "--json", "--no-digests", "--limit", "1000"])
    }

    /// Every file of the directory with its bytes.
    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        snapshot(&self.dir)
    }

    /// Runs a command that must be refused: exit `code`, ONE line on stderr
    /// that contains every one of `mentions`, nothing on stdout, and no file
    /// of the directory changed, created or removed. Returns the line.
    fn refused(&self, args: &[&str], env: &[(&str, &str)], code: i32, mentions: &[&str]) -> String {
        let before = self.snapshot();
        let r = self.run_env(args, env);
        assert_eq!(r.code, Some(code), "wrong exit code; {}", r.explain());
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "stderr must be one line; {}", r.explain());
        for m in mentions {
            assert!(
                lines[0].contains(m),
                "stderr does not mention {m:?}; {}",
                r.explain()
            );
        }
        assert!(r.stdout.is_empty(), "nothing on stdout; {}", r.explain());
        assert_same_files(&before, &self.snapshot(), &r.args);
        lines[0].to_string()
    }

    /// The library runtime on this site's files, with the demo's projections.
    async fn library(&self, config: Config, faults: &Faults) -> Outbox<SqliteJournal, SqliteProjectionStore> {
        let opts = SqliteOptions::default();
        let journal = SqliteJournal::open(&self.journal, opts.clone())
            .await
            .expect("open journal");
        let store = SqliteProjectionStore::open(&self.projection, opts)
            .await
            .expect("open projection db");
        let mut b = Outbox::builder(journal, store)
            .config(config)
            .event_types(domain::event_types());
        for p in domain::projections(faults) {
            b = b.view_arc(p);
        }
        b.build().await.expect("build runtime")
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        if path.is_dir() {
            for (k, v) in snapshot(&path) {
                out.insert(format!("{name}/{k}"), v);
            }
        } else {
            out.insert(name, fs::read(&path).expect("read file"));
        }
    }
    out
}

fn assert_same_files(before: &BTreeMap<String, Vec<u8>>, after: &BTreeMap<String, Vec<u8>>, what: &str) {
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(before),
        names(after),
        "`outbox {what}` created or removed files"
    );
    for (name, bytes) in before {
        assert!(after[name] == *bytes, "`outbox {what}` changed {name}");
    }
}

/// Waits for a child with a bound, killing it (and failing) if it hangs.
fn wait_output(mut child: Child, what: &str) -> Output {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("collect output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("collect output");
                panic!(
                    "`outbox {what}` did not exit within {PATIENCE:?}\n--- stdout\n{}\n--- stderr\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn wait_status(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not happen within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `check` until it returns true, failing with `what` after the bound.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// The digests of a full `report --json`: (per projection, store).
fn digests(site: &Site) -> (Vec<(String, String)>, String) {
    let r = site.json(&["report", "--json", "--limit", "0"]);
    let d = &r["digests"];
    let per = d["projections"]
        .as_array()
        .expect("digests.projections")
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (per, d["store"].as_str().expect("digests.store").to_string())
}

// ---------------------------------------------------------------------------
// Fixtures through the library
// ---------------------------------------------------------------------------

fn payload(p: Payload) -> Vec<u8> {
    serde_json::to_vec(&p).expect("payload")
}

/// Seven events of one campaign; the d20 roll at seq 4 is cursed when asked
/// (the tally projection fails on it until the fix is deployed).
fn campaign(types: &outbox_core::EventTypeRegistry, name: &str, cursed: bool) -> Vec<NewEvent> {
    let ev = |t: &str, p: Payload| types.event(t, payload(p)).expect("registered type");
    vec![
        ev(
            "campaign_created",
            Payload {
                name: Some(format!("The Saga of {name}")),
                ..Payload::default()
            },
        ),
        ev(
            "player_joined",
            Payload {
                player: Some("p1".into()),
                ..Payload::default()
            },
        ),
        ev(
            "character_created",
            Payload {
                character: Some("Aria".into()),
                player: Some("p1".into()),
                ..Payload::default()
            },
        ),
        ev(
            "dice_rolled",
            Payload {
                character: Some("Aria".into()),
                sides: Some(20),
                result: Some(20),
                cursed: cursed.then_some(true),
                ..Payload::default()
            },
        ),
        ev(
            "scene_changed",
            Payload {
                scene: Some("the crypt".into()),
                ..Payload::default()
            },
        ),
        ev(
            "chat_message",
            Payload {
                player: Some("p1".into()),
                text: Some("well met".into()),
                ..Payload::default()
            },
        ),
        ev(
            "dice_rolled",
            Payload {
                character: Some("Aria".into()),
                sides: Some(6),
                result: Some(3),
                ..Payload::default()
            },
        ),
    ]
}

/// Appends the campaigns (one append each, in order) with the outbox on and
/// no worker running: every event has a `pending` row, nothing is applied.
fn seed_backlog(site: &Site, campaigns: &[(&str, bool)]) {
    block_on(async {
        let rt = site.library(Config::apply_worker(), &Faults::default()).await;
        for (name, cursed) in campaigns {
            let stream = StreamId::new(*name).unwrap();
            let events = campaign(rt.event_types(), name, *cursed);
            rt.append(&stream, ExpectedVersion::Exact(0), events)
                .await
                .expect("append");
        }
        rt.journal().close().await;
        rt.store().close().await;
    });
}

/// [`seed_backlog`], then one worker pass with the fix NOT deployed and a
/// dead-letter threshold of 1: every row is done, and `character_tally` is
/// dead on each cursed campaign at seq 4 (ADR 0032) while the other
/// projections applied it all.
fn seed_with_dead_projection(site: &Site, campaigns: &[(&str, bool)]) {
    seed_backlog(site, campaigns);
    block_on(async {
        let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
        let rt = site
            .library(Config::apply_worker().with_retry(retry), &Faults::default())
            .await;
        let tick = rt.tick().await.expect("tick");
        let cursed = campaigns.iter().filter(|(_, c)| *c).count() as u64;
        assert_eq!(tick.dead_lettered, cursed, "fixture: {tick:?}");
        let s = rt.journal().summary().await.unwrap();
        assert_eq!(s.total(), 0, "fixture: {s:?}");
        let dead = rt
            .projection_states(Some(outbox_core::SinkStatus::Dead), 100)
            .await
            .unwrap();
        assert_eq!(dead.len() as u64, cursed, "fixture: {dead:?}");
        assert!(
            dead.iter()
                .all(|d| d.sink.as_str() == "projection:character_tally" && d.seq + 1 == CURSED_SEQ),
            "fixture: {dead:?}"
        );
        rt.journal().close().await;
        rt.store().close().await;
    });
}

/// [`seed_backlog`], then, for each cursed campaign, the row of seq 4 dead
/// for every projection as a process-killing event leaves it (ADR 0029:
/// its attempts ended the process, so no projection could be blamed):
/// events 1..=3 applied, rows 5..=7 pending behind the dead head. Then one
/// worker pass applies the clean campaigns.
fn seed_with_dead(site: &Site, campaigns: &[(&str, bool)]) {
    use outbox_core::{LeaseStore, OutboxQueue, ProjectionStore, Seq, WorkerId};
    seed_backlog(site, campaigns);
    block_on(async {
        let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
        let rt = site
            .library(Config::apply_worker().with_retry(retry), &Faults::default())
            .await;
        let worker = WorkerId::new("fixture-worker").unwrap();
        let before = CURSED_SEQ - 1;
        for (name, _) in campaigns.iter().filter(|(_, c)| *c) {
            let stream = StreamId::new(*name).unwrap();
            let j = rt.journal();
            let (lease, rows) = j
                .acquire_and_claim(&stream, &worker, Duration::from_secs(60), before as usize)
                .await
                .unwrap()
                .expect("the stream is free");
            assert_eq!(rows.len() as u64, before, "fixture");
            let events = j.read_stream(&stream, Seq::FIRST, before as usize).await.unwrap();
            rt.store()
                .apply(&stream, &events, rt.projections())
                .await
                .expect("apply");
            j.complete(&stream, Seq::new(before).unwrap()).await.unwrap();
            let head = j.claim(&lease, 1).await.unwrap();
            assert_eq!(head[0].seq.get(), CURSED_SEQ, "fixture");
            let message = format!("cursed die on {name}/{CURSED_SEQ}: its attempts ended the process");
            j.fail(&lease, head[0].seq, &message, &retry).await.unwrap();
            j.release(&lease).await.unwrap();
        }
        rt.tick().await.expect("tick");
        let cursed = campaigns.iter().filter(|(_, c)| *c).count() as u64;
        let s = rt.journal().summary().await.unwrap();
        assert_eq!(
            (s.dead, s.pending, s.processing, s.failed),
            (cursed, cursed * 3, 0, 0),
            "fixture: {s:?}"
        );
        rt.journal().close().await;
        rt.store().close().await;
    });
}

/// Appends the campaigns to the journal only (no outbox rows, nothing
/// applied): what a crash in inline-apply mode leaves behind.
fn seed_journal_only(site: &Site, campaigns: &[&str]) {
    block_on(async {
        let journal = SqliteJournal::open(&site.journal, SqliteOptions::default())
            .await
            .unwrap();
        let types = domain::event_types();
        let batch: Vec<AppendRequest> = campaigns
            .iter()
            .map(|name| {
                AppendRequest::new(
                    StreamId::new(*name).unwrap(),
                    ExpectedVersion::Exact(0),
                    campaign(&types, name, false),
                )
            })
            .collect();
        journal
            .append(&batch, AppendOptions::journal_only())
            .await
            .expect("append");
        journal.close().await;
    });
}

/// The demo's files, everything applied (`outbox demo`, small sizes),
/// with the site's paths pointing at them.
fn demo_site() -> Site {
    let mut site = Site::new();
    let d = site.dir.join("d");
    site.ok(&[
        "demo",
        "--dir",
        d.to_str().unwrap(),
        "--campaigns",
        "5",
        "--events",
        "200",
    ]);
    site.journal = d.join("journal.db");
    site.projection = d.join("projections.db");
    site
}

// ---------------------------------------------------------------------------
// migrate, and files left behind
// ---------------------------------------------------------------------------

#[test]
fn migrate_creates_private_databases_and_reports_them() {
    let site = Site::new();
    let out = site.ok(&["migrate"]);
    assert!(
        out.contains(&format!("journal    {} (migrated)", site.journal.display())),
        "{out}"
    );
    assert!(
        out.contains("projections: campaign_summary, roster, character_tally"),
        "{out}"
    );
    assert_eq!(mode_of(&site.journal), 0o600);
    assert_eq!(mode_of(&site.projection), 0o600);

    let j = site.json(&["migrate", "--json"]);
    assert_eq!(j["journal"], site.journal.display().to_string());
    assert_eq!(j["projection"], site.projection.display().to_string());
    assert_eq!(j["projections"], serde_json::json!(PROJECTIONS));
}

/// A `migrate` whose projection database cannot be made leaves no journal
/// behind either: a journal it created is removed again (a leftover one
/// would keep this attempt's partition count and refuse the next).
#[test]
fn a_refused_migrate_creates_no_journal() {
    let site = Site::new();
    let missing_dir = site.dir.join("no-such-dir").join("p.db");
    let not_sqlite = site.dir.join("notes.txt");
    fs::write(&not_sqlite, "not a database").unwrap();
    let a_dir = site.dir.join("a-dir");
    fs::create_dir(&a_dir).unwrap();
    for (projection, code, mention) in [
        (missing_dir.display().to_string(), 2, "does not exist"),
        (not_sqlite.display().to_string(), 2, "notes.txt"),
        (a_dir.display().to_string(), 2, "a-dir"),
    ] {
        let url = format!("sqlite://{projection}");
        site.refused(&["migrate"], &[("OUTBOX_PROJECTION_URL", &url)], code, &[mention]);
        assert!(
            !site.journal.exists(),
            "{projection}: the journal was left behind"
        );
    }
    // An existing journal stays, migrated or not.
    site.ok(&["migrate"]);
    let before = fs::read(&site.journal).unwrap();
    let url = format!("sqlite://{}", missing_dir.display());
    site.run_env(&["migrate"], &[("OUTBOX_PROJECTION_URL", &url)]);
    assert_eq!(
        fs::read(&site.journal).unwrap(),
        before,
        "the existing journal changed"
    );
}

#[test]
fn commands_close_their_databases_before_exiting() {
    // The last connection's close checkpoints the WAL and removes the
    // `-wal` and `-shm` companions: what is left is the complete database.
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    for args in [
        &["migrate"][..],
        &["report"],
        &["work", "--once"],
        &["gaps", "--repair"],
        &["rebuild", "--all"],
        &["runs"],
        &["workers"],
    ] {
        site.ok(args);
        let names: Vec<String> = site.snapshot().into_keys().collect();
        assert_eq!(
            names,
            ["journal.db", "projections.db"],
            "after `outbox {}`",
            args.join(" ")
        );
    }
}

#[test]
fn database_flags_name_the_files() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    // Flags, not the environment: `--projection` after replay/rebuild names a
    // projection, the projection database has its own flag.
    let run = |args: &[&str]| {
        let mut full = vec![
            "--journal",
            site.journal.to_str().unwrap(),
            "--projection-db",
            site.projection.to_str().unwrap(),
        ];
        full.extend_from_slice(args);
        let mut cmd = site.command(&full);
        cmd.env_remove("OUTBOX_JOURNAL_URL")
            .env_remove("OUTBOX_PROJECTION_URL");
        let r = Run::from(&full, cmd.output().expect("run"));
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r.stdout
    };
    let out = run(&["replay", "--projection", "roster"]);
    assert!(
        out.contains("catch_up") && out.contains("roster") && out.contains("completed"),
        "{out}"
    );
    let out = run(&["rebuild", "--projection", "campaign_summary", "--json"]);
    let runs: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(runs[0]["projection"], "campaign_summary");
    assert_eq!(runs[0]["state"], "completed");
    let out = run(&["report", "--json", "--no-digests"]);
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        r["pending"], PER_CAMPAIGN,
        "rows stay until every projection applied them"
    );
    // --journal-db is the symmetric spelling of --journal.
    let mut cmd = site.command(&[
        "--journal-db",
        site.journal.to_str().unwrap(),
        "--projection-db",
        site.projection.to_str().unwrap(),
        "workers",
    ]);
    cmd.env_remove("OUTBOX_JOURNAL_URL")
        .env_remove("OUTBOX_PROJECTION_URL");
    assert!(cmd.output().unwrap().status.success());
    // No file named after the projection appeared.
    let names: Vec<String> = site.snapshot().into_keys().collect();
    assert_eq!(names, ["journal.db", "projections.db"]);
}

// ---------------------------------------------------------------------------
// report
// ---------------------------------------------------------------------------

#[test]
fn report_of_a_healthy_outbox() {
    let site = demo_site();
    let out = site.ok(&["report"]);
    assert!(
        out.contains("rows: 0 pending, 0 processing, 0 failed, 0 dead (0 in all)"),
        "{out}"
    );
    assert!(out.contains("oldest retry-eligible: none (lag 0)"), "{out}");
    for p in PROJECTIONS.iter().chain(&["(store)"]) {
        assert!(out.contains(&format!("    {p:<18} ")), "digest of {p}: {out}");
    }
    assert!(!out.contains("dead letters"), "{out}");

    let r = site.json(&["report", "--json"]);
    for k in [
        "pending",
        "processing",
        "failed",
        "dead",
        "total",
        "oldest_due_age_ms",
    ] {
        assert_eq!(r[k], 0, "{k}: {r}");
    }
    assert!(r["oldest_retry_eligible"].is_null());
    assert_eq!(r["rows"], serde_json::json!([]));
    assert_eq!(r["workers"], serde_json::json!([]));
    assert_eq!(r["active_runs"], serde_json::json!([]));
    assert!(r["as_of"].as_str().unwrap().ends_with('Z'), "RFC 3339: {r}");
    let names: Vec<&str> = r["digests"]["projections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_str().unwrap())
        .collect();
    assert_eq!(names, PROJECTIONS);
    assert_eq!(r["digests"]["store"].as_str().unwrap().len(), 64);

    let r = site.json(&["report", "--json", "--no-digests"]);
    assert!(r["digests"].is_null());
}

/// A command whose stdout reader is gone (`outbox report | head -1`) stops
/// quietly with exit 0; one whose stdout is full fails with one line. Neither
/// panics. The pipe's read end is closed before the command starts, so its
/// first write fails whatever the timing.
#[test]
fn output_to_a_closed_pipe_or_a_full_disk_is_no_panic() {
    let site = demo_site();
    for args in [&["report"][..], &["report", "--json"], &["workers"], &["leases"]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let before = site.snapshot();
        let r = site.run_to(args, writer);
        assert_eq!(r.code, Some(0), "closed pipe; {}", r.explain());
        assert!(r.stderr.is_empty(), "nothing on stderr; {}", r.explain());
        assert_same_files(&before, &site.snapshot(), &r.args);

        let full = fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let r = site.run_to(args, full);
        assert_eq!(r.code, Some(1), "full disk; {}", r.explain());
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line; {}", r.explain());
        assert!(
            lines[0].contains("cannot write to standard output") && !lines[0].contains("panicked"),
            "{}",
            r.explain()
        );
    }
}

#[test]
fn report_shows_running_digests_and_verify_recomputes_them() {
    let site = demo_site();
    let out = site.ok(&["report", "--no-digests"]);
    assert!(out.contains("running digests"), "{out}");
    let r = site.json(&["report", "--json", "--no-digests"]);
    let running = r["running_digests"].as_array().expect("running_digests");
    let mut names: Vec<&str> = running
        .iter()
        .map(|d| d["projection"].as_str().unwrap())
        .collect();
    let mut want = PROJECTIONS.to_vec();
    want.sort_unstable();
    assert_eq!(names, want, "one per projection, by name: {r}");
    for d in running {
        assert_eq!(d["digest"].as_str().unwrap().len(), 64, "{d}");
        assert!(d["documents"].as_i64().unwrap() > 0, "{d}");
        assert!(d["last_event"].is_array(), "{d}");
    }

    let out = site.ok(&["verify"]);
    for p in PROJECTIONS {
        assert!(
            out.lines().any(|l| l.starts_with(p) && l.contains(" ok ")),
            "{p} verified: {out}"
        );
    }
    let checks = site.json(&["verify", "--json"]);
    let checks = checks.as_array().unwrap();
    assert_eq!(checks.len(), 3);
    for c in checks {
        assert_eq!(c["recorded"]["digest"], c["scanned"], "{c}");
    }
    names = running.iter().map(|d| d["digest"].as_str().unwrap()).collect();
    for c in checks {
        assert!(
            names.contains(&c["scanned"].as_str().unwrap()),
            "report and verify agree: {c}"
        );
    }

    // A projection nothing knows is not found, not an empty "ok".
    site.refused(
        &["verify", "--projection", "nobody"],
        &[],
        3,
        &["projection `nobody`"],
    );
    let long = "p".repeat(300);
    let bad = site.run(&["verify", "--projection", &long]);
    assert_eq!(bad.code, Some(2), "{}", bad.explain());
    assert_eq!(bad.stderr.trim().lines().count(), 1, "{}", bad.explain());
}

#[test]
fn report_lists_rows_by_status_with_a_limit() {
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-a", false), ("campaign-b", true)]);

    let r = site.report();
    assert_eq!(
        (u(&r["pending"]), u(&r["dead"]), u(&r["total"])),
        (3, 1, 4),
        "{r}"
    );
    let oldest = &r["oldest_retry_eligible"];
    assert_eq!(oldest["stream"], "campaign-b");
    assert_eq!(
        oldest["seq"],
        CURSED_SEQ + 1,
        "the first pending row behind the dead head: {r}"
    );

    let dead = site.json(&["report", "--status", "dead", "--limit", "100", "--json"]);
    let rows = dead["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{dead}");
    let row = &rows[0];
    assert_eq!(row["stream"], "campaign-b");
    assert_eq!(row["seq"], CURSED_SEQ);
    assert_eq!(row["event_type"], "dice_rolled");
    assert_eq!(row["status"], "dead");
    assert_eq!(row["attempt_count"], 1);
    assert!(
        row["last_error"]
            .as_str()
            .unwrap()
            .contains("cursed die on campaign-b/4"),
        "{row}"
    );

    let pending = site.json(&[
        "report",
        "--status",
        "pending",
        "--limit",
        "2",
        "--json",
        "--no-digests",
    ]);
    let rows = pending["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "--limit 2: {pending}");
    assert!(rows.iter().all(|r| r["status"] == "pending"));

    let none = site.json(&["report", "--limit", "0", "--json", "--no-digests"]);
    assert_eq!(none["rows"], serde_json::json!([]));
    assert_eq!(none["total"], 4, "counts do not depend on the listing");

    let text = site.ok(&["report", "--status", "dead", "--limit", "100", "--no-digests"]);
    assert!(
        text.contains("rows: 3 pending, 0 processing, 0 failed, 1 dead (4 in all)"),
        "{text}"
    );
    assert!(
        text.contains(
            "dead letters: 1 hold their streams back (`outbox-demo report --blocked` lists them; \
             fix the cause, then `outbox-demo requeue-dead --limit N`)"
        ),
        "{text}"
    );
    assert!(text.contains("dead rows (first 1):"), "{text}");
    // The rows behind the dead one are no worker lag.
    assert!(
        text.contains("worker lag: 0ms (the oldest work a worker may take now; 1 stream(s) blocked"),
        "{text}"
    );
    let json = site.json(&["report", "--json", "--no-digests"]);
    assert_eq!(json["worker_lag_ms"], 0, "{json}");
    // The projections are behind because of the dead row: no repair hint.
    let lag = site.ok(&["report", "--limit", "0", "--no-digests"]);
    assert!(lag.contains("BEHIND"), "{lag}");
    assert!(!lag.contains("gaps --repair"), "{lag}");
    assert!(lag.contains("rows that failed hold streams back"), "{lag}");
    assert!(
        text.contains("campaign-b/4 dice_rolled dead attempts=1"),
        "{text}"
    );
    assert!(text.contains("cursed die on campaign-b/4"), "{text}");
}

// ---------------------------------------------------------------------------
// work --once
// ---------------------------------------------------------------------------

#[test]
fn work_once_drains_what_is_due() {
    let site = Site::migrated();
    seed_backlog(
        &site,
        &[
            ("campaign-a", false),
            ("campaign-b", false),
            ("campaign-c", false),
        ],
    );
    let out = site.ok(&["work", "--once"]);
    assert_eq!(
        out.trim(),
        "outbox_apply_only pass: 3 due stream(s), 21 claimed, 21 completed, 0 failed, 0 dead-lettered, 0 contended, \
         0 event(s) caught up for projections off the shared path"
    );
    assert_eq!(site.report()["total"], 0);
    // Nothing is due any more.
    let out = site.ok(&["work", "--once"]);
    assert!(out.contains("0 due stream(s), 0 claimed"), "{out}");
}

#[test]
fn work_once_json_reports_the_pass() {
    let site = Site::migrated();
    // The cursed row applies: the binary runs with the fix deployed.
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", true)]);
    let out = site.ok(&["work", "--once", "--json", "--batch-size", "3"]);
    assert_eq!(out.lines().count(), 1, "one JSON line: {out}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["due_streams"], 2);
    assert_eq!(t["leased"], 2);
    assert_eq!(t["contended"], 0);
    assert_eq!(t["claimed"], 2 * PER_CAMPAIGN);
    assert_eq!(t["completed"], 2 * PER_CAMPAIGN);
    assert_eq!(t["failed"], 0);
    assert_eq!(t["dead_lettered"], 0);
    assert_eq!(t["storage_errors"], 0);
    assert_eq!(site.report()["total"], 0);

    let quiet = site.ok(&["work", "--once", "--quiet"]);
    assert_eq!(quiet, "", "--quiet prints nothing");
}

// ---------------------------------------------------------------------------
// dead letters: inspect, requeue, requeue-dead, verify
// ---------------------------------------------------------------------------

#[test]
fn dead_letters_are_requeued_and_drained() {
    let site = Site::migrated();
    seed_with_dead(
        &site,
        &[("campaign-a", false), ("campaign-b", true), ("campaign-d", true)],
    );
    assert_eq!(site.report()["dead"], 2);

    let out = site.ok(&["requeue", "--stream", "campaign-b", "--seq", "4"]);
    assert_eq!(
        out.trim(),
        "requeued campaign-b/4 (dice_rolled): pending, attempts 0, due now"
    );

    let dead = site.json(&["report", "--status", "dead", "--json", "--no-digests"]);
    let rows = dead["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["stream"], "campaign-d");

    let requeued = site.json(&["requeue-dead", "--limit", "10", "--json"]);
    let rows = requeued["rows"].as_array().expect("an array of rows");
    assert_eq!(rows.len(), 1, "{requeued}");
    assert_eq!(requeued["projections"], serde_json::json!([]), "{requeued}");
    assert_eq!(rows[0]["stream"], "campaign-d");
    assert_eq!(rows[0]["seq"], CURSED_SEQ);
    assert_eq!(rows[0]["status"], "pending");
    assert_eq!(rows[0]["attempt_count"], 0);
    assert!(rows[0]["last_error"].is_null(), "{requeued}");

    let out = site.ok(&["requeue-dead", "--limit", "10"]);
    assert_eq!(out.trim(), "requeued 0 dead row(s)");

    let t: Value = serde_json::from_str(&site.ok(&["work", "--once", "--json"])).unwrap();
    assert_eq!(t["completed"], 2 * (PER_CAMPAIGN - CURSED_SEQ + 1), "{t}");
    let r = site.report();
    assert_eq!((u(&r["total"]), u(&r["dead"])), (0, 0), "{r}");

    // Every path converges: the worker's projections equal a rebuild from origin.
    let before = digests(&site);
    site.ok(&["rebuild", "--all"]);
    assert_eq!(digests(&site), before);
}

/// The cursed die fails one projection (ADR 0032): `report` shows the
/// tally dead on the cursed campaigns while every row is done and the other
/// projections equal a rebuild; `requeue` of one (stream, seq) and
/// `requeue-dead` revive the tally's exceptions (a retry of a dead one
/// points at requeue), `work --once` catches the tally up, and every digest
/// then equals a rebuild from origin.
#[test]
fn a_projection_dead_on_a_stream_holds_back_only_itself_and_is_requeued() {
    let site = Site::migrated();
    seed_with_dead_projection(
        &site,
        &[("campaign-a", false), ("campaign-b", true), ("campaign-d", true)],
    );
    let r = site.report();
    assert_eq!(
        (
            u(&r["total"]),
            u(&r["dead"]),
            u(&r["projection_exceptions"]["dead"])
        ),
        (0, 0, 2),
        "every row is done; the tally is dead on two campaigns: {r}"
    );
    let listed = r["projection_exceptions"]["listed"].as_array().unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| (
                e["projection"].as_str().unwrap(),
                e["stream"].as_str().unwrap(),
                u(&e["seq"])
            ))
            .collect::<Vec<_>>(),
        [
            ("character_tally", "campaign-b", CURSED_SEQ),
            ("character_tally", "campaign-d", CURSED_SEQ)
        ]
    );
    let text = site.ok(&["report", "--no-digests"]);
    assert!(
        text.contains("projections off the shared path: 0 stream(s) failing or behind, 2 dead")
            && text.contains("character_tally on campaign-b/4 dead attempts=1"),
        "{text}"
    );
    // The other projections applied the cursed campaigns: a rebuild of
    // them from origin gives the same digests.
    let before = digests(&site);
    site.ok(&["rebuild", "--projection", "roster"]);
    site.ok(&["rebuild", "--projection", "campaign_summary"]);
    assert_eq!(
        digests(&site),
        before,
        "roster and campaign_summary had applied every event"
    );

    site.refused(
        &["retry", "--stream", "campaign-b", "--seq", "4"],
        &[],
        4,
        &["character_tally", "dead", "requeue"],
    );
    site.refused(
        &[
            "requeue",
            "--stream",
            "campaign-b",
            "--seq",
            "4",
            "--projection",
            "roster",
        ],
        &[],
        3,
        &["roster", "campaign-b/4"],
    );
    let out = site.ok(&[
        "requeue",
        "--stream",
        "campaign-b",
        "--seq",
        "4",
        "--projection",
        "character_tally",
    ]);
    assert_eq!(
        out.trim(),
        "requeued campaign-b/4 for projection character_tally: due now, attempts 0"
    );
    let requeued = site.json(&["requeue-dead", "--limit", "10", "--json"]);
    assert_eq!(requeued["rows"], serde_json::json!([]), "{requeued}");
    let p = requeued["projections"].as_array().unwrap();
    assert_eq!(p.len(), 1, "{requeued}");
    assert_eq!(
        (&p[0]["stream"], &p[0]["status"], &p[0]["attempt_count"]),
        (&"campaign-d".into(), &"failed".into(), &0.into())
    );
    let out = site.ok(&["requeue-dead", "--limit", "10"]);
    assert_eq!(out.trim(), "requeued 0 dead row(s)");

    let t: Value = serde_json::from_str(&site.ok(&["work", "--once", "--json"])).unwrap();
    assert_eq!(t["caught_up"], 2 * (PER_CAMPAIGN - CURSED_SEQ + 1), "{t}");
    let r = site.report();
    assert_eq!(
        (
            u(&r["projection_exceptions"]["failed"]),
            u(&r["projection_exceptions"]["dead"])
        ),
        (0, 0),
        "{r}"
    );
    let caught_up = digests(&site);
    site.ok(&["rebuild", "--all"]);
    assert_eq!(
        digests(&site),
        caught_up,
        "every digest equals a rebuild from origin"
    );
}

#[test]
fn requeue_dead_text_lists_the_rows_oldest_first() {
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-b", true), ("campaign-d", true)]);
    let out = site.ok(&["requeue-dead", "--limit", "1"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "requeued 1 dead row(s)", "{out}");
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[1].trim().ends_with("/4 dice_rolled"), "{out}");
    assert_eq!(site.report()["dead"], 1, "--limit 1 requeues one");
}

#[test]
fn requeue_of_an_unknown_or_live_row_is_refused() {
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-a", false), ("campaign-b", true)]);
    site.refused(
        &["requeue", "--stream", "nope", "--seq", "1"],
        &[],
        3,
        &["nope/1"],
    );
    site.refused(
        &["requeue", "--stream", "campaign-b", "--seq", "99"],
        &[],
        3,
        &["campaign-b/99"],
    );
    // Applied and deleted: no row any more.
    site.refused(
        &["requeue", "--stream", "campaign-a", "--seq", "1"],
        &[],
        3,
        &["campaign-a/1"],
    );
    // Pending behind the dead head: not dead.
    site.refused(
        &["requeue", "--stream", "campaign-b", "--seq", "5"],
        &[],
        4,
        &["campaign-b/5"],
    );
    // The dead row itself is untouched by the refusals and still requeueable.
    let done = site.json(&["requeue", "--stream", "campaign-b", "--seq", "4", "--json"]);
    let row = &done["row"];
    assert_eq!(row["status"], "pending");
    assert_eq!(row["attempt_count"], 0);
    assert_eq!(done["projections"], serde_json::json!([]), "{done}");
    // Requeueing it twice: it is no longer dead.
    site.refused(
        &["requeue", "--stream", "campaign-b", "--seq", "4"],
        &[],
        4,
        &["campaign-b/4"],
    );
}

// ---------------------------------------------------------------------------
// retry and leases
// ---------------------------------------------------------------------------

/// Opens the site's journal through the library, runs `f` on it, closes it.
fn with_journal<T>(site: &Site, f: impl AsyncFnOnce(&SqliteJournal) -> T) -> T {
    block_on(async {
        let journal = SqliteJournal::open(&site.journal, SqliteOptions::default())
            .await
            .expect("open journal");
        let out = f(&journal).await;
        journal.close().await;
        out
    })
}

fn wid(name: &str) -> WorkerId {
    WorkerId::new(name).unwrap()
}

fn sid(name: &str) -> StreamId {
    StreamId::new(name).unwrap()
}

/// A long lease TTL: the fixtures' leases never expire during a test.
const LONG_TTL: Duration = Duration::from_secs(3600);

#[test]
fn retry_makes_a_failed_row_due_now_and_refuses_processing_or_missing_rows() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-b", true), ("campaign-c", false)]);
    // A zombie holds campaign-c with its rows claimed (processing).
    with_journal(&site, async |j| {
        let lease = j
            .acquire(&sid("campaign-c"), &wid("zombie"), LONG_TTL)
            .await
            .unwrap()
            .expect("free lease");
        assert_eq!(j.claim(&lease, 100).await.unwrap().len() as u64, PER_CAMPAIGN);
    });
    // One pass with the fix NOT deployed and a retry an hour away: the
    // tally failed on b/4, the other projections applied b (ADR 0032).
    block_on(async {
        let retry = RetryPolicy::new(Duration::from_secs(3600), Duration::from_secs(3600), 5).unwrap();
        let rt = site
            .library(Config::apply_worker().with_retry(retry), &Faults::default())
            .await;
        rt.tick().await.expect("tick");
        rt.journal().close().await;
        rt.store().close().await;
    });
    let r = site.report();
    assert_eq!(
        (
            u(&r["failed"]),
            u(&r["processing"]),
            u(&r["projection_exceptions"]["failed"])
        ),
        (0, PER_CAMPAIGN, 1),
        "{r}"
    );
    let t: Value = serde_json::from_str(&site.ok(&["work", "--once", "--json"])).unwrap();
    assert_eq!(
        (&t["completed"], &t["caught_up"]),
        (&0.into(), &0.into()),
        "the tally's retry waits an hour: {t}"
    );

    site.refused(&["retry", "--stream", "nope", "--seq", "1"], &[], 3, &["nope/1"]);
    site.refused(
        &["retry", "--stream", "campaign-b", "--seq", "99"],
        &[],
        3,
        &["campaign-b/99"],
    );
    site.refused(
        &["retry", "--stream", "campaign-c", "--seq", "1"],
        &[],
        4,
        &["campaign-c/1", "processing"],
    );
    site.refused(&["retry", "--stream", "", "--seq", "1"], &[], 2, &[]);

    let out = site.ok(&["retry", "--stream", "campaign-b", "--seq", "4"]);
    assert_eq!(
        out.trim(),
        "retrying campaign-b/4 for projection character_tally: due now, attempts 0"
    );
    let done = site.json(&["retry", "--stream", "campaign-b", "--seq", "4", "--json"]);
    assert!(done["row"].is_null(), "no row is left at b/4: {done}");
    let tally = &done["projections"][0];
    assert_eq!(
        (&tally["projection"], &tally["status"], &tally["attempt_count"]),
        (&"character_tally".into(), &"failed".into(), &0.into()),
        "{done}"
    );
    assert!(!tally["last_error"].is_null(), "the error is kept: {done}");
    // The binary has the fix: the tally catches up on b from 4.
    let t: Value = serde_json::from_str(&site.ok(&["work", "--once", "--json"])).unwrap();
    assert_eq!(t["caught_up"], PER_CAMPAIGN - CURSED_SEQ + 1, "{t}");
    let r = site.report();
    assert_eq!(u(&r["projection_exceptions"]["failed"]), 0, "{r}");
}

#[test]
fn retry_of_a_dead_row_points_at_requeue() {
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-b", true)]);
    site.refused(
        &["retry", "--stream", "campaign-b", "--seq", "4"],
        &[],
        4,
        &["campaign-b/4", "dead", "requeue"],
    );
    assert_eq!(site.report()["dead"], 1, "the dead row is untouched");
}

/// The partition holding `stream`'s rows among `count` (CRC-32).
fn partition_of(stream: &str, count: u32) -> usize {
    (outbox_core::crc32(stream.as_bytes()) % count) as usize
}

#[test]
fn partitions_are_listed_and_resized_only_with_the_workers_stopped() {
    use outbox_core::{Partition, PartitionStore};
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);
    let out = site.ok(&["partitions"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("16 partitions by crc32; 0 held; as of "),
        "{out}"
    );
    assert_eq!(lines.len(), 17, "a line per partition: {out}");
    assert!(
        lines[1].starts_with("p00  never leased  epoch 0  streams "),
        "{out}"
    );
    let rows_in = |v: &Value, count: u32| {
        let parts = v["partitions"].as_array().unwrap();
        assert_eq!(parts.len(), count as usize, "{v}");
        let mut want = vec![0u64; count as usize];
        for c in ["campaign-a", "campaign-b"] {
            want[partition_of(c, count)] += PER_CAMPAIGN;
        }
        let got: Vec<u64> = parts.iter().map(|p| u(&p["rows"])).collect();
        assert_eq!(got, want, "each campaign's rows in its partition: {v}");
    };
    let v = site.json(&["partitions", "--json"]);
    assert_eq!(
        (v["count"].clone(), v["partitioner"].clone()),
        (16.into(), "crc32".into()),
        "{v}"
    );
    rows_in(&v, 16);

    // Another count is refused, naming the way out; nothing changes.
    site.refused(
        &["report"],
        &[("OUTBOX_PARTITIONS", "32")],
        2,
        &[
            "16 partitions by `crc32`",
            "not 32",
            "`outbox-demo partitions resize --count 32 --yes`",
        ],
    );
    site.refused(
        &["partitions", "resize", "--count", "32"],
        &[],
        2,
        &["among 32", "--yes"],
    );
    // A worker holding a partition: resizing now is refused.
    with_journal(&site, async |j| {
        j.sync_partitions(&wid("worker-x"), &[Partition::new(3)], LONG_TTL)
            .await
            .unwrap();
    });
    site.refused(
        &["partitions", "resize", "--count", "32", "--yes"],
        &[],
        4,
        &["partition p03 is leased by worker worker-x", "stop every worker"],
    );
    assert!(
        site.ok(&["partitions"])
            .contains("p03  owner worker-x  epoch 1  expires in ")
    );
    let bus = outbox_core::SinkName::new("bus").unwrap();
    with_journal(&site, async |j| {
        use outbox_core::SinkStore;
        j.sync_partitions(&wid("worker-x"), &[], LONG_TTL).await.unwrap();
        // A sink failing on campaign-b, and its scan cursors.
        let b = sid("campaign-b");
        let dead = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 1).unwrap();
        j.fail_sink(
            &bus,
            &b,
            j.partitioning().of(&b),
            Seq::new(1).unwrap(),
            "down",
            &dead,
        )
        .await
        .unwrap();
        j.requeue_sink(&bus, &b).await.unwrap();
        j.advance_sink_cursor(&bus, Partition::new(0), 0, 5)
            .await
            .unwrap();
        j.advance_sink_cursor(&bus, Partition::new(9), 0, 3)
            .await
            .unwrap();
    });

    let out = site.ok(&["partitions", "resize", "--count", "32", "--yes"]);
    assert!(
        out.starts_with("the journal is divided into 32 partitions by crc32\n"),
        "{out}"
    );
    let v = site.json(&["partitions", "--json"]);
    rows_in(&v, 32);
    assert_eq!(
        v["partitions"][3]["epoch"], 2,
        "a resize raises every leased partition's epoch: {v}"
    );
    // The sink's state followed: the failing stream is retried in its new
    // partition, the cursors restart from the lowest old one everywhere.
    with_journal(&site, async |j| {
        use outbox_core::SinkStore;
        let p = Partition::new(partition_of("campaign-b", 32) as u16);
        let due = j.due_sink_streams(&bus, &[p], 10).await.unwrap();
        assert_eq!(due.len(), 1, "campaign-b is due in {p}");
        let cursors = j.sink_cursors(&bus).await.unwrap();
        assert_eq!(cursors.len(), 32);
        assert!(cursors.iter().all(|(_, pos)| *pos == 3), "{cursors:?}");
    });
    // The stored count is the journal's now: unset or equal, it opens.
    site.ok_env(&["partitions"], &[("OUTBOX_PARTITIONS", "32")]);
    let t = site.json(&["work", "--once", "--json"]);
    assert_eq!(t["completed"], 2 * PER_CAMPAIGN, "{t}");
}

#[test]
fn sinks_are_listed_and_requeued_and_a_replay_names_an_unknown_sink() {
    use outbox_core::{PartitionStore, SinkName, SinkStore};
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);
    assert_eq!(site.ok(&["sinks"]).trim(), "no sink has delivered anything yet");
    let bus = SinkName::new("bus").unwrap();
    with_journal(&site, async |j| {
        let (a, b) = (sid("campaign-a"), sid("campaign-b"));
        let (pa, pb) = (j.partitioning().of(&a), j.partitioning().of(&b));
        assert!(
            j.advance_sink(&bus, &a, pa, 0, Seq::new(3).unwrap(), false)
                .await
                .unwrap()
        );
        let dead = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(1), 1).unwrap();
        j.fail_sink(&bus, &b, pb, Seq::new(1).unwrap(), "broker down", &dead)
            .await
            .unwrap();
    });
    let out = site.ok(&["sinks", "--sink", "bus"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "bus  streams 2  failing 0  dead 1  scanned through 0",
        "{out}"
    );
    assert!(
        lines[1].starts_with("  dead campaign-b  at seq 1  attempts 1  next attempt ")
            && lines[1].ends_with("broker down"),
        "{out}"
    );
    let v = site.json(&["sinks", "--json", "--sink", "bus"]);
    assert_eq!(v["sinks"][0]["dead"], 1, "{v}");
    assert_eq!(v["failing"][0]["stream"], "campaign-b", "{v}");
    site.refused(
        &["sinks", "requeue", "--sink", "bus", "--stream", "campaign-a"],
        &[],
        4,
        &["not failing on stream campaign-a"],
    );
    site.refused(
        &["sinks", "requeue", "--sink", "bus", "--stream", "nowhere"],
        &[],
        3,
        &["no state for stream nowhere"],
    );
    site.refused(
        &["sinks", "requeue", "--sink", "bus", "--stream", " padded"],
        &[],
        2,
        &["stream id"],
    );
    let out = site.ok(&["sinks", "requeue", "--sink", "bus", "--stream", "campaign-b"]);
    assert_eq!(
        out.trim(),
        "requeued stream campaign-b for sink bus: due now from seq 1 (attempts reset)"
    );
    assert!(
        site.ok(&["sinks"])
            .starts_with("bus  streams 2  failing 1  dead 0")
    );
    // SQLite's feed is read by position: nothing to re-key.
    assert_eq!(
        site.ok(&["sinks", "rekey"]).trim(),
        "nothing to re-key: this journal's feed is read by global position"
    );
    // The demo registers no sink: a sink replay names what is missing.
    let r = site.run(&["replay", "--sink", "nope", "--from", "1"]);
    assert_eq!(r.code, Some(3), "{}", r.explain());
    assert!(
        r.stderr
            .contains("no sink named `nope` is registered (registered: none)"),
        "{}",
        r.explain()
    );
    for args in [
        &["replay", "--from", "1"][..],
        &["replay", "--sink", "bus"],
        &["replay", "--sink", "bus", "--from", "1", "--projection", "roster"],
    ] {
        let r = site.run(args);
        assert_eq!(r.code, Some(2), "{}", r.explain());
    }
}

#[test]
fn leases_are_listed_and_broken_only_with_confirmation() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);
    assert_eq!(site.ok(&["leases"]).trim(), "no stream leases held");
    let (held, _) = with_journal(&site, async |j| {
        let b = j
            .acquire(&sid("campaign-b"), &wid("worker-x"), LONG_TTL)
            .await
            .unwrap();
        let a = j
            .acquire(&sid("campaign-a"), &wid("worker-y"), LONG_TTL)
            .await
            .unwrap();
        let gone = j
            .acquire(&sid("campaign-z"), &wid("worker-x"), LONG_TTL)
            .await
            .unwrap();
        assert!(j.release(&gone.unwrap()).await.unwrap());
        let a = a.expect("free lease");
        assert_eq!(j.claim(&a, 100).await.unwrap().len() as u64, PER_CAMPAIGN);
        (a, b)
    });

    let out = site.ok(&["leases"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "released leases are not listed: {out}");
    assert!(
        lines[0].starts_with("campaign-a  owner worker-y  epoch 1  expires "),
        "{out}"
    );
    assert!(
        lines[1].starts_with("campaign-b  owner worker-x  epoch 1  expires "),
        "{out}"
    );
    assert!(!out.contains("expired"), "{out}");
    let all = site.json(&["leases", "--json"]);
    let all = all.as_array().expect("an array of leases");
    assert_eq!(all.len(), 2);
    assert_eq!(all[0]["stream"], "campaign-a");
    assert_eq!(all[0]["owner"], "worker-y");
    assert_eq!(all[0]["epoch"], 1);
    assert_eq!(all[0]["expired"], false);
    assert!(!all[0]["expires_at"].is_null());
    let first = site.json(&["leases", "--limit", "1", "--json"]);
    assert_eq!(first.as_array().unwrap().len(), 1);
    assert!(
        site.ok(&["leases", "--limit", "1"])
            .contains("(listing stopped at --limit 1)")
    );
    let one = site.json(&["leases", "--stream", "campaign-b", "--json"]);
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["owner"], "worker-x");
    assert_eq!(
        site.json(&["leases", "--stream", "campaign-z", "--json"]),
        serde_json::json!([])
    );

    // Without --yes: what would be broken, and nothing changes.
    site.refused(
        &["leases", "--break", "campaign-a"],
        &[],
        2,
        &["would break", "campaign-a", "worker-y", "epoch 1", "--yes"],
    );
    site.refused(&["leases", "--break", "campaign-z"], &[], 3, &["campaign-z"]);
    site.refused(&["leases", "--break", "nope", "--yes"], &[], 3, &["nope"]);
    site.refused(&["leases", "--yes"], &[], 2, &["--break"]);
    site.refused(
        &["leases", "--break", "campaign-a", "--stream", "campaign-b"],
        &[],
        2,
        &["--stream"],
    );
    site.refused(&["leases", "--break", ""], &[], 2, &[]);

    let out = site.ok(&["leases", "--break", "campaign-a", "--yes"]);
    assert_eq!(
        out.trim(),
        "broke the lease of stream campaign-a held by worker-y (epoch 1); its next holder gets epoch 2"
    );
    let left = site.json(&["leases", "--json"]);
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
    assert_eq!(left[0]["stream"], "campaign-b");
    // The stale holder's next claim fails; a new holder gets the next epoch.
    with_journal(&site, async |j| {
        let r = j.claim(&held, 100).await;
        assert!(matches!(r, Err(outbox_core::Error::LeaseLost { .. })), "{r:?}");
        let r = j.renew(&held, LONG_TTL).await;
        assert!(matches!(r, Err(outbox_core::Error::LeaseLost { .. })), "{r:?}");
    });
    // The rows the stale holder left processing are due again: a worker drains them.
    let t: Value = serde_json::from_str(&site.ok(&["work", "--once", "--json"])).unwrap();
    assert_eq!(
        t["completed"], PER_CAMPAIGN,
        "campaign-a only (b is still leased): {t}"
    );
    let json = site.json(&["leases", "--break", "campaign-b", "--yes", "--json"]);
    assert_eq!(json["broken"]["owner"], "worker-x", "{json}");
    assert_eq!(json["broken"]["epoch"], 1, "{json}");
}

// ---------------------------------------------------------------------------
// replay, rebuild, runs
// ---------------------------------------------------------------------------

#[test]
fn replay_since_reads_after_the_position_and_runs_show_the_cursor() {
    let site = Site::migrated();
    // Global positions 1..=7 are campaign-a, 8..=14 campaign-b.
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);
    let first = site.json(&[
        "replay",
        "--projection",
        "campaign_summary",
        "--until",
        "3",
        "--json",
    ]);
    assert_eq!(first[0]["position"], 3, "{first}");

    // After position 10: campaign-b's checkpoint (0) is behind its first
    // event there (seq 4), so the stream is caught up from seq 1;
    // campaign-a has nothing after 10 and stays at 3.
    let runs = site.json(&[
        "replay",
        "--projection",
        "campaign_summary",
        "--since",
        "10",
        "--json",
    ]);
    let run = &runs.as_array().unwrap()[0];
    assert_eq!(
        (&run["kind"], &run["state"], &run["since"], &run["position"]),
        (
            &serde_json::json!("catch_up"),
            &serde_json::json!("completed"),
            &serde_json::json!(10),
            &serde_json::json!(14)
        ),
        "{run}"
    );
    assert_eq!(run["processed"], PER_CAMPAIGN, "{run}");
    let gaps = site.json(&["gaps", "--json"]);
    let summary_behind = |stream: &str| -> Option<u64> {
        gaps.as_array()
            .unwrap()
            .iter()
            .find(|g| g["stream"] == stream)
            .and_then(|g| {
                g["behind"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|b| b[0] == "campaign_summary")
                    .map(|b| u(&b[1]))
            })
    };
    assert_eq!(summary_behind("campaign-a"), Some(3), "{gaps}");
    assert_eq!(summary_behind("campaign-b"), None, "{gaps}");

    let listed = site.ok(&["runs"]);
    assert!(listed.contains("since 10 at position 14"), "{listed}");
    let listed = site.json(&["runs", "--json"]);
    assert_eq!(
        (&listed[0]["id"], &listed[0]["position"]),
        (&run["id"], &serde_json::json!(14)),
        "{listed}"
    );

    site.refused(
        &[
            "replay",
            "--projection",
            "campaign_summary",
            "--since",
            "9",
            "--until",
            "9",
        ],
        &[],
        2,
        &["since", "until"],
    );
}

#[test]
fn replay_until_then_all_catches_up() {
    let site = Site::migrated();
    // Global positions 1..=7 are campaign-a, 8..=14 campaign-b.
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);

    let runs = site.json(&[
        "replay",
        "--projection",
        "campaign_summary",
        "--until",
        "10",
        "--json",
    ]);
    let run = &runs.as_array().unwrap()[0];
    assert_eq!(run["kind"], "catch_up");
    assert_eq!(run["projection"], "campaign_summary");
    assert_eq!(run["state"], "completed");
    assert_eq!(run["until"], 10);
    assert_eq!(run["processed"], 10, "{run}");

    let gaps = site.json(&["gaps", "--json"]);
    let gaps = gaps.as_array().unwrap();
    assert_eq!(gaps.len(), 2, "{gaps:?}");
    let behind = |i: usize| -> Vec<(String, u64)> {
        gaps[i]["behind"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b[0].as_str().unwrap().to_string(), u(&b[1])))
            .collect()
    };
    assert_eq!(gaps[0]["stream"], "campaign-a");
    assert_eq!(gaps[0]["version"], PER_CAMPAIGN);
    assert_eq!(
        behind(0),
        [("roster".to_string(), 0), ("character_tally".to_string(), 0)]
    );
    assert_eq!(gaps[1]["stream"], "campaign-b");
    assert_eq!(
        behind(1)[0],
        ("campaign_summary".to_string(), 3),
        "stopped at position 10 = seq 3"
    );

    let runs = site.json(&["replay", "--all", "--json"]);
    let runs = runs.as_array().unwrap();
    let order: Vec<&str> = runs.iter().map(|r| r["projection"].as_str().unwrap()).collect();
    assert_eq!(order, PROJECTIONS, "declared order");
    assert!(
        runs.iter()
            .all(|r| r["state"] == "completed" && r["until"].is_null()),
        "{runs:?}"
    );
    assert_eq!(
        runs[0]["processed"], 4,
        "campaign_summary resumes from its checkpoints"
    );
    assert_eq!(runs[1]["processed"], 2 * PER_CAMPAIGN);

    // Every projection applied every row, but the rows are the live
    // worker's: a replay leaves them unless asked to complete them.
    assert_eq!(site.report()["total"], 2 * PER_CAMPAIGN);
    let out = site.ok(&["replay", "--all", "--complete-rows"]);
    assert!(out.contains("processed 0"), "{out}");
    assert_eq!(site.report()["total"], 0, "--complete-rows resolved them");
    assert!(site.ok(&["gaps"]).contains("no gaps"));

    let out = site.ok(&["replay", "--projection", "roster"]);
    assert!(out.starts_with("run "), "{out}");
    for w in ["catch_up", "roster", "completed", "processed 0"] {
        assert!(out.contains(w), "{w}: {out}");
    }
}

#[test]
fn rebuild_one_and_all_reproduce_the_digests() {
    let site = demo_site();
    let before = digests(&site);

    let runs = site.json(&["rebuild", "--projection", "roster", "--json"]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["kind"], "rebuild");
    assert_eq!(runs[0]["projection"], "roster");
    assert_eq!(runs[0]["state"], "completed");
    assert!(u(&runs[0]["processed"]) > 0);
    assert_eq!(digests(&site), before);

    let out = site.ok(&["rebuild", "--all"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for (line, p) in lines.iter().zip(PROJECTIONS) {
        assert!(
            line.contains("rebuild") && line.contains(p) && line.contains("completed"),
            "{out}"
        );
    }
    assert_eq!(digests(&site), before);

    // runs list: newest first, with a limit.
    let all = site.json(&["runs", "list", "--json"]);
    let ids: Vec<u64> = all.as_array().unwrap().iter().map(|r| u(&r["id"])).collect();
    assert_eq!(ids.len(), 4, "{all}");
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "newest first: {ids:?}");
    assert_eq!(
        site.json(&["runs", "list", "--limit", "2", "--json"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        site.json(&["runs", "--json"]).as_array().unwrap().len(),
        4,
        "list is the default"
    );

    let shown = site.json(&["runs", "show", &ids[3].to_string(), "--json"]);
    assert_eq!(shown[0]["id"], ids[3]);
    assert_eq!(shown[0]["projection"], "roster");
    let text = site.ok(&["runs", "show", &ids[3].to_string()]);
    assert!(text.starts_with(&format!("run {:>4}  rebuild", ids[3])), "{text}");

    // A finished run cannot be cancelled; unknown ids are not found.
    site.refused(
        &["runs", "cancel", &ids[0].to_string()],
        &[],
        4,
        &[&format!("run {}", ids[0])],
    );
    site.refused(&["runs", "show", "999"], &[], 3, &["run 999"]);
    site.refused(&["runs", "cancel", "999"], &[], 3, &["run 999"]);
}

#[test]
fn a_rebuild_is_refused_while_another_owner_has_an_active_run() {
    let site = demo_site();
    let before = digests(&site);
    let id = block_on(async {
        // The other owner is alive: in the worker registry (a run whose
        // owner is not is reclaimed by the next admission).
        let journal = SqliteJournal::open(&site.journal, SqliteOptions::default())
            .await
            .unwrap();
        outbox_core::WorkerRegistry::heartbeat(
            &journal,
            &WorkerId::new("other-host-1-abc").unwrap(),
            "other-host",
            1,
            outbox_core::Mode::OutboxApplyOnly,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
        journal.close().await;
        let store = SqliteProjectionStore::open(&site.projection, SqliteOptions::default())
            .await
            .unwrap();
        let run = store
            .admit_run(
                RunKind::Rebuild,
                &ProjectionName::new("roster").unwrap(),
                None,
                &WorkerId::new("other-host-1-abc").unwrap(),
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        store.close().await;
        run.id
    });

    let line = site.refused(&["rebuild", "--projection", "roster"], &[], 4, &["roster"]);
    assert!(
        line.contains(&format!("run {id}")),
        "names the active run: {line}"
    );
    site.refused(&["replay", "--projection", "roster"], &[], 4, &["roster"]);
    // --all is refused before anything is cleared.
    let r = site.run(&["rebuild", "--all"]);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert_eq!(digests(&site), before);

    let report = site.report();
    let active = report["active_runs"].as_array().unwrap();
    assert!(
        active
            .iter()
            .any(|r| r["id"] == id && r["state"] == "queued" && r["owner"] == "other-host-1-abc"),
        "{report}"
    );
    let listed = site.ok(&["runs", "list"]);
    assert!(listed.contains("owner other-host-1-abc"), "{listed}");

    // A queued run is cancelled at once; then the rebuild is admitted.
    let cancelled = site.json(&["runs", "cancel", &id.to_string(), "--json"]);
    assert_eq!(cancelled[0]["state"], "cancelled");
    assert_eq!(cancelled[0]["id"], id);
    let runs = site.json(&["rebuild", "--projection", "roster", "--json"]);
    assert_eq!(runs[0]["state"], "completed");
    assert_eq!(digests(&site), before);
}

#[test]
fn unknown_projection_names_are_refused() {
    let site = demo_site();
    for args in [
        &["replay", "--projection", "nope"][..],
        &["rebuild", "--projection", "nope"],
        &["replay", "--projection", "nope", "--until", "5", "--json"],
    ] {
        site.refused(
            args,
            &[],
            3,
            &["projection `nope`", "campaign_summary, roster, character_tally"],
        );
    }
    // `verify` and `generations` list projections the store knows too, so
    // a typo is not an "ok" for a projection that does not exist.
    site.refused(
        &["verify", "--projection", "nope"],
        &[],
        3,
        &["projection `nope`", "campaign_summary, character_tally, roster"],
    );
    site.refused(
        &["generations", "--projection", "nope"],
        &[],
        3,
        &["projection `nope`"],
    );
    assert!(site.ok(&["verify", "--projection", "roster"]).contains("roster"));
    assert!(
        site.ok(&["generations", "--projection", "roster"])
            .contains("roster: live g1")
    );
}

// ---------------------------------------------------------------------------
// gaps, workers
// ---------------------------------------------------------------------------

#[test]
fn report_shows_projections_behind_the_journal() {
    let site = Site::migrated();
    seed_journal_only(&site, &["campaign-a", "campaign-b"]);

    let lag = &site.report()["lag"];
    assert_eq!(lag["streams_scanned"], 2, "{lag}");
    assert_eq!(lag["complete"], true, "{lag}");
    assert_eq!(lag["watermarks_behind"], 2, "{lag}");
    let per: Vec<(String, u64, u64)> = lag["projections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["projection"].as_str().unwrap().to_owned(),
                u(&p["streams_behind"]),
                u(&p["events_behind"]),
            )
        })
        .collect();
    let expected: Vec<(String, u64, u64)> = PROJECTIONS
        .iter()
        .map(|p| (p.to_string(), 2, 2 * PER_CAMPAIGN))
        .collect();
    assert_eq!(per, expected, "{lag}");
    let out = site.ok(&["report", "--no-digests"]);
    assert!(
        out.contains("projection lag (checkpoints behind the journal, over all 2 stream(s)):"),
        "{out}"
    );
    assert!(
        out.contains("roster             BEHIND: 2 stream(s), 14 event(s)"),
        "{out}"
    );
    // Nothing failed: the hint is the repair, by the running binary's name.
    assert!(
        out.contains("(`outbox-demo gaps` lists them, `outbox-demo gaps --repair` catches up)"),
        "{out}"
    );

    // A bounded scan says so.
    let r = site.json(&["report", "--json", "--no-digests", "--lag-streams", "1"]);
    assert_eq!(
        (&r["lag"]["streams_scanned"], &r["lag"]["complete"]),
        (&1.into(), &false.into())
    );
    assert_eq!(r["lag"]["projections"][0]["events_behind"], PER_CAMPAIGN);
    assert!(
        site.ok(&["report", "--no-digests", "--lag-streams", "1"])
            .contains("the first 1 stream(s) only")
    );
    let r = site.json(&["report", "--json", "--no-digests", "--lag-streams", "0"]);
    assert!(r["lag"].is_null(), "--lag-streams 0 skips the scan: {r}");

    site.ok(&["gaps", "--repair"]);
    let lag = &site.report()["lag"];
    assert!(
        lag["projections"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["streams_behind"] == 0),
        "{lag}"
    );
    assert_eq!(lag["watermarks_behind"], 0, "{lag}");
    assert!(
        site.ok(&["report", "--no-digests"])
            .contains("roster             up to date")
    );
}

#[test]
fn gaps_lists_and_repairs_streams_behind_the_journal() {
    let site = Site::migrated();
    seed_journal_only(&site, &["campaign-a", "campaign-b"]);

    let out = site.ok(&["gaps"]);
    assert!(
        out.contains("campaign-a: version 7, watermark 0, behind: campaign_summary at 0, roster at 0, character_tally at 0"),
        "{out}"
    );
    let gaps = site.json(&["gaps", "--json"]);
    let gaps = gaps.as_array().unwrap();
    assert_eq!(gaps.len(), 2);
    assert_eq!(gaps[1]["stream"], "campaign-b");
    assert_eq!(gaps[1]["version"], PER_CAMPAIGN);
    assert_eq!(gaps[1]["watermark"], 0);
    assert_eq!(gaps[1]["behind"].as_array().unwrap().len(), 3);

    let r = site.json(&["gaps", "--repair", "--json"]);
    assert_eq!(r["streams_scanned"], 2);
    assert_eq!(r["streams_repaired"], 2);
    assert_eq!(r["events_applied"], 2 * PER_CAMPAIGN);
    assert_eq!(r["watermark_behind"], 2);
    assert_eq!(r["gaps"].as_array().unwrap().len(), 2);
    assert_eq!(r["failures"], serde_json::json!([]));

    assert!(site.ok(&["gaps"]).contains("no gaps"));
    assert_eq!(site.json(&["gaps", "--json"]), serde_json::json!([]));
    let out = site.ok(&["gaps", "--repair"]);
    assert_eq!(
        out.trim(),
        "repaired 0 of 2 stream(s): 0 event(s) applied (0 watermark(s) were behind)"
    );
}

#[test]
fn workers_lists_nothing_when_no_worker_runs() {
    let site = Site::migrated();
    assert_eq!(site.ok(&["workers"]).trim(), "no live workers registered");
    assert_eq!(site.json(&["workers", "--json"]), serde_json::json!([]));
}

// ---------------------------------------------------------------------------
// the long-running worker
// ---------------------------------------------------------------------------

fn kill_term(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(ok.success(), "kill -TERM failed");
}

#[test]
fn work_drains_the_backlog_and_stops_cleanly_on_sigterm() {
    let site = Site::migrated();
    let names: Vec<String> = (0..12).map(|i| format!("campaign-{i:02}")).collect();
    let campaigns: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), n.ends_with('7'))).collect();
    seed_backlog(&site, &campaigns);
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = site
        .command(&["work", "--interval-ms", "50", "--report-ms", "100"])
        .stdout(log.reopen().unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let pid = child.id();

    eventually("the worker to register", || {
        let w = site.json(&["workers", "--json"]);
        w.as_array()
            .unwrap()
            .iter()
            .any(|w| w["pid"] == pid && w["mode"] == "outbox_apply_only")
    });
    eventually("the backlog to drain", || site.report()["total"] == 0);
    let text = site.ok(&["workers"]);
    assert!(text.contains(&format!("pid {pid}")), "{text}");

    kill_term(&child);
    let status = wait_status(&mut child, "the worker's exit after SIGTERM");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let out = fs::read_to_string(log.path()).unwrap();
    assert_eq!(status.code(), Some(0), "stdout:\n{out}\nstderr:\n{err}");
    // The backlog is older than the worker: start-up gap repair finds it
    // and leaves it to the worker, which applies it under the outbox's
    // protocol (ADR 0029).
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("start-up repair: 12 stream(s) behind the journal left to the worker"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("outbox_apply_only worker ") && l.ends_with("running (Ctrl-C to stop)")),
        "{out}"
    );
    assert!(
        out.trim_end()
            .ends_with("stopped: leases released, nothing left processing"),
        "{out}"
    );

    let r = site.report();
    assert_eq!((u(&r["processing"]), u(&r["total"])), (0, 0), "{r}");
    assert_eq!(
        site.json(&["workers", "--json"]),
        serde_json::json!([]),
        "deregistered"
    );
    // Closed cleanly: SQLite removed the `-wal` and `-shm` files. The
    // `-turn` lock file stays when the commands above wrote the journal
    // while the worker did (ADR 0024); it holds nothing.
    let names: Vec<String> = site
        .snapshot()
        .into_keys()
        .filter(|n| n != "journal.db-turn")
        .collect();
    assert_eq!(names, ["journal.db", "projections.db"], "closed cleanly");
}

#[test]
fn work_json_prints_one_metrics_line_per_report_and_stops_on_sigterm() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = site
        .command(&["work", "--json", "--report-ms", "50"])
        .stdout(log.reopen().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn worker");
    eventually("a metrics line showing the campaign applied", || {
        fs::read_to_string(log.path())
            .unwrap()
            .lines()
            .any(|l| serde_json::from_str::<Value>(l).is_ok_and(|m| m["completed_rows"] == PER_CAMPAIGN))
    });
    kill_term(&child);
    let status = wait_status(&mut child, "the worker's exit after SIGTERM");
    assert_eq!(status.code(), Some(0));
    let out = fs::read_to_string(log.path()).unwrap();
    for line in out.lines() {
        let m: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(m["mode"], "outbox_apply_only", "{line}");
        for k in [
            "applied",
            "failed",
            "dead_lettered",
            "completed_rows",
            "storage_errors",
        ] {
            assert!(m[k].is_u64(), "{k} in {line}");
        }
    }
}

// ---------------------------------------------------------------------------
// refused input
// ---------------------------------------------------------------------------

#[test]
fn a_missing_database_is_not_created() {
    let site = Site::new();
    for args in [
        &["report"][..],
        &["work", "--once"],
        &["requeue-dead", "--limit", "1"],
        &["gaps"],
    ] {
        site.refused(
            args,
            &[],
            3,
            // The hint names the binary that ran, not the stock `outbox`.
            &[&site.journal.display().to_string(), "`outbox-demo migrate`"],
        );
    }
    // The journal exists, the projection database does not.
    let site = Site::migrated();
    fs::remove_file(&site.projection).unwrap();
    site.refused(&["report"], &[], 3, &[&site.projection.display().to_string()]);
    site.refused(
        &["rebuild", "--all"],
        &[],
        3,
        &[&site.projection.display().to_string()],
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_unchanged() {
    let site = Site::migrated();
    let projection = fs::read(&site.projection).unwrap();
    fs::write(
        &site.journal,
        b"these are not the droids you are looking for\n".repeat(100),
    )
    .unwrap();
    let line = site.refused(&["report"], &[], 2, &["is not a SQLite database"]);
    assert!(line.contains("journal.db"), "{line}");
    site.refused(&["work", "--once"], &[], 2, &["journal.db"]);
    site.refused(&["migrate"], &[], 2, &["journal.db"]);

    let site = Site::migrated();
    fs::write(&site.projection, [0xffu8; 8192]).unwrap();
    site.refused(
        &["rebuild", "--all"],
        &[],
        2,
        &["projections.db", "is not a SQLite database"],
    );
    drop(projection);

    // The two roles are not interchangeable.
    let site = Site::migrated();
    let (j, p) = (site.journal.clone(), site.projection.clone());
    let swapped = Site {
        journal: p,
        projection: j,
        ..site
    };
    swapped.refused(
        &["report"],
        &[],
        2,
        &["projection database, not a journal database"],
    );
}

#[test]
fn malformed_flag_values_are_usage_errors() {
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-b", true)]);
    for (args, mention) in [
        (
            &["requeue", "--stream", "campaign-b", "--seq", "abc"][..],
            "--seq",
        ),
        (&["requeue", "--stream", "campaign-b", "--seq", "0"], "--seq"),
        (&["requeue", "--stream", "campaign-b", "--seq", "-1"], "-1"),
        (&["requeue", "--stream", "", "--seq", "4"], "stream"),
        (&["requeue", "--seq", "4"], "--stream"),
        (&["report", "--limit", "-1"], "-1"),
        (&["report", "--limit", "10001"], "--limit"),
        (&["report", "--status", "bogus"], "bogus"),
        (&["requeue-dead", "--limit", "0"], "--limit"),
        (&["requeue-dead"], "--limit"),
        (&["work", "--once", "--batch-size", "0"], "--batch-size"),
        (&["work", "--once", "--interval-ms", "0"], "--interval-ms"),
        (&["replay"], "--projection"),
        (&["replay", "--all", "--projection", "roster"], "--all"),
        (&["replay", "--all", "--until", "0"], "--until"),
        (&["rebuild", "--all", "--until", "5"], "--until"),
        (&["gaps", "--complete-rows"], "--repair"),
        (&["runs", "show", "abc"], "abc"),
        (&["runs", "list", "--limit", "0"], "--limit"),
        (&["demo", "--events", "5"], "--events"),
        (&["frobnicate"], "frobnicate"),
        (&["--log", "[", "report"], "log filter"),
    ] {
        site.refused(args, &[], 2, &[mention]);
    }
}

#[test]
fn invalid_environment_for_work_is_refused() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    for (var, value) in [
        ("OUTBOX_BATCH_SIZE", "abc"),
        ("OUTBOX_BATCH_SIZE", "0"),
        ("OUTBOX_POLL_INTERVAL_MS", "-5"),
        ("OUTBOX_ENABLED", "maybe"),
        ("OUTBOX_DEAD_LETTER_THRESHOLD", "0"),
        ("OUTBOX_RETRY_BASE_MS", "0"),
        ("OUTBOX_LEASE_TTL_MS", "5"),
        ("OUTBOX_HEARTBEAT_INTERVAL_MS", "1"),
        ("OUTBOX_WAKE_ON_APPEND", "sometimes"),
        ("OUTBOX_WORKER_ID", "bad\u{7}id"),
    ] {
        for args in [&["work", "--once"][..], &["work"]] {
            site.refused(args, &[(var, value)], 2, &["configuration error"]);
        }
    }
    // Cap below the base names the three variables.
    site.refused(
        &["work"],
        &[("OUTBOX_RETRY_CAP_MS", "10")],
        2,
        &["OUTBOX_RETRY_CAP_MS"],
    );
    site.refused(
        &["work"],
        &[("OUTBOX_BATCH_SIZE", "abc")],
        2,
        &["OUTBOX_BATCH_SIZE=\"abc\""],
    );
    // A worker flag without the outbox.
    site.refused(
        &["work"],
        &[("OUTBOX_WORKER_ENABLED", "true")],
        2,
        &["OUTBOX_ENABLED"],
    );
}

#[test]
fn work_in_a_mode_without_a_worker_is_refused() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    for env in [
        &[("OUTBOX_ENABLED", "false")][..],
        &[("OUTBOX_ENABLED", "true")],
        &[("OUTBOX_ENABLED", "true"), ("OUTBOX_WORKER_ENABLED", "false")],
    ] {
        for args in [&["work"][..], &["work", "--once"]] {
            site.refused(args, env, 2, &["runs no worker", "OUTBOX_WORKER_ENABLED=true"]);
        }
    }
    // The shadow worker is a worker: it verifies and completes rows.
    let out = site.ok_env(
        &["work", "--once"],
        &[
            ("OUTBOX_ENABLED", "true"),
            ("OUTBOX_SHADOW_WORKER_ENABLED", "true"),
        ],
    );
    assert!(
        out.starts_with("shadow_only pass: 1 due stream(s), 7 claimed, 7 completed"),
        "{out}"
    );
}

#[test]
fn bad_database_urls_are_usage_errors() {
    let site = Site::migrated();
    for (url, mention) in [
        // A Postgres journal with the (default) SQLite projection database.
        ("postgres://db/outbox", "must use the same backend"),
        ("postgres:db", "must start with postgres://"),
        ("mysql://db/outbox", "unsupported database URL scheme \"mysql\""),
        ("sqlite://", "names no file"),
    ] {
        site.refused(&["report"], &[("OUTBOX_JOURNAL_URL", url)], 2, &[mention]);
    }
    // A malformed Postgres URL is refused without being repeated (it may
    // hold a password), and so is a bad schema name.
    let bad = "postgres://user:hunter2@localhost:notaport/db";
    let err = site.refused(
        &["report"],
        &[("OUTBOX_JOURNAL_URL", bad), ("OUTBOX_PROJECTION_URL", bad)],
        2,
        &["malformed postgres connection url"],
    );
    assert!(!err.contains("hunter2"), "{err}");
    // A mistyped URL is not taken for a file name (and printed).
    for typo in [
        "postgres//app:S3cretPW@host/db",
        "postgresql:/app:S3cretPW@host/db",
        "pg//app:S3cretPW@host/db",
    ] {
        let err = site.refused(
            &["report"],
            &[("OUTBOX_JOURNAL_URL", typo)],
            2,
            &["url not shown"],
        );
        assert!(!err.contains("S3cretPW"), "{err}");
    }
    let pg = "postgres://user@localhost/db";
    site.refused(
        &["report", "--schema", "Bad-Name"],
        &[("OUTBOX_JOURNAL_URL", pg), ("OUTBOX_PROJECTION_URL", pg)],
        2,
        &["--schema", "not a valid postgres identifier"],
    );
    let same = format!("sqlite://{}", site.journal.display());
    site.refused(
        &["report"],
        &[("OUTBOX_PROJECTION_URL", &same)],
        2,
        &["must be different files"],
    );
}

// ---------------------------------------------------------------------------
// demo
// ---------------------------------------------------------------------------

#[test]
fn demo_runs_end_to_end() {
    let site = Site::new();
    let dir = site.dir.join("demo");
    let out = site.ok(&["demo", "--dir", dir.to_str().unwrap()]);
    assert!(out.contains("injected fault: campaign-066/"), "{out}");
    assert!(out.contains("retries scheduled: "), "{out}");
    assert!(out.contains("dead-lettered: 1"), "{out}");
    assert!(
        out.contains("dead: character_tally on campaign-066/"),
        "the cursed die is dead for the tally only: {out}"
    );
    assert!(
        out.contains("before the fix, campaign_summary, roster equal a replay: yes"),
        "the other projections applied every event: {out}"
    );
    assert!(
        out.contains("requeued 1 projection exception(s); the backlog is empty"),
        "{out}"
    );
    let verification = out
        .lines()
        .find(|l| l.trim_start().starts_with("verification:"))
        .unwrap_or_else(|| panic!("no verification line: {out}"));
    assert!(verification.ends_with("(identical)"), "{verification}");

    assert_eq!(mode_of(&dir), 0o700);
    let names: Vec<String> = snapshot(&dir).into_keys().collect();
    assert_eq!(names, ["journal.db", "projections.db", "verify-projections.db"]);
    for name in &names {
        assert_eq!(mode_of(&dir.join(name)), 0o600, "{name}");
    }
    // The files it leaves are ordinary outbox databases.
    let demo = Site {
        journal: dir.join("journal.db"),
        projection: dir.join("projections.db"),
        ..site
    };
    let r = demo.report();
    assert_eq!(r["total"], 0);

    // An existing directory is refused.
    let r = demo.run(&["demo", "--dir", dir.to_str().unwrap()]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("cannot create demo directory"),
        "{}",
        r.explain()
    );
}

#[test]
fn demo_json_summary() {
    let site = Site::new();
    let dir = site.dir.join("demo");
    let s = site.json(&["demo", "--dir", dir.to_str().unwrap(), "--json"]);
    assert_eq!(s["verified"], true, "{s}");
    assert_eq!(s["dead_lettered"], 1);
    assert_eq!(s["requeued"], 1);
    assert_eq!(s["campaigns"], 100);
    assert_eq!(s["events"], 10_000);
    assert_eq!(s["injected"].as_array().unwrap().len(), 3);
    assert_eq!(s["digests"]["store"], s["verification_store_digest"]);
    assert_eq!(s["report"]["total"], 0);
    assert_eq!(s["dir"], dir.display().to_string());
    assert!(
        u(&s["retries_scheduled"]) >= 5,
        "two glitches (2 + 3 failures) and the cursed roll"
    );
    assert_eq!(mode_of(&dir), 0o700);
    for name in ["journal.db", "projections.db", "verify-projections.db"] {
        assert_eq!(mode_of(&dir.join(name)), 0o600, "{name}");
    }
}

#[test]
fn a_scratch_replay_with_the_outbox_off_leaves_the_journal_rows_alone() {
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false)]);
    let scratch = format!("sqlite://{}", site.dir.join("scratch.db").display());
    let off = [
        ("OUTBOX_PROJECTION_URL", scratch.as_str()),
        ("OUTBOX_ENABLED", "false"),
    ];
    site.ok_env(&["migrate"], &off);
    let runs: Value =
        serde_json::from_str(&site.ok_env(&["replay", "--all", "--until", "5", "--json"], &off)).unwrap();
    assert!(
        runs.as_array().unwrap().iter().all(|r| r["state"] == "completed"),
        "{runs}"
    );
    site.ok_env(&["gaps", "--repair"], &off);
    assert_eq!(
        site.report()["pending"],
        PER_CAMPAIGN,
        "the journal's rows are the live projection's"
    );
}

#[test]
fn a_scratch_replay_rebuild_or_repair_leaves_the_journal_rows_alone_by_default() {
    // The default CLI mode runs the apply worker (no mode flag set), so
    // before `--complete-rows` existed a replay into a scratch projection
    // file deleted the live worker's rows.
    let site = Site::migrated();
    seed_backlog(&site, &[("campaign-a", false), ("campaign-b", false)]);
    let before = site.report();
    assert_eq!(before["pending"], 2 * PER_CAMPAIGN, "{before}");
    let scratch = format!("sqlite://{}", site.dir.join("scratch.db").display());
    let env = [("OUTBOX_PROJECTION_URL", scratch.as_str())];
    site.ok_env(&["migrate"], &env);
    for args in [
        &["replay", "--all", "--json"][..],
        &["rebuild", "--all", "--json"],
        &["gaps", "--repair", "--json"],
    ] {
        site.ok_env(args, &env);
        let after = site.report();
        assert_eq!(
            (&after["pending"], &after["total"]),
            (&before["pending"], &before["total"]),
            "`outbox {}` into a scratch database deleted rows: {after}",
            args.join(" ")
        );
    }
    // The scratch projections did catch up: a replay, not a no-op.
    let gaps = site.run_env(&["gaps", "--json"], &env);
    assert_eq!(gaps.stdout.trim(), "[]", "{}", gaps.explain());

    // Against the live projection database, the operator asks for the rows
    // to be completed: repair catches up and clears them.
    let r = site.json(&["gaps", "--repair", "--complete-rows", "--json"]);
    assert_eq!(r["events_applied"], 2 * PER_CAMPAIGN, "{r}");
    assert_eq!(site.report()["total"], 0);
}

#[test]
fn rebuild_with_complete_rows_resolves_a_dead_row_on_the_live_database() {
    // A cursed campaign's head row died; the fix is deployed (the stock
    // binary applies it) and the operator rebuilds the live database.
    let site = Site::migrated();
    seed_with_dead(&site, &[("campaign-a", false), ("campaign-b", true)]);
    let before = site.report();
    site.ok(&["rebuild", "--all"]);
    let after = site.report();
    assert_eq!(
        (&after["dead"], &after["total"]),
        (&1.into(), &before["total"]),
        "rows left alone: {after}"
    );
    site.ok(&["rebuild", "--all", "--complete-rows"]);
    let r = site.report();
    assert_eq!((u(&r["total"]), u(&r["dead"])), (0, 0), "{r}");
}

// ---------------------------------------------------------------------------
// an unavailable database while `work` starts (issue 16)
// ---------------------------------------------------------------------------

/// Holds the journal's write lock from "another process" (a connection of
/// its own) until released.
struct JournalLock {
    conn: Option<outbox_sqlite::rusqlite::Connection>,
}

impl JournalLock {
    fn take(site: &Site) -> JournalLock {
        let c = outbox_sqlite::rusqlite::Connection::open(&site.journal).expect("connect");
        c.execute_batch("BEGIN EXCLUSIVE").expect("lock");
        JournalLock { conn: Some(c) }
    }

    fn release(mut self) {
        let c = self.conn.take().expect("held");
        c.execute_batch("ROLLBACK").expect("unlock");
        c.close().map_err(|(_, e)| e).expect("close");
    }
}

#[test]
fn work_with_no_start_retry_budget_fails_fast_with_one_line_when_the_journal_stays_locked() {
    let site = Site::migrated();
    let lock = JournalLock::take(&site);
    let r = site.run_env(
        &["work"],
        &[("OUTBOX_START_RETRY_MS", "0"), ("OUTBOX_LOG", "off")],
    );
    lock.release();
    assert_eq!(r.code, Some(5), "a storage error: {}", r.explain());
    let err = r.stderr.trim();
    assert_eq!(err.lines().count(), 1, "one line: {}", r.explain());
    assert!(
        err.contains("1 attempt(s)") && err.contains("OUTBOX_START_RETRY_MS"),
        "{err}"
    );
}

#[test]
fn work_waits_for_a_locked_journal_and_sigterm_stops_the_wait_at_once() {
    let site = Site::migrated();
    let lock = JournalLock::take(&site);
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = site
        .command(&["work"])
        .env("OUTBOX_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("spawn worker");
    eventually("a `retrying` line from the waiting start-up", || {
        fs::read_to_string(log.path())
            .unwrap()
            .contains("the database is unavailable; retrying")
    });
    assert!(child.try_wait().unwrap().is_none(), "still waiting, not failed");
    kill_term(&child);
    let status = wait_status(&mut child, "the waiting worker's exit after SIGTERM");
    lock.release();
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "stdout:\n{out}\nstderr:\n{}",
        fs::read_to_string(log.path()).unwrap()
    );
    assert!(!out.contains("running"), "no worker was started: {out}");
    assert_eq!(
        site.json(&["workers", "--json"]),
        serde_json::json!([]),
        "nothing registered"
    );
}

// ---------------------------------------------------------------------------
// generations: blue/green rebuilds, shadow builds, promotion (ADR 0021)
// ---------------------------------------------------------------------------

/// `rebuild --blue-green` swaps a fresh generation in with the digests the
/// projection had; `generations` lists both; the live one cannot be
/// dropped, the old one can (with --yes).
#[test]
fn blue_green_rebuild_swaps_in_an_equal_generation_and_keeps_the_old_one() {
    let site = demo_site();
    let before = digests(&site);
    let swap = site.json(&["rebuild", "--blue-green", "--projection", "roster", "--json"]);
    assert_eq!((u(&swap["from"]), u(&swap["to"])), (1, 2), "{swap}");
    assert!(u(&swap["build"]["applied"]) > 0, "{swap}");
    assert_eq!(digests(&site), before, "the new generation equals the old one");

    let listed = site.json(&["generations", "--json"]);
    let roster = &listed.as_array().unwrap()[0];
    assert_eq!(roster["projection"], "roster", "{listed}");
    assert_eq!((u(&roster["live"]), u(&roster["epoch"])), (2, 1), "{listed}");
    let gens: Vec<(u64, String)> = roster["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (u(&g["generation"]), g["storage"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(gens, [(1, "roster".to_owned()), (2, "roster@g2".to_owned())]);
    let text = site.ok(&["generations", "--projection", "roster"]);
    assert!(text.starts_with("roster: live g2 (version 1), epoch 1"), "{text}");
    assert!(
        text.contains("roster@g2") && text.contains("live") && text.contains("kept"),
        "{text}"
    );

    site.refused(
        &["rebuild", "--blue-green", "--all"],
        &[],
        2,
        &["--blue-green", "--projection"],
    );
    site.refused(
        &[
            "generations",
            "drop",
            "--projection",
            "roster",
            "--generation",
            "2",
            "--yes",
        ],
        &[],
        4,
        &["generation 2", "live"],
    );
    site.refused(
        &[
            "generations",
            "drop",
            "--projection",
            "roster",
            "--generation",
            "1",
        ],
        &[],
        2,
        &["--yes"],
    );
    let out = site.ok(&[
        "generations",
        "drop",
        "--projection",
        "roster",
        "--generation",
        "1",
        "--yes",
    ]);
    assert!(out.contains("dropped generation 1 of roster"), "{out}");
    assert_eq!(
        digests(&site),
        before,
        "dropping the old generation leaves the live one"
    );
}

/// The demo registers version 2 of `character_tally` (it also keeps the
/// highest roll) as a candidate: `shadow diff` lists the streams where it
/// differs and exits 4; `shadow build` builds it beside the live
/// generation; `promote` refuses it naming the first differing stream and
/// changes nothing; `promote --force` makes it live (version 2), changing
/// that projection's digest only.
#[test]
fn a_differing_candidate_is_diffed_refused_and_promoted_by_force() {
    let site = demo_site();
    let before = digests(&site);
    let diff = site.run(&["shadow", "diff", "--projection", "character_tally", "--json"]);
    assert_eq!(diff.code, Some(4), "{}", diff.explain());
    let report: Value = serde_json::from_str(&diff.stdout).expect("diff --json");
    let differing = report["differing"].as_array().unwrap();
    assert!(!differing.is_empty(), "{report}");
    let first = differing[0]["stream"].as_str().unwrap().to_owned();
    assert!(
        differing[0]["candidate"]
            .as_str()
            .unwrap()
            .contains("\"highest\""),
        "{report}"
    );
    assert!(
        diff.stderr.contains(&format!("first: `{first}`")),
        "{}",
        diff.explain()
    );
    site.refused(
        &["shadow", "diff", "--projection", "roster"],
        &[],
        2,
        &["roster", "no candidate"],
    );

    let built = site.json(&["shadow", "build", "--projection", "character_tally", "--json"]);
    assert_eq!((u(&built["generation"]), u(&built["version"])), (2, 2), "{built}");
    assert_eq!(digests(&site), before, "a shadow generation is invisible");

    let refused = site.run(&["promote", "--projection", "character_tally"]);
    assert_eq!(refused.code, Some(4), "{}", refused.explain());
    assert!(
        refused
            .stderr
            .contains(&format!("first differing stream `{first}`")),
        "{}",
        refused.explain()
    );
    assert_eq!(digests(&site), before, "a refused promotion changes nothing");

    let swap = site.json(&["promote", "--projection", "character_tally", "--force", "--json"]);
    assert_eq!((u(&swap["from"]), u(&swap["to"])), (1, 2), "{swap}");
    let after = digests(&site);
    let changed: Vec<&str> = before
        .0
        .iter()
        .zip(&after.0)
        .filter(|(b, a)| b != a)
        .map(|(b, _)| b.0.as_str())
        .collect();
    assert_eq!(
        changed,
        ["character_tally"],
        "only the promoted projection changed"
    );
    let rec = &site.json(&["generations", "--projection", "character_tally", "--json"])[0];
    assert_eq!((u(&rec["live"]), u(&rec["live_version"])), (2, 2), "{rec}");
}
