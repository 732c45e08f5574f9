//! The harness of the `outbox serve` tests: a site of SQLite files, fixtures
//! made through the library, the monitor as a real child process, a tiny
//! HTTP/1.1 client and a strict parser of the Prometheus text format.
#![allow(dead_code, unreachable_pub)]

use outbox_core::OutboxQueueExt as _;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::{ExpectedVersion, NewEvent, OutboxInspector, RetryPolicy, StreamId};
use outbox_demo::domain::{self, Faults, Payload};
use outbox_runtime::{Config, MetricsSnapshot, Outbox};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-demo");
/// Every bounded wait gives up after this long (liveness only).
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The operator token of the tests.
pub const TOKEN: &str = "test-token-0123456789abcdef";

pub struct Site {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub journal: PathBuf,
    pub projection: PathBuf,
}

impl Site {
    /// Fresh, migrated databases.
    pub fn migrated() -> Site {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().canonicalize().expect("canonical tempdir");
        let site = Site {
            journal: dir.join("journal.db"),
            projection: dir.join("projections.db"),
            dir,
            _tmp: tmp,
        };
        site.ok(&["migrate"]);
        site
    }

    /// The binary on this site's databases, no inherited OUTBOX_* variable.
    pub fn command(&self, args: &[&str]) -> Command {
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

    /// Runs a command to its end: (exit code, stdout, stderr).
    pub fn run_env(&self, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
        let out = self
            .command(args)
            .envs(env.iter().copied())
            .output()
            .expect("run outbox-demo");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs a command that must succeed; returns stdout.
    pub fn ok_env(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let (code, out, err) = self.run_env(args, env);
        assert_eq!(code, Some(0), "`{}` failed:\n{out}\n{err}", args.join(" "));
        out
    }

    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_env(args, &[])
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }

    /// `report --json` without digests.
    pub fn report(&self) -> Value {
        self.json(&["report", "--json", "--no-digests", "--limit", "1000"])
    }

    /// (pending, processing, failed, dead) of `report --json`.
    pub fn counts(&self) -> [u64; 4] {
        let r = self.report();
        ["pending", "processing", "failed", "dead"].map(|k| r[k].as_u64().expect("count"))
    }

    async fn library(&self, config: Config) -> Outbox<SqliteJournal, SqliteProjectionStore> {
        let opts = SqliteOptions::default();
        let journal = SqliteJournal::open(&self.journal, opts.clone())
            .await
            .expect("journal");
        let store = SqliteProjectionStore::open(&self.projection, opts)
            .await
            .expect("store");
        let mut b = Outbox::builder(journal, store)
            .config(config)
            .event_types(domain::event_types());
        for p in domain::projections(&Faults::default()) {
            b = b.view_arc(p);
        }
        b.build().await.expect("runtime")
    }

    /// Appends the campaigns with the outbox on and no worker: every event
    /// has a pending row.
    pub fn seed_backlog(&self, campaigns: &[(&str, bool)]) {
        block_on(async {
            let rt = self.library(Config::apply_worker()).await;
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

    /// [`Site::seed_backlog`], then each cursed campaign's row at seq 4 dead
    /// for every projection, as a process-killing event leaves it (ADR
    /// 0029), with three pending rows behind it; one pass applies the
    /// others. The pass is recorded in the journal's activity, as `work
    /// --once` does; returns its counters.
    pub fn seed_with_dead(&self, campaigns: &[(&str, bool)]) -> MetricsSnapshot {
        let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
        self.seed_with_stuck_heads(campaigns, retry, |s, cursed| {
            assert_eq!((s.dead, s.pending), (cursed, cursed * 3), "fixture: {s:?}");
        })
    }
}

impl Site {
    /// [`Site::seed_backlog`], then one library pass with the fault live and
    /// a dead-letter threshold of 1: every row is done and `character_tally`
    /// is dead on each cursed campaign at seq 4 (ADR 0032). The pass is
    /// recorded in the journal's activity; returns its counters.
    pub fn seed_with_dead_projection(&self, campaigns: &[(&str, bool)]) -> MetricsSnapshot {
        self.seed_backlog(campaigns);
        block_on(async {
            let retry = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
            let rt = self.library(Config::apply_worker().with_retry(retry)).await;
            rt.tick().await.expect("tick");
            rt.record_activity().await.expect("record activity");
            let s = rt.journal().summary().await.unwrap();
            assert_eq!(s.total(), 0, "fixture: {s:?}");
            let cursed = campaigns.iter().filter(|(_, c)| *c).count();
            let dead = rt
                .projection_states(Some(outbox_core::SinkStatus::Dead), 100)
                .await
                .unwrap();
            assert_eq!(dead.len(), cursed, "fixture: {dead:?}");
            rt.journal().close().await;
            rt.store().close().await;
            rt.metrics()
        })
    }

    /// [`Site::seed_backlog`], then each cursed campaign's row at seq 4
    /// failed once with a retry an hour away (as an attempt that ended its
    /// process leaves it) and three pending rows behind it.
    pub fn seed_with_failed(&self, campaigns: &[(&str, bool)]) {
        let retry = RetryPolicy::new(Duration::from_secs(3600), Duration::from_secs(3600), 8).unwrap();
        self.seed_with_stuck_heads(campaigns, retry, |s, cursed| {
            assert_eq!((s.failed, s.pending), (cursed, cursed * 3), "fixture: {s:?}");
        });
    }

    /// The backlog, each cursed campaign's events 1..=3 applied and its row
    /// at seq 4 charged one ended attempt under `retry`, then one pass.
    fn seed_with_stuck_heads(
        &self,
        campaigns: &[(&str, bool)],
        retry: RetryPolicy,
        check: impl FnOnce(&outbox_core::OutboxSummary, u64),
    ) -> MetricsSnapshot {
        use outbox_core::{EventJournal, LeaseStore, OutboxQueue, ProjectionStore, Seq, WorkerId};
        self.seed_backlog(campaigns);
        block_on(async {
            let rt = self.library(Config::apply_worker().with_retry(retry)).await;
            let worker = WorkerId::new("fixture-worker").unwrap();
            for (name, _) in campaigns.iter().filter(|(_, c)| *c) {
                let stream = StreamId::new(*name).unwrap();
                let j = rt.journal();
                let (lease, _) = j
                    .acquire_and_claim(&stream, &worker, Duration::from_secs(60), 3)
                    .await
                    .unwrap()
                    .expect("the stream is free");
                let events = j.read_stream(&stream, Seq::FIRST, 3).await.unwrap();
                rt.store()
                    .apply(&stream, &events, rt.projections())
                    .await
                    .expect("apply");
                j.complete(&stream, Seq::new(3).unwrap()).await.unwrap();
                let head = j.claim(&lease, 1).await.unwrap();
                let message = format!("cursed die on {name}/4: its attempts ended the process");
                j.fail(&lease, head[0].seq, &message, &retry).await.unwrap();
                j.release(&lease).await.unwrap();
            }
            rt.tick().await.expect("tick");
            rt.record_activity().await.expect("record activity");
            let s = rt.journal().summary().await.unwrap();
            let cursed = campaigns.iter().filter(|(_, c)| *c).count() as u64;
            check(&s, cursed);
            rt.journal().close().await;
            rt.store().close().await;
            rt.metrics()
        })
    }

    /// An active rebuild run of `roster` owned by a live worker of another
    /// host; returns its id.
    pub fn active_run(&self) -> u64 {
        use outbox_core::{ProjectionName, RunKind, RunStore, WorkerId, WorkerRegistry};
        block_on(async {
            let owner = WorkerId::new("other-host-1-abc").unwrap();
            let journal = SqliteJournal::open(&self.journal, SqliteOptions::default())
                .await
                .unwrap();
            WorkerRegistry::heartbeat(
                &journal,
                &owner,
                "other-host",
                1,
                outbox_core::Mode::OutboxApplyOnly,
                Duration::from_secs(600),
            )
            .await
            .unwrap();
            journal.close().await;
            let store = SqliteProjectionStore::open(&self.projection, SqliteOptions::default())
                .await
                .unwrap();
            let run = store
                .admit_run(
                    RunKind::Rebuild,
                    &ProjectionName::new("roster").unwrap(),
                    None,
                    &owner,
                    Duration::from_secs(600),
                )
                .await
                .unwrap();
            store.close().await;
            run.id
        })
    }
}

pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

fn payload(p: Payload) -> Vec<u8> {
    serde_json::to_vec(&p).expect("payload")
}

/// Seven events of one campaign; the d20 roll at seq 4 is cursed when asked.
pub fn campaign(types: &outbox_core::EventTypeRegistry, name: &str, cursed: bool) -> Vec<NewEvent> {
    let ev = |t: &str, p: Payload| types.event(t, payload(p)).expect("registered type");
    let roll = |sides, result, cursed: bool| Payload {
        character: Some("Aria".into()),
        sides: Some(sides),
        result: Some(result),
        cursed: cursed.then_some(true),
        ..Payload::default()
    };
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
        ev("dice_rolled", roll(20, 20, cursed)),
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
        ev("dice_rolled", roll(6, 3, false)),
    ]
}

/// A child process serving HTTP, killed when dropped.
pub struct Server {
    child: Child,
    /// `host:port` it listens on.
    pub addr: String,
    /// What it wrote to stderr so far.
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// Starts `args` (a command that prints `... http://ADDR/...` as the
    /// line containing `marker` once it listens) and waits for that line.
    pub fn start(site: &Site, args: &[&str], env: &[(&str, &str)], marker: &str) -> Server {
        let mut cmd = site.command(args);
        cmd.envs(env.iter().copied());
        Server::spawn(cmd, marker)
    }

    /// Starts `cmd` (which prints `... http://ADDR/...` as the line
    /// containing `marker` once it listens) and waits for that line.
    pub fn spawn(mut cmd: Command, marker: &str) -> Server {
        let what = format!("{:?}", cmd.get_args().collect::<Vec<_>>());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn server");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        loop {
            line.clear();
            let n = out.read_line(&mut line).expect("read stdout");
            if n == 0 {
                let mut err = String::new();
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                let _ = child.wait();
                panic!("`{what}` exited before listening: {err}");
            }
            if line.contains(marker) {
                break;
            }
        }
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .expect("an address in the start-up line")
            .to_owned();
        // Keep draining stdout so the child never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            let _ = out.read_to_string(&mut sink);
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut err = BufReader::new(child.stderr.take().expect("stderr"));
        let into = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while err.read_line(&mut line).is_ok_and(|n| n > 0) {
                into.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Server { child, addr, stderr }
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// SIGTERM, then the exit status (bounded).
    pub fn stop(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success());
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(Instant::now() < deadline, "the server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn get(&self, path: &str) -> Reply {
        http(&self.addr, "GET", path, &[], b"")
    }

    /// A form POST with `fields` (already urlencoded pairs) and extra headers.
    pub fn post(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
        let mut h = vec![("Content-Type", "application/x-www-form-urlencoded")];
        h.extend_from_slice(headers);
        http(&self.addr, "POST", path, &h, body.as_bytes())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`).
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // The server may answer (413) before reading a large body.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A strict parser of the Prometheus / OpenMetrics text format as
/// `outbox serve` writes it: `# HELP`, `# TYPE`, `# UNIT` lines, samples
/// `name{label="value",...} number` of a declared family (a counter's
/// `_total`, a histogram's `_bucket` with `le`, `_sum` and `_count`), and
/// `# EOF` last.
/// Returns each series (`name{labels}` with labels sorted) and its value.
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut families: BTreeMap<String, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition must end with # EOF");
    let ident = |s: &str| {
        !s.is_empty()
            && s.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    for (i, line) in lines[..lines.len() - 1].iter().enumerate() {
        let at = || format!("line {}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap_or_else(|| panic!("{}", at()));
            assert!(ident(name), "bad metric name, {}", at());
            match kind {
                "TYPE" => {
                    let t = parts.next().unwrap_or_else(|| panic!("{}", at()));
                    assert!(
                        [
                            "gauge",
                            "counter",
                            "histogram",
                            "summary",
                            "unknown",
                            "info",
                            "stateset"
                        ]
                        .contains(&t),
                        "unknown type, {}",
                        at()
                    );
                    assert!(
                        families.insert(name.to_owned(), t.to_owned()).is_none(),
                        "family declared twice, {}",
                        at()
                    );
                }
                "HELP" | "UNIT" => {}
                _ => panic!("unknown comment, {}", at()),
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value, {}", at()));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value, {}", at()));
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((n, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels, {}", at()));
                let mut labels = Vec::new();
                for pair in inner.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad label, {}", at()));
                    assert!(ident(k), "bad label name, {}", at());
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .unwrap_or_else(|| panic!("unquoted label value, {}", at()));
                    labels.push(format!("{k}=\"{v}\""));
                }
                labels.sort();
                (n, labels)
            }
        };
        assert!(ident(name), "bad sample name, {}", at());
        let family = families
            .get(name)
            .map(|_| name)
            .or_else(|| {
                name.strip_suffix("_total")
                    .filter(|f| families.get(*f).is_some_and(|t| t == "counter"))
            })
            .or_else(|| {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .filter(|f| families.get(*f).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or_else(|| panic!("sample of an undeclared family, {}", at()));
        assert_eq!(
            name.ends_with("_bucket") && family != name,
            labels.iter().any(|l| l.starts_with("le=")),
            "a histogram bucket and only a bucket has an `le` label, {}",
            at()
        );
        let key = if labels.is_empty() {
            name.to_owned()
        } else {
            format!("{name}{{{}}}", labels.join(","))
        };
        assert!(out.insert(key, value).is_none(), "series repeated, {}", at());
    }
    out
}

/// Scrapes `/metrics` of `server` and parses it.
pub fn scrape(server: &Server) -> BTreeMap<String, f64> {
    let r = server.get("/metrics");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.headers["content-type"].starts_with("application/openmetrics-text"),
        "{r:?}"
    );
    parse_metrics(&r.body)
}

/// Polls `check` until it is true (liveness only), failing after [`PATIENCE`].
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
