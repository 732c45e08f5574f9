//! The real `bank` binary: `migrate`, `work --once`, `report --json`,
//! `replay`, `rebuild` and `runs` on the bank's own projections, against
//! SQLite files in a temporary directory and against a Postgres schema.
//!
//! The journal is seeded through the library (the binary has no command
//! that appends events): the sample day with the outbox on and no worker,
//! so every event has a `pending` row and nothing is applied until
//! `bank work --once`. Databases are passed through `OUTBOX_JOURNAL_URL`,
//! `OUTBOX_PROJECTION_URL` and `OUTBOX_PG_SCHEMA`, as in a deployment; every
//! other `OUTBOX_*` variable of the test's environment is removed from the
//! child's. The digests `report --json` prints must equal those of the same
//! day applied in-process on the memory adapter, before and after replay and
//! rebuild.

mod common;

use outbox_core::typed::DomainEvent as _;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{SAMPLE_EVENTS, append_sample, check_sample, memory_sample_digests, postgres_url};
use outbox_core::{AppendOptions, EventJournal, ExpectedVersion, StreamId};
use outbox_example_bank::{BankEvent, account, register};
use outbox_postgres::testing::{DropSchemas, unique_schema};
use outbox_postgres::{PgJournal, PgOptions};
use outbox_runtime::{Config, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_bank");
/// A command that has not exited after this long is killed and fails its
/// test (a watchdog: nothing waits for it to pass).
const PATIENCE: Duration = Duration::from_secs(120);

/// Where the bank's databases are, as the binary is told.
struct Bank {
    _tmp: tempfile::TempDir,
    /// The working directory (SQLite files live here).
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
}

/// A finished command.
struct Run {
    args: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn explain(&self) -> String {
        format!(
            "`bank {}` exited with {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args, self.code, self.stdout, self.stderr
        )
    }
}

impl Bank {
    fn sqlite() -> Bank {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().canonicalize().expect("canonical tempdir");
        let url = |file: &str| format!("sqlite://{}", dir.join(file).display());
        Bank {
            env: vec![
                ("OUTBOX_JOURNAL_URL", url("journal.db")),
                ("OUTBOX_PROJECTION_URL", url("projections.db")),
            ],
            dir,
            _tmp: tmp,
        }
    }

    /// Both stores in one schema of the Postgres database at `url`.
    fn postgres(url: &str, schema: &str) -> Bank {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        Bank {
            env: vec![
                ("OUTBOX_JOURNAL_URL", url.to_owned()),
                ("OUTBOX_PROJECTION_URL", url.to_owned()),
                ("OUTBOX_PG_SCHEMA", schema.to_owned()),
            ],
            dir,
            _tmp: tmp,
        }
    }

    fn journal_file(&self) -> PathBuf {
        self.dir.join("journal.db")
    }

    fn projection_file(&self) -> PathBuf {
        self.dir.join("projections.db")
    }

    /// Runs `bank ARGS` with this bank's databases, `extra` variables and no
    /// inherited `OUTBOX_*` variable.
    fn run_env(&self, args: &[&str], extra: &[(&str, &str)]) -> Run {
        let mut cmd = Command::new(BIN);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OUTBOX_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(extra.iter().copied())
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = output_within(cmd, &args.join(" "));
        Run {
            args: args.join(" "),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok_env(&self, args: &[&str], extra: &[(&str, &str)]) -> String {
        let r = self.run_env(args, extra);
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r.stdout
    }

    fn ok(&self, args: &[&str]) -> String {
        self.ok_env(args, &[])
    }

    /// Runs a `--json` command that must succeed and parses its stdout.
    fn json_env(&self, args: &[&str], extra: &[(&str, &str)]) -> Value {
        let out = self.ok_env(args, extra);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("`bank {}`: not JSON ({e}):\n{out}", args.join(" ")))
    }

    fn json(&self, args: &[&str]) -> Value {
        self.json_env(args, &[])
    }

    /// `report --json`, with the digests.
    fn report(&self) -> Value {
        self.json(&["report", "--json"])
    }

    /// The per-projection digests of `report --json`.
    fn digests(&self) -> BTreeMap<String, String> {
        self.report()["digests"]["projections"]
            .as_array()
            .expect("digests.projections")
            .iter()
            .map(|p| {
                (
                    p[0].as_str().unwrap().to_owned(),
                    p[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// The library on this bank's SQLite files, in the outbox's worker mode
    /// (appends enqueue rows and apply nothing; no worker is started).
    async fn sqlite_library(&self) -> Outbox<SqliteJournal, SqliteProjectionStore> {
        let opts = SqliteOptions::default().with_create_if_missing(false);
        let journal = SqliteJournal::open(self.journal_file(), opts.clone())
            .await
            .expect("open journal");
        let store = SqliteProjectionStore::open(self.projection_file(), opts)
            .await
            .expect("open projections");
        register(Outbox::builder(journal, store))
            .config(Config::apply_worker())
            .build()
            .await
            .expect("build runtime")
    }
}

/// The command's output, or a failed test if it runs longer than
/// [`PATIENCE`] (then it is killed, by its own pid).
fn output_within(mut cmd: Command, what: &str) -> Output {
    let child = cmd.spawn().expect("spawn bank");
    let pid = child.id().to_string();
    let (done, wait) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let timed_out = wait.recv_timeout(PATIENCE) == Err(mpsc::RecvTimeoutError::Timeout);
        if timed_out {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        timed_out
    });
    let out = child.wait_with_output().expect("collect output");
    let _ = done.send(());
    let timed_out = watchdog.join().expect("watchdog");
    assert!(
        !timed_out,
        "`bank {what}` did not exit within {PATIENCE:?}; killed\n--- stdout\n{}\n--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

/// The `(kind, projection, state)` of each run of a `--json` run list.
fn runs(v: &Value) -> Vec<(String, String, String)> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a run list: {v}"))
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
            (s("kind"), s("projection"), s("state"))
        })
        .collect()
}

fn run_of(kind: &str, projection: &str) -> (String, String, String) {
    (kind.into(), projection.into(), "completed".into())
}

#[test]
fn help_names_the_bank_and_its_commands() {
    let bank = Bank::sqlite();
    let out = bank.ok(&["-h"]);
    assert!(out.starts_with("The example bank"), "{out}");
    assert!(out.contains("Usage: bank"), "{out}");
    for command in ["work", "report", "replay", "rebuild", "runs", "migrate"] {
        assert!(out.contains(command), "{command}: {out}");
    }
}

#[test]
fn sqlite_work_report_replay_and_rebuild() {
    let bank = Bank::sqlite();
    let migrated = bank.json(&["migrate", "--json"]);
    assert_eq!(migrated["projections"], json!(["balances", "daily_totals"]));

    block_on(async {
        let rt = bank.sqlite_library().await;
        append_sample(&rt).await;
        rt.journal().close().await;
        rt.store().close().await;
    });
    let r = bank.json(&["report", "--json", "--no-digests"]);
    assert_eq!((u(&r["pending"]), u(&r["total"])), (SAMPLE_EVENTS, SAMPLE_EVENTS));

    // One pass drains the day: three accounts, every row completed.
    let tick = bank.json(&["work", "--once", "--json"]);
    assert_eq!(
        (
            u(&tick["due_streams"]),
            u(&tick["completed"]),
            u(&tick["failed"]),
            u(&tick["dead_lettered"])
        ),
        (3, SAMPLE_EVENTS, 0, 0),
        "{tick}"
    );
    let report = bank.report();
    assert_eq!(u(&report["total"]), 0, "{report}");
    let want = block_on(memory_sample_digests());
    assert_eq!(bank.digests(), want, "the binary's digests vs the memory run's");
    let check = || {
        block_on(async {
            let store = SqliteProjectionStore::open(bank.projection_file(), SqliteOptions::default())
                .await
                .unwrap();
            check_sample(&store, "sqlite via bank").await;
            store.close().await;
        });
    };
    check();
    // A second pass finds nothing to do.
    let tick = bank.json(&["work", "--once", "--json"]);
    assert_eq!((u(&tick["due_streams"]), u(&tick["claimed"])), (0, 0), "{tick}");

    // Replay from the checkpoints: nothing is missing, nothing changes.
    let replay = bank.json(&["replay", "--projection", "balances", "--json"]);
    assert_eq!(runs(&replay), [run_of("catch_up", "balances")], "{replay}");
    assert_eq!(bank.digests(), want, "after replay");

    // Rebuild from the journal's origin: the same documents again.
    let rebuild = bank.json(&["rebuild", "--projection", "balances", "--json"]);
    assert_eq!(runs(&rebuild), [run_of("rebuild", "balances")], "{rebuild}");
    assert_eq!(bank.digests(), want, "after rebuild");
    let all = bank.json(&["rebuild", "--all", "--json"]);
    assert_eq!(
        runs(&all),
        [run_of("rebuild", "balances"), run_of("rebuild", "daily_totals")],
        "{all}"
    );
    assert_eq!(bank.digests(), want, "after rebuild --all");
    check();

    // The runs, newest first, all completed; none is active.
    let listed = bank.json(&["runs", "list", "--json"]);
    assert_eq!(
        runs(&listed),
        [
            run_of("rebuild", "daily_totals"),
            run_of("rebuild", "balances"),
            run_of("rebuild", "balances"),
            run_of("catch_up", "balances"),
        ],
        "{listed}"
    );
    assert_eq!(bank.report()["active_runs"], json!([]));
    let text = bank.ok(&["runs"]);
    assert_eq!(
        text.lines().filter(|l| l.contains("completed")).count(),
        4,
        "{text}"
    );
}

#[test]
fn sqlite_an_overdraft_is_dead_lettered_and_reported() {
    let bank = Bank::sqlite();
    bank.ok(&["migrate"]);
    block_on(async {
        let rt = bank.sqlite_library().await;
        append_sample(&rt).await;
        let events = [
            BankEvent::AccountOpened { owner: "Dave".into() },
            BankEvent::Deposited {
                cents: 1_000,
                day: "2026-03-02".into(),
            },
            BankEvent::Withdrawn {
                cents: 1_500,
                day: "2026-03-02".into(),
            },
            BankEvent::Deposited {
                cents: 2_000,
                day: "2026-03-03".into(),
            },
        ];
        let events = events.iter().map(|e| e.to_new_event().unwrap()).collect();
        rt.append(
            &StreamId::new("account-dave").unwrap(),
            ExpectedVersion::NoStream,
            events,
        )
        .await
        .unwrap();
        rt.journal().close().await;
        rt.store().close().await;
    });

    // Dead at the first failure, for the balances on Dave's account only
    // (ADR 0032): every row is done, the daily totals applied it all.
    let threshold = [("OUTBOX_DEAD_LETTER_THRESHOLD", "1")];
    let tick = bank.json_env(&["work", "--once", "--json"], &threshold);
    assert_eq!(
        (u(&tick["completed"]), u(&tick["dead_lettered"])),
        (SAMPLE_EVENTS + 4, 1),
        "{tick}"
    );
    let dead = bank.json(&["report", "--status", "dead", "--json", "--no-digests"]);
    assert_eq!(
        (u(&dead["total"]), u(&dead["projection_exceptions"]["dead"])),
        (0, 1),
        "{dead}"
    );
    let e = &dead["projection_exceptions"]["listed"][0];
    assert_eq!(
        (&e["projection"], &e["stream"], &e["seq"]),
        (&json!("balances"), &json!("account-dave"), &json!(3))
    );
    let error = e["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("insufficient funds on account-dave/3"), "{error}");
    let text = bank.ok(&["report", "--no-digests"]);
    assert!(text.contains("balances on account-dave/3 dead"), "{text}");

    // Requeued without a fix, it dies again; the account stays as it was.
    let requeued = bank.json(&["requeue", "--stream", "account-dave", "--seq", "3", "--json"]);
    assert_eq!(requeued["projections"][0]["status"], "failed", "{requeued}");
    let tick = bank.json_env(&["work", "--once", "--json"], &threshold);
    assert_eq!(
        (u(&tick["caught_up"]), u(&tick["dead_lettered"])),
        (0, 1),
        "{tick}"
    );
    block_on(async {
        let store = SqliteProjectionStore::open(bank.projection_file(), SqliteOptions::default())
            .await
            .unwrap();
        let dave = account(&store, "account-dave").await.unwrap().unwrap();
        assert_eq!((dave.balance_cents, dave.last_seq), (1_000, 2));
        store.close().await;
    });
}

#[test]
fn postgres_work_once_and_rebuild() {
    let Some(url) = postgres_url("postgres_work_once_and_rebuild") else {
        return;
    };
    let schema = unique_schema("bin");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let bank = Bank::postgres(&url, &schema);
    let migrated = bank.json(&["migrate", "--json"]);
    assert_eq!(migrated["projections"], json!(["balances", "daily_totals"]));

    // Seeded on the journal port directly: rows enqueued, nothing applied.
    block_on(async {
        let options = PgOptions::default()
            .with_schema(schema.clone())
            .with_max_connections(2);
        let journal = PgJournal::connect(&url, options).await.expect("connect journal");
        for request in outbox_example_bank::sample().unwrap() {
            journal
                .append(&[request], AppendOptions::enqueue())
                .await
                .expect("append");
        }
        journal.close().await;
    });
    let r = bank.json(&["report", "--json", "--no-digests"]);
    assert_eq!(u(&r["pending"]), SAMPLE_EVENTS, "{r}");

    let tick = bank.json(&["work", "--once", "--json"]);
    assert_eq!(
        (u(&tick["completed"]), u(&tick["dead_lettered"])),
        (SAMPLE_EVENTS, 0),
        "{tick}"
    );
    assert_eq!(u(&bank.report()["total"]), 0);
    let want = block_on(memory_sample_digests());
    assert_eq!(bank.digests(), want, "Postgres via bank vs memory");

    let rebuild = bank.json(&["rebuild", "--projection", "balances", "--json"]);
    assert_eq!(runs(&rebuild), [run_of("rebuild", "balances")], "{rebuild}");
    assert_eq!(bank.digests(), want, "after rebuild");
    let all = bank.json(&["rebuild", "--all", "--json"]);
    assert_eq!(
        runs(&all),
        [run_of("rebuild", "balances"), run_of("rebuild", "daily_totals")],
        "{all}"
    );
    assert_eq!(bank.digests(), want, "after rebuild --all");
}
