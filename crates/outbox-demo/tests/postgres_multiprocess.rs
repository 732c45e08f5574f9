//! Real `outbox work` processes on one Postgres schema.
//!
//! Issue 6: three of them, with stream leases, one killed with SIGKILL while
//! it holds stream leases. Nothing may be lost
//! or applied twice (the demo projections are non-idempotent counters), the
//! killed process's streams are taken over once its leases expire, and the
//! result equals a catch-up replay into a fresh schema.
//!
//! Issue 13: with partition leasing, three grow to five and shrink to two
//! while events are appended; after each change every partition has one
//! live owner, and nothing is lost or doubled.
//!
//! Issue 40: a transaction left open holds back, from every sink, what
//! commits after it began; `outbox sinks`, the monitor's overview and
//! `/metrics` say so, and stop saying so once it ends.
//!
//! Needs `OUTBOX_TEST_DATABASE_URL` (`cargo xtask test` provides one);
//! without it the test is skipped with one line saying so (outside CI).

mod support;

use std::collections::BTreeMap;
use std::fs::File;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, ExpectedVersion, NewEvent, Projection, ProjectionName,
    ProjectionStore, StreamId, ViewReader, view_projection,
};
use outbox_demo::domain::{self, Faults, Payload};
use outbox_postgres::sqlx::{self, PgPool};
use outbox_postgres::testing::{DropSchemas, unique_schema};
use outbox_postgres::{PgJournal, PgOptions, PgProjectionStore, PgTx};
use outbox_runtime::{Config, Outbox};
use tokio_util::sync::CancellationToken;

const CAMPAIGNS: usize = 200;
const EVENTS_PER_CAMPAIGN: u64 = 100;
const LEASE_TTL: Duration = Duration::from_millis(2000);
const POLL: Duration = Duration::from_millis(200);
const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// The worker processes; any still running when dropped (a failed
/// assertion) are killed, so no test leaves workers behind.
struct Workers(Vec<Worker>);

struct Worker {
    id: String,
    child: Child,
    stderr: tempfile::NamedTempFile,
    exited: Option<ExitStatus>,
}

impl Worker {
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("wait for a worker") {
                self.exited = Some(s);
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "worker {} did not exit within {limit:?}; stderr:\n{}",
                self.id,
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success(), "kill {sig} {} failed", self.child.id());
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if w.exited.is_none() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

/// A partition-leasing worker's heartbeat interval (registry and partition
/// lease TTL: three of them, at least 1 s).
const HEARTBEAT: Duration = Duration::from_millis(300);

/// `outbox work` as worker `id`, with partition leasing or stream leases.
fn spawn_worker(url: &str, schema: &str, id: &str, leasing: bool) -> Worker {
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let child = demo(url, schema, &["work", "--quiet"])
        .env("OUTBOX_LEASE_TTL_MS", LEASE_TTL.as_millis().to_string())
        .env("OUTBOX_POLL_INTERVAL_MS", POLL.as_millis().to_string())
        .env("OUTBOX_WORKER_ID", id)
        // The backlog goes through leases and claims, not start-up repair.
        .env("OUTBOX_REPAIR_ON_START", "false")
        .env("OUTBOX_BATCH_SIZE", "10")
        .env("OUTBOX_LEASING", leasing.to_string())
        .env("OUTBOX_HEARTBEAT_INTERVAL_MS", HEARTBEAT.as_millis().to_string())
        .stdout(Stdio::null())
        .stderr(File::create(stderr.path()).unwrap())
        .spawn()
        .expect("spawn `outbox work`");
    Worker {
        id: id.to_owned(),
        child,
        stderr,
        exited: None,
    }
}

impl Worker {
    /// Waits for a SIGTERMed worker's exit, which must be clean.
    fn exits_cleanly(&mut self) {
        let status = self.wait(Duration::from_secs(30));
        assert_eq!(
            status.code(),
            Some(0),
            "{} after SIGTERM; stderr:\n{}",
            self.id,
            self.stderr()
        );
    }
}

/// SIGTERMs `workers` and waits for each one's clean exit.
fn stop(workers: &mut [Worker]) {
    for w in workers.iter() {
        w.signal("-TERM");
    }
    for w in workers {
        w.exits_cleanly();
    }
}

/// A small deterministic generator for the dice.
struct Rng(u64);

impl Rng {
    fn roll(&mut self, sides: i64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % sides as u64) as i64 + 1
    }
}

fn event(types: &outbox_core::EventTypeRegistry, t: &str, p: Payload) -> NewEvent {
    types
        .event(t, serde_json::to_vec(&p).unwrap())
        .expect("registered type")
}

/// What was appended for one campaign: dice rolls and their total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Appended {
    rolls: i64,
    total: i64,
}

/// One campaign: created, one player, one character, then dice rolls.
fn campaign(types: &outbox_core::EventTypeRegistry, i: usize, rng: &mut Rng) -> (Vec<NewEvent>, Appended) {
    let mut events = vec![
        event(
            types,
            "campaign_created",
            Payload {
                name: Some(format!("campaign {i}")),
                ..Payload::default()
            },
        ),
        event(
            types,
            "player_joined",
            Payload {
                player: Some("p1".into()),
                ..Payload::default()
            },
        ),
        event(
            types,
            "character_created",
            Payload {
                character: Some("hero".into()),
                player: Some("p1".into()),
                ..Payload::default()
            },
        ),
    ];
    let mut sum = Appended::default();
    while (events.len() as u64) < EVENTS_PER_CAMPAIGN {
        let sides = [4, 6, 8, 12, 20][rng.roll(5) as usize - 1];
        let result = rng.roll(sides);
        sum.rolls += 1;
        sum.total += result;
        events.push(event(
            types,
            "dice_rolled",
            Payload {
                character: Some("hero".into()),
                sides: Some(sides),
                result: Some(result),
                ..Payload::default()
            },
        ));
    }
    (events, sum)
}

fn name(i: usize) -> String {
    format!("campaign-{i:03}")
}

/// The journal clock (no test offset in this schema) as SQL.
const NOW_MS: &str = "floor(extract(epoch from clock_timestamp()) * 1000)::bigint";

async fn live_leases_of(pool: &PgPool, owner: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT stream FROM stream_leases WHERE owner = $1 AND expires_at > {NOW_MS} ORDER BY stream"
    )))
    .bind(owner)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn outbox_counts(pool: &PgPool) -> BTreeMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM outbox GROUP BY status")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn digests(
    store: &PgProjectionStore,
    projections: &[Arc<dyn Projection<PgTx>>],
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in projections {
        let d = store.digest(p.as_ref()).await.expect("digest");
        out.push((p.name().to_string(), d.to_string()));
    }
    out
}

/// Zero lost, zero doubled: the demo's counters (non-idempotent) equal what
/// was appended to each campaign.
async fn assert_counters(store: &PgProjectionStore, appended: &BTreeMap<String, Appended>) {
    let summary = ViewReader::new(store, ProjectionName::new("campaign_summary").unwrap());
    let campaigns: Vec<(String, i64, i64, i64, i64)> = summary
        .scan::<domain::Campaign>("campaigns", None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|(c, v)| {
            let n = |x: u64| i64::try_from(x).unwrap();
            (c, n(v.rolls), n(v.last_seq), n(v.players), n(v.characters))
        })
        .collect();
    assert_eq!(campaigns.len(), CAMPAIGNS, "one row per campaign");
    for (c, rolls, last_seq, players, characters) in &campaigns {
        let want = appended[c];
        assert_eq!(
            (*rolls, *last_seq, *players, *characters),
            (want.rolls, EVENTS_PER_CAMPAIGN as i64, 1, 1),
            "campaign {c}: rolls, last_seq, players, characters (a lost apply is lower, a doubled one higher)"
        );
    }
    let tally = ViewReader::new(store, ProjectionName::new("character_tally").unwrap());
    let tallies: Vec<(String, String, i64, i64)> = tally
        .scan::<domain::Tally>("tally", None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|(key, t)| {
            let (c, ch) = key.split_once('/').expect("campaign/character");
            (
                c.to_owned(),
                ch.to_owned(),
                i64::try_from(t.rolls).unwrap(),
                t.total,
            )
        })
        .collect();
    assert_eq!(tallies.len(), CAMPAIGNS, "one tally per character");
    for (c, ch, rolls, total) in &tallies {
        let want = appended[c];
        assert_eq!(
            (ch.as_str(), *rolls, *total),
            ("hero", want.rolls, want.total),
            "tally of {c}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_one_killed_nothing_lost_or_doubled() {
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schema = unique_schema("work");
    let fresh = unique_schema("replay");
    let _drop = DropSchemas::new(&url, [schema.clone(), fresh.clone()]);
    let options = PgOptions::default().with_schema(&schema).with_max_connections(4);

    // 1. Seed through the library: 200 campaigns x 100 events, every event
    //    with a pending outbox row, nothing applied.
    let journal = PgJournal::connect(&url, options.clone()).await.expect("journal");
    let store = PgProjectionStore::sharing(&journal).await.expect("projections");
    let projections: Vec<Arc<dyn Projection<PgTx>>> = domain::projections(&Faults::default())
        .into_iter()
        .map(view_projection)
        .collect();
    store.setup(&projections).await.expect("setup");
    let types = domain::event_types();
    let mut rng = Rng(0x6e0b_0c5e);
    let mut appended = BTreeMap::new();
    let mut batch = Vec::new();
    for i in 0..CAMPAIGNS {
        let (events, sum) = campaign(&types, i, &mut rng);
        appended.insert(name(i), sum);
        batch.push(AppendRequest::new(
            StreamId::new(name(i)).unwrap(),
            ExpectedVersion::NoStream,
            events,
        ));
        if batch.len() == 25 {
            journal
                .append(&batch, AppendOptions::enqueue())
                .await
                .expect("append");
            batch.clear();
        }
    }
    let pool = journal.pool().clone();
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        total as u64,
        CAMPAIGNS as u64 * EVENTS_PER_CAMPAIGN,
        "seeded backlog"
    );

    // 2. Three worker processes.
    let mut workers = Workers(
        (0..3)
            .map(|i| spawn_worker(&url, &schema, &format!("mp-worker-{i}"), false))
            .collect(),
    );
    let victim = workers.0[0].id.clone();

    // 3. SIGKILL worker 0 once it holds at least one stream lease.
    let start = Instant::now();
    loop {
        if !live_leases_of(&pool, &victim).await.is_empty() {
            break;
        }
        if let Some(s) = workers.0[0].child.try_wait().unwrap() {
            panic!("worker 0 exited early ({s}); stderr:\n{}", workers.0[0].stderr());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "worker 0 never held a stream lease within 60 s; stderr:\n{}",
            workers.0[0].stderr()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    workers.0[0].signal("-KILL");
    let killed_at = Instant::now();
    let status = workers.0[0].wait(Duration::from_secs(10));
    assert!(!status.success(), "SIGKILL ends the process: {status}");
    // A dead process changes nothing any more: what it still holds is
    // stranded until its leases expire. For each such stream, the seq that
    // must be completed: its claimed (processing) run, else its head.
    let stranded: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT l.stream, COALESCE((SELECT max(seq) FROM outbox o WHERE o.stream = l.stream AND o.status = 'processing'), \
                                   (SELECT min(seq) FROM outbox o WHERE o.stream = l.stream)) AS target \
         FROM stream_leases l WHERE l.owner = $1 AND l.expires_at > {NOW_MS} ORDER BY l.stream"
    )))
    .bind(&victim)
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .filter_map(|(s, t): (String, Option<i64>)| t.map(|t| (s, t)))
    .collect();

    // 4. Wait for the takeover of the stranded streams and for the outbox to
    //    be empty.
    let mut taken_over: Option<Duration> = stranded.is_empty().then(Duration::default);
    loop {
        if taken_over.is_none() {
            let mut done = true;
            for (s, target) in &stranded {
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM outbox WHERE stream = $1 AND seq <= $2")
                        .bind(s)
                        .bind(target)
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                if left > 0 {
                    done = false;
                    break;
                }
            }
            if done {
                taken_over = Some(killed_at.elapsed());
            }
        }
        let counts = outbox_counts(&pool).await;
        if counts.is_empty() && taken_over.is_some() {
            break;
        }
        if killed_at.elapsed() > DRAIN_LIMIT {
            let errs: Vec<String> = workers.0[1..]
                .iter()
                .map(|w| format!("--- {} stderr:\n{}", w.id, w.stderr()))
                .collect();
            panic!(
                "the outbox did not drain within {DRAIN_LIMIT:?} of the SIGKILL: rows by status {counts:?}, \
                 stranded streams taken over: {}\n{}",
                taken_over.is_some(),
                errs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = killed_at.elapsed();
    let takeover = taken_over.unwrap();
    eprintln!(
        "SIGKILLed {victim} holding {} stream lease(s) with unfinished work; the others completed them {:?} \
         after the kill (lease ttl {LEASE_TTL:?}, poll {POLL:?}); outbox empty {drained:?} after the kill",
        stranded.len(),
        takeover
    );
    // How soon the takeover came is reported, not asserted: on a busy
    // machine the survivors' own backlog comes first, and a wall-clock
    // bound failed there (34.7 s against 32.2 s) with nothing wrong. That
    // the stranded streams were taken over at all is what the loop above
    // waited for; steps 6 and 7 check that nothing was lost or doubled.

    // 5. SIGTERM the other two: clean exits.
    stop(&mut workers.0[1..]);

    // 6. Zero lost, zero doubled: the counters equal what was appended.
    assert_counters(&store, &appended).await;

    // 7. The digests equal a catch-up replay of the journal into a fresh schema.
    let replay_store = PgProjectionStore::connect(&url, PgOptions::default().with_schema(&fresh))
        .await
        .expect("fresh projections");
    let mut b = Outbox::builder(journal.clone(), replay_store.clone())
        .config(Config::default())
        .event_types(domain::event_types());
    for p in domain::projections(&Faults::default()) {
        b = b.view_arc(p);
    }
    let verifier = b.build().await.expect("verifier runtime");
    let cancel = CancellationToken::new();
    for p in verifier.projections().to_vec() {
        let run = verifier
            .replay(p.name().as_str(), None, &cancel)
            .await
            .expect("replay");
        assert_eq!(run.state, outbox_core::RunState::Completed, "{run:?}");
    }
    let worked = digests(&store, &projections).await;
    let replayed = digests(&replay_store, verifier.projections()).await;
    assert_eq!(
        worked, replayed,
        "the workers' projections equal a catch-up replay"
    );

    // The CLI reports the same digests.
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-demo"))
        .args(["report", "--json", "--limit", "0"])
        .env("OUTBOX_JOURNAL_URL", &url)
        .env("OUTBOX_PROJECTION_URL", &url)
        .env("OUTBOX_PG_SCHEMA", &schema)
        .output()
        .expect("outbox report");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["total"], 0, "{report}");
    let reported: Vec<(String, String)> = report["digests"]["projections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(reported, worked);

    replay_store.close().await;
    journal.close().await;
}

/// Whether every partition has exactly one live owner, the one the
/// assignment over `live` gives it (each partition lease row has one owner;
/// "live" means unexpired by the database's clock).
async fn settled(pool: &PgPool, live: &[&str], count: u16) -> bool {
    let rows: Vec<(i32, Option<String>, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT partition_no, owner, expires_at > {NOW_MS} FROM outbox_partition_leases ORDER BY partition_no"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    let ids: Vec<outbox_core::WorkerId> = live
        .iter()
        .map(|w| outbox_core::WorkerId::new(*w).unwrap())
        .collect();
    let want = outbox_core::assign(&ids, count);
    rows.len() == usize::from(count)
        && rows.iter().zip(&want).all(|((p, owner, held), (wp, wo))| {
            *held && i32::from(wp.get()) == *p && owner.as_deref() == Some(wo.as_str())
        })
}

/// Waits until [`settled`] and returns how long it took (fails after 60 s,
/// naming the partitions and the workers' stderr).
async fn wait_settled(pool: &PgPool, workers: &Workers, live: &[&str], since: Instant) -> Duration {
    loop {
        if settled(pool, live, outbox_core::DEFAULT_PARTITIONS).await {
            return since.elapsed();
        }
        if since.elapsed() > Duration::from_secs(60) {
            let leases: Vec<(i32, Option<String>, i64)> =
                sqlx::query_as("SELECT partition_no, owner, epoch FROM outbox_partition_leases ORDER BY 1")
                    .fetch_all(pool)
                    .await
                    .unwrap();
            let errs: Vec<String> = workers
                .0
                .iter()
                .map(|w| format!("--- {} stderr:\n{}", w.id, w.stderr()))
                .collect();
            panic!(
                "partitions not settled on {live:?} within 60 s: {leases:?}\n{}",
                errs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Issue 13: three `outbox work` processes with partition leasing on one
/// Postgres schema grow to five and shrink to two (one SIGKILLed, two
/// SIGTERMed) while 200 streams x 100 events are appended in four rounds.
/// After each change, every partition has exactly one live owner (the one
/// the assignment over the live workers names); nothing is lost or doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_follow_three_then_five_then_two_workers() {
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schema = unique_schema("parts");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    let options = PgOptions::default().with_schema(&schema).with_max_connections(4);
    let journal = PgJournal::connect(&url, options.clone()).await.expect("journal");
    let store = PgProjectionStore::sharing(&journal).await.expect("projections");
    let projections: Vec<Arc<dyn Projection<PgTx>>> = domain::projections(&Faults::default())
        .into_iter()
        .map(view_projection)
        .collect();
    store.setup(&projections).await.expect("setup");
    let pool = journal.pool().clone();
    let types = domain::event_types();
    let mut rng = Rng(0x9a27_1e55);
    let mut appended = BTreeMap::new();
    let mut campaigns = Vec::new();
    for i in 0..CAMPAIGNS {
        let (events, sum) = campaign(&types, i, &mut rng);
        appended.insert(name(i), sum);
        campaigns.push(events);
    }
    // Round k appends events 25k+1 ..= 25k+25 of every campaign.
    const ROUND: usize = 25;
    let append_round = |k: usize| {
        let batch: Vec<AppendRequest> = campaigns
            .iter()
            .enumerate()
            .map(|(i, events)| {
                AppendRequest::new(
                    StreamId::new(name(i)).unwrap(),
                    ExpectedVersion::Exact((k * ROUND) as u64),
                    events[k * ROUND..(k + 1) * ROUND].to_vec(),
                )
            })
            .collect();
        let journal = journal.clone();
        async move {
            for chunk in batch.chunks(25) {
                journal
                    .append(chunk, AppendOptions::enqueue())
                    .await
                    .expect("append");
            }
        }
    };
    append_round(0).await;

    let ids: Vec<String> = (0..5).map(|i| format!("part-worker-{i}")).collect();
    let mut workers = Workers(Vec::new());
    let started = Instant::now();
    for id in &ids[..3] {
        workers.0.push(spawn_worker(&url, &schema, id, true));
    }
    let three: Vec<&str> = ids[..3].iter().map(String::as_str).collect();
    let to_three = wait_settled(&pool, &workers, &three, started).await;
    append_round(1).await;

    let grew = Instant::now();
    for id in &ids[3..] {
        workers.0.push(spawn_worker(&url, &schema, id, true));
    }
    let five: Vec<&str> = ids.iter().map(String::as_str).collect();
    let to_five = wait_settled(&pool, &workers, &five, grew).await;
    append_round(2).await;

    // Shrink to two: one killed (its partitions are taken over when its
    // registry entry and leases expire), two stopped (they hand theirs over).
    let shrank = Instant::now();
    workers.0[0].signal("-KILL");
    for w in &workers.0[1..3] {
        w.signal("-TERM");
    }
    assert!(!workers.0[0].wait(Duration::from_secs(10)).success());
    for w in &mut workers.0[1..3] {
        w.exits_cleanly();
    }
    let two: Vec<&str> = ids[3..].iter().map(String::as_str).collect();
    let to_two = wait_settled(&pool, &workers, &two, shrank).await;
    append_round(3).await;

    let last = Instant::now();
    loop {
        let counts = outbox_counts(&pool).await;
        if counts.is_empty() {
            break;
        }
        assert!(
            last.elapsed() < DRAIN_LIMIT,
            "the outbox did not drain within {DRAIN_LIMIT:?}: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        settled(&pool, &two, outbox_core::DEFAULT_PARTITIONS).await,
        "still one live owner per partition after the drain"
    );
    stop(&mut workers.0[3..]);
    let released: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_partition_leases WHERE owner IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(released, 0, "stopped workers release their partitions");
    assert_counters(&store, &appended).await;
    eprintln!(
        "rebalance (heartbeat {HEARTBEAT:?}, partition lease ttl {:?}): 3 workers settled {to_three:?} after \
         their start, 5 settled {to_five:?} after two joined, 2 settled {to_two:?} after one SIGKILL and two \
         SIGTERMs; drained {:?} after the last round",
        (HEARTBEAT * 3).max(Duration::from_secs(1)),
        last.elapsed()
    );
    journal.close().await;
}

/// A sink that takes everything (what it got is not the point here: the
/// runtime tests check delivery; this one checks what operators see).
struct Taker(outbox_core::SinkName);

#[outbox_core::async_trait]
impl outbox_core::Sink for Taker {
    fn name(&self) -> &outbox_core::SinkName {
        &self.0
    }

    async fn publish(&self, events: &[outbox_core::Event]) -> outbox_core::Published {
        outbox_core::Published::all(events.len())
    }
}

/// The demo binary on `schema`, no inherited `OUTBOX_*` variable.
fn demo(url: &str, schema: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-demo"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OUTBOX_") {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .env("OUTBOX_JOURNAL_URL", url)
        .env("OUTBOX_PROJECTION_URL", url)
        .env("OUTBOX_PG_SCHEMA", schema)
        .stdin(Stdio::null());
    cmd
}

fn demo_ok(url: &str, schema: &str, args: &[&str]) -> String {
    let out = demo(url, schema, args).output().expect("run the demo binary");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{args:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_left_open_shows_as_held_back_in_sinks_the_monitor_and_metrics() {
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schema = unique_schema("held");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    demo_ok(&url, &schema, &["migrate"]);
    let options = PgOptions::default().with_schema(&schema).with_max_connections(4);
    let journal = PgJournal::connect(&url, options).await.expect("journal");
    let store = PgProjectionStore::sharing(&journal).await.expect("projections");
    let types = domain::event_types();
    let rt = Outbox::builder(journal.clone(), store)
        .config(
            Config::apply_worker()
                .with_leasing(false)
                .with_repair_on_start(false),
        )
        .event_types(types.clone())
        .sink_arc(Arc::new(Taker(outbox_core::SinkName::new("bus").unwrap())))
        .build()
        .await
        .expect("runtime");
    let mut rng = Rng(0x40);
    let (warm, _) = campaign(&types, 0, &mut rng);
    rt.append(&StreamId::new(name(0)).unwrap(), ExpectedVersion::NoStream, warm)
        .await
        .expect("append");
    rt.deliver().await.expect("deliver");
    let server = support::Server::spawn(
        demo(&url, &schema, &["serve", "--addr", "127.0.0.1:0"]),
        "serving the",
    );
    // `quiet` takes its positions in a transaction left open; `busy`
    // commits after it began and is held back from the sink.
    let mut open = journal.begin().await.expect("begin");
    let (quiet, _) = campaign(&types, 1, &mut rng);
    journal
        .append_in(
            &mut open,
            &[AppendRequest::new(
                StreamId::new(name(1)).unwrap(),
                ExpectedVersion::NoStream,
                quiet,
            )],
            AppendOptions::enqueue(),
        )
        .await
        .expect("append in the open transaction");
    let (busy, _) = campaign(&types, 2, &mut rng);
    rt.append(&StreamId::new(name(2)).unwrap(), ExpectedVersion::NoStream, busy)
        .await
        .expect("append");
    rt.deliver().await.expect("deliver");
    let cli = demo_ok(&url, &schema, &["sinks"]);
    assert!(cli.contains("held back: "), "{cli}");
    let page = server.get("/").body;
    assert!(
        page.contains("<h2>Sinks</h2>") && page.contains("<td>bus</td>"),
        "{page}"
    );
    let held = |page: &str| -> Option<u64> {
        let at = page.find("id=\"sinks-held-back\" data-events=\"")?;
        let rest = &page[at + "id=\"sinks-held-back\" data-events=\"".len()..];
        rest[..rest.find('"')?].parse().ok()
    };
    // Every event of `busy` at least; transactions of other tests on the
    // server may hold back more, never less.
    assert!(held(&page).is_some_and(|n| n >= EVENTS_PER_CAMPAIGN), "{page}");
    let metrics = support::parse_metrics(&server.get("/metrics").body);
    assert!(
        metrics["outbox_sink_held_back_events"] >= EVENTS_PER_CAMPAIGN as f64,
        "{metrics:?}"
    );
    assert_eq!(
        metrics[r#"outbox_sink_streams{sink="bus",status="dead"}"#], 0.0,
        "{metrics:?}"
    );
    open.commit().await.expect("commit");
    // Once it ends, nothing of ours is held back (other tests' transactions
    // end too: a bounded wait for liveness only).
    support::eventually("the held-back note clears", || {
        held(&server.get("/").body).is_none()
    });
    assert!(!demo_ok(&url, &schema, &["sinks"]).contains("held back"));
    // Re-keying (after a logical restore) is harmless on a sane journal.
    let rekeyed = demo_ok(&url, &schema, &["sinks", "rekey"]);
    assert!(rekeyed.starts_with("re-keyed 300 event(s)"), "{rekeyed}");
    assert_eq!(server.stop().code(), Some(0));
    rt.journal().close().await;
}

/// Read-your-writes across processes on Postgres (ADR 0032): a worker
/// process applies, `outbox wait` in another resolves; it exits 4 at once
/// for a projection dead on the stream or paused, and 5 when no worker
/// applies within the timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_wait_across_processes_on_postgres() {
    use outbox_core::{SinkStore, projection_consumer};
    let Some(url) = outbox_testkit::pg::test_database_url() else {
        return;
    };
    let schema = unique_schema("wait");
    let _drop = DropSchemas::new(&url, [schema.clone()]);
    demo_ok(&url, &schema, &["migrate"]);
    let options = PgOptions::default().with_schema(&schema).with_max_connections(2);
    let journal = PgJournal::connect(&url, options).await.expect("connect");
    let types = domain::event_types();
    let mut rng = Rng(7);
    let append = async |stream: &str, rng: &mut Rng| {
        let (events, _) = campaign(&types, 0, rng);
        journal
            .append(
                &[AppendRequest::new(
                    StreamId::new(stream).unwrap(),
                    ExpectedVersion::Any,
                    events,
                )],
                AppendOptions::enqueue(),
            )
            .await
            .expect("append")
    };
    let mut workers = vec![spawn_worker(&url, &schema, "wait-w1", true)];
    let a = append("w-ok", &mut rng).await;
    let last = a[0].last_seq.to_string();
    let out = demo_ok(
        &url,
        &schema,
        &[
            "wait",
            "--stream",
            "w-ok",
            "--seq",
            &last,
            "--timeout-ms",
            "60000",
        ],
    );
    assert!(out.contains("is applied by every projection"), "{out}");

    // The tally dead on a stream (as a pass without the fix leaves it).
    let b = append("w-bad", &mut rng).await;
    let bad = StreamId::new("w-bad").unwrap();
    let key = projection_consumer(&ProjectionName::new("character_tally").unwrap()).unwrap();
    let part = outbox_core::PartitionStore::partitioning(&journal).of(&bad);
    stop(&mut workers);
    journal.hold_sink(&key, &bad, part, 0).await.unwrap();
    let threshold_one = outbox_core::RetryPolicy::default()
        .with_dead_letter_after(1)
        .unwrap();
    journal
        .fail_sink(
            &key,
            &bad,
            part,
            outbox_core::Seq::FIRST,
            "cursed",
            &threshold_one,
        )
        .await
        .unwrap();
    let last = b[0].last_seq.to_string();
    let out = demo(&url, &schema, &["wait", "--stream", "w-bad", "--seq", &last])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("projection character_tally is dead on w-bad/1"),
        "{err}"
    );

    // Paused, with no worker running: it cannot get there.
    demo_ok(&url, &schema, &["consumers", "pause", "--consumer", "roster"]);
    let c = append("w-late", &mut rng).await;
    let last = c[0].last_seq.to_string();
    let out = demo(
        &url,
        &schema,
        &[
            "wait",
            "--stream",
            "w-late",
            "--seq",
            &last,
            "--projection",
            "roster",
        ],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("projection roster is paused"), "{err}");
    let out = demo(
        &url,
        &schema,
        &[
            "wait",
            "--stream",
            "w-late",
            "--seq",
            &last,
            "--projection",
            "campaign_summary",
            "--timeout-ms",
            "200",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    demo_ok(&url, &schema, &["consumers", "resume", "--consumer", "roster"]);
    let mut workers = vec![spawn_worker(&url, &schema, "wait-w2", true)];
    demo_ok(
        &url,
        &schema,
        &[
            "wait",
            "--stream",
            "w-late",
            "--seq",
            &last,
            "--projection",
            "roster",
            "--timeout-ms",
            "60000",
        ],
    );
    stop(&mut workers);
    journal.close().await;
}
