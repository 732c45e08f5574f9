//! What the outbox side of every workload shares: the temp directory, the
//! runtime over two SQLite files, the measured projection and the oracle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result, bail, ensure};
use outbox_core::{
    AppendRequest, BoxError, Event, EventTypeRegistry, ExpectedVersion, NewEvent, ProjectionName, StreamId,
    ViewProjection, ViewTx, async_trait,
};
use outbox_runtime::{Config, JournalBackend, Outbox, OutboxBuilder, ProjectionBackend};
use outbox_sqlite::{SqliteJournal, SqliteOptions, SqliteProjectionStore};
use serde::{Deserialize, Serialize};

/// Payload size of every event, on both sides.
pub(crate) const PAYLOAD_BYTES: usize = 200;
/// The one event type.
pub(crate) const EVENT_TYPE: &str = "bench_event";
/// The measured projection's name and view table.
pub(crate) const PROJECTION: &str = "bench";
pub(crate) const TABLE: &str = "rows";

pub(crate) type Rt = Outbox<SqliteJournal, SqliteProjectionStore>;

/// A directory for the SQLite files on a real disk: the system temp dir
/// unless it is a tmpfs, else `target/bench/tmp`.
pub(crate) fn bench_tmp_root() -> Result<PathBuf> {
    let sys = std::env::temp_dir().canonicalize()?;
    if fs_type(&sys).as_deref() != Some("tmpfs") {
        return Ok(sys);
    }
    let dir = PathBuf::from("target/bench/tmp");
    std::fs::create_dir_all(&dir)?;
    Ok(dir.canonicalize()?)
}

/// The file system type of the mount holding `path` (longest mount prefix).
fn fs_type(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, ty) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(at).then(|| (at.len(), ty.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, ty)| ty)
}

pub(crate) fn tempdir(ctx_tmp: &Path) -> Result<tempfile::TempDir> {
    Ok(tempfile::Builder::new()
        .prefix("outbox-bench-")
        .tempdir_in(ctx_tmp)?)
}

pub(crate) fn payload(i: u64) -> Vec<u8> {
    let mut p = vec![b'x'; PAYLOAD_BYTES];
    let tag = i.to_le_bytes();
    p[..8].copy_from_slice(&tag);
    p
}

pub(crate) fn stream_name(prefix: &str, i: u64) -> String {
    format!("{prefix}-{i:06}")
}

pub(crate) fn stream(prefix: &str, i: u64) -> Result<StreamId> {
    Ok(StreamId::new(stream_name(prefix, i))?)
}

/// What the projection saw, shared with the workload. The applier records
/// into it inside the measured apply transaction, so recording allocates
/// only a stream's first time and when a stream's list doubles (a `String`
/// key per event into a map of every event cost the outbox's side about 2%
/// of the process's samples at half load).
#[derive(Default)]
pub(crate) struct Seen {
    /// Events applied, all streams.
    pub(crate) applied: AtomicU64,
    /// Applies per stream (a duplicate would show as a count above the version).
    pub(crate) per_stream: Mutex<HashMap<String, u64>>,
    /// When each event of a stream was applied, by seq (wall clock,
    /// comparable across processes), when recording is on.
    at: Option<Mutex<AppliedAt>>,
}

/// When each applied event of a stream was applied: (seq, wall time) by stream.
type AppliedAt = HashMap<String, Vec<(u64, SystemTime)>>;

impl Seen {
    /// Recording when each event is applied.
    pub(crate) fn recording() -> Seen {
        Seen {
            at: Some(Mutex::default()),
            ..Seen::default()
        }
    }

    /// Counts an apply of `e` and, when recording, the time it was applied.
    pub(crate) fn saw(&self, e: &Event) -> Result<(), BoxError> {
        self.applied.fetch_add(1, Ordering::Relaxed);
        count(
            &mut *self.per_stream.lock().map_err(|_| "poisoned")?,
            e.stream.as_str(),
        );
        if let Some(at) = &self.at {
            let entry = (e.seq.get(), SystemTime::now());
            let mut at = at.lock().map_err(|_| "poisoned")?;
            match at.get_mut(e.stream.as_str()) {
                Some(v) => v.push(entry),
                None => {
                    at.insert(e.stream.to_string(), vec![entry]);
                }
            }
        }
        Ok(())
    }

    /// When each event was applied, by (stream, seq); only a recording
    /// `Seen` keeps them. Built on each call, after the run.
    pub(crate) fn applied_at(&self) -> Result<HashMap<(String, u64), SystemTime>> {
        let at = self
            .at
            .as_ref()
            .context("not recording")?
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        Ok(at
            .iter()
            .flat_map(|(s, v)| v.iter().map(move |(seq, t)| ((s.clone(), *seq), *t)))
            .collect())
    }
}

/// Counts one more for `key`, allocating the key only the first time.
fn count(counts: &mut HashMap<String, u64>, key: &str) {
    match counts.get_mut(key) {
        Some(c) => *c += 1,
        None => {
            counts.insert(key.to_owned(), 1);
        }
    }
}

/// The document the projection upserts per event, keyed by stream.
#[derive(Serialize, Deserialize)]
pub(crate) struct Doc {
    pub(crate) seq: u64,
    pub(crate) bytes: usize,
}

/// The measured projection: the backend-neutral path users write, one
/// `put` per event.
pub(crate) struct BenchView {
    name: ProjectionName,
    seen: Arc<Seen>,
}

#[async_trait]
impl ViewProjection for BenchView {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event) -> Result<(), BoxError> {
        let doc = Doc {
            seq: e.seq.get(),
            bytes: e.payload.len(),
        };
        view.put(TABLE, e.stream.as_str(), &doc).await?;
        // Counted after the write; a rolled-back transaction would be retried
        // and counted twice, which the oracle reports.
        self.seen.saw(e)
    }
}

pub(crate) fn sqlite_options() -> SqliteOptions {
    SqliteOptions::default() // synchronous=FULL, WAL
}

/// A runtime over `dir/journal.db` and `dir/projections.db` with the bench
/// projection registered.
pub(crate) async fn open(dir: &Path, config: Config, seen: Arc<Seen>) -> Result<Rt> {
    open_with(dir, config, seen, false).await
}

/// [`open`], with the journal's cross-process wake source when `woken`.
pub(crate) async fn open_with(dir: &Path, config: Config, seen: Arc<Seen>, woken: bool) -> Result<Rt> {
    open_partitioned(dir, config, seen, woken, None).await
}

/// [`open_with`], the journal divided into `partitions` (its stored count, or
/// the default, when `None`).
pub(crate) async fn open_partitioned(
    dir: &Path,
    config: Config,
    seen: Arc<Seen>,
    woken: bool,
    partitions: Option<u16>,
) -> Result<Rt> {
    let mut journal_options = sqlite_options();
    journal_options.partitions.count = partitions;
    let journal = SqliteJournal::open(dir.join("journal.db"), journal_options)
        .await
        .context("opening the journal")?;
    let store = SqliteProjectionStore::open(dir.join("projections.db"), sqlite_options())
        .await
        .context("opening the projection store")?;
    let wake = woken.then(|| journal.wake_source());
    let mut builder = builder(journal, store, seen)?;
    if let Some(w) = wake {
        builder = builder.wake_source(w);
    }
    Ok(builder.config(config).build().await?)
}

/// A runtime builder over any backend with the bench's event type and
/// projection registered.
pub(crate) fn builder<J: JournalBackend, P: ProjectionBackend>(
    journal: J,
    store: P,
    seen: Arc<Seen>,
) -> Result<OutboxBuilder<J, P>> {
    let mut types = EventTypeRegistry::new();
    types.apply(EVENT_TYPE)?;
    Ok(Outbox::builder(journal, store)
        .event_types(types)
        .view(BenchView {
            name: ProjectionName::new(PROJECTION)?,
            seen,
        }))
}

/// The apply worker at `batch` rows, no start-up repair (the backlog is
/// the worker's to drain), a short idle poll.
pub(crate) fn worker_config(batch: usize) -> Config {
    Config::apply_worker()
        .with_batch_size(batch)
        .with_repair_on_start(false)
        .with_poll_interval(Duration::from_millis(10))
}

pub(crate) fn new_event<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    i: u64,
) -> Result<NewEvent> {
    Ok(rt.event(EVENT_TYPE, payload(i))?)
}

/// Appends `per_stream` events to each of `streams` streams, `per_call`
/// events per `append_batch` (requests of one event to distinct streams,
/// or of many events to one stream when `per_call` exceeds the streams).
/// Returns the versions.
pub(crate) async fn prefill<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    prefix: &str,
    streams: u64,
    per_stream: u64,
    per_call: u64,
) -> Result<Vec<u64>> {
    let mut versions = vec![0u64; streams as usize];
    let mut i = 0u64;
    if per_call <= streams {
        for _round in 0..per_stream {
            for chunk_start in (0..streams).step_by(per_call as usize) {
                let end = (chunk_start + per_call).min(streams);
                let mut batch = Vec::with_capacity((end - chunk_start) as usize);
                for s in chunk_start..end {
                    batch.push(AppendRequest::new(
                        stream(prefix, s)?,
                        ExpectedVersion::Exact(versions[s as usize]),
                        vec![new_event(rt, i)?],
                    ));
                    versions[s as usize] += 1;
                    i += 1;
                }
                rt.append_batch(batch).await?;
            }
        }
    } else {
        for s in 0..streams {
            let mut left = per_stream;
            while left > 0 {
                let n = left.min(per_call);
                let events = (0..n).map(|k| new_event(rt, i + k)).collect::<Result<Vec<_>>>()?;
                i += n;
                rt.append(
                    &stream(prefix, s)?,
                    ExpectedVersion::Exact(versions[s as usize]),
                    events,
                )
                .await?;
                versions[s as usize] += n;
                left -= n;
            }
        }
    }
    Ok(versions)
}

/// Waits until `seen` has applied `total` events and the outbox is empty.
pub(crate) async fn wait_drained<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    seen: &Seen,
    total: u64,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if seen.applied.load(Ordering::Relaxed) >= total {
            let s = rt.journal().summary().await?;
            if s.pending + s.processing + s.failed + s.dead == 0 {
                return Ok(());
            }
            ensure!(s.failed + s.dead == 0, "rows failed while draining: {s:?}");
        }
        if Instant::now() > deadline {
            let s = rt.journal().summary().await?;
            bail!(
                "not drained after {timeout:?}: applied {} of {total}, outbox {s:?}",
                seen.applied.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The oracle: every stream's document is at its version and every stream
/// was applied exactly version times.
pub(crate) async fn verify<J: JournalBackend, P: ProjectionBackend>(
    rt: &Outbox<J, P>,
    seen: &Seen,
    prefix: &str,
    versions: &[u64],
) -> Result<()> {
    let views = rt.views(PROJECTION)?;
    let mut docs: HashMap<String, u64> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page: Vec<(String, Doc)> = views.scan(TABLE, after.as_deref(), 1000).await?;
        let Some(last) = page.last().map(|(k, _)| k.clone()) else {
            break;
        };
        for (k, d) in page {
            docs.insert(k, d.seq);
        }
        after = Some(last);
    }
    check_rows(seen, prefix, versions, &docs)
}

/// The oracle's check over a projection's state: `at` maps each stream to
/// the seq its row (or document) is at. Every stream of `prefix` must be
/// at its version and have been applied exactly version times.
pub(crate) fn check_rows(
    seen: &Seen,
    prefix: &str,
    versions: &[u64],
    at: &HashMap<String, u64>,
) -> Result<()> {
    let per_stream = seen
        .per_stream
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    for (i, &version) in versions.iter().enumerate() {
        let name = stream_name(prefix, i as u64);
        let row = at.get(&name).copied().unwrap_or(0);
        let n = per_stream.get(&name).copied().unwrap_or(0);
        ensure!(
            row == version && n == version,
            "ORACLE FAILED: stream {name}: appended {version}, projection state at seq {row}, applied {n} times"
        );
    }
    Ok(())
}

/// VmHWM and VmRSS of this process, in KiB.
pub(crate) fn vm_kib() -> Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("{name} not in /proc/self/status"))?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .context("malformed /proc/self/status")?
            .parse()?)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}
