//! `outbox serve`: the operator's web monitor and Prometheus `/metrics`, and
//! the `/metrics` endpoint of `outbox work --metrics-addr`.
//!
//! Pages are rendered on the server as plain HTML (no script); every value
//! is escaped. Actions (requeue, requeue dead, retry, cancel a run) are POST
//! forms that need the operator token (`OUTBOX_SERVE_TOKEN`), typed into the
//! form or sent as `Authorization: Bearer ...`; the token is never stored in
//! a cookie, so the browser never sends it on its own, and cross-origin
//! posts are refused (ADR 0017). Without a token the monitor is read-only.

mod chart;
mod door;
#[cfg(all(test, feature = "sqlite"))]
mod door_tests;
mod figures;
#[cfg(all(test, feature = "sqlite"))]
mod figures_tests;
mod fleet;
mod html;
mod kit;
mod rows;
#[cfg(all(test, feature = "sqlite"))]
mod test_monitor;

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;
use axum::Router;
use axum::extract::rejection::FormRejection;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Form, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use outbox_core::{Error, Seq, SinkStatus, SinkSummary};
use outbox_runtime::consumers::{
    ConsumerStatus, ExceptionCounts, ProjectionException, consumer_statuses_with, projection_exceptions_of,
};
use outbox_runtime::{Gauges, JournalBackend, MetricsSnapshot, Outbox};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use self::door::{Door, DoorConfig};
use self::html::{action_form, esc, page, table};
pub(crate) use self::kit::BODY_LIMIT;
use self::kit::{
    ActionForm, Monitor, Refusal, St, authorize, bad_input, checked, fail, field, finish, html, num, number,
    only_sinks, refusal, refuse, sinks_section, text,
};
use crate::backend::{CliJournal, CliStore};
use crate::blocked::blocked_streams_at;
use crate::cli::{HttpArgs, ServeArgs};
use crate::commands::ctx::Ctx;
use crate::metrics::{CONTENT_TYPE, Scrape, render};
use crate::output::human_ms;
use crate::report::digests;

/// The minutes the overview's throughput chart covers.
const CHART_MINUTES: u32 = 60;
/// Checks the front door's configuration (tokens, bind, hosts) before
/// anything is opened: a refused bind or a weak token stops the command.
pub(crate) fn door(addr: SocketAddr, http: &HttpArgs, what: &str) -> Result<Arc<Door>, Error> {
    Door::new(&DoorConfig {
        bound: addr,
        allowed_hosts: Some(http.allowed_hosts.as_str()),
        max_connections: usize::try_from(http.max_connections).unwrap_or(usize::MAX),
        head_timeout: std::time::Duration::from_millis(http.head_timeout_ms),
        request_timeout: std::time::Duration::from_millis(http.request_timeout_ms),
        busy_pages: usize::try_from(http.max_busy_pages).unwrap_or(usize::MAX),
        body_limit: BODY_LIMIT,
        what,
    })
    .map(Arc::new)
}

/// The rows by status a page shows: counted now, or, once the last figures
/// counted more than `--exact-rows` rows, that computation's counts (a
/// count walks every row: at millions a page would cost a scan), with
/// `true`: the page says they are the figures' and when they were made.
async fn page_summary<J: JournalBackend, P: CliStore>(
    m: &Monitor<J, P>,
) -> Result<(outbox_core::OutboxSummary, bool), Error> {
    if let Some(c) = m.figures.read().computed.as_deref()
        && c.summary.total() > m.exact_rows
    {
        return Ok((c.summary.clone(), true));
    }
    Ok((m.journal.summary().await?, false))
}

/// The note of a page whose counts are the figures' ([`page_summary`]).
fn stored_counts_note<J, P: CliStore>(m: &Monitor<J, P>, s: &outbox_core::OutboxSummary) -> String {
    format!(
        "<p class=\"note\" id=\"counts-stored\">{} rows in the outbox, over --exact-rows {}: these counts and \
         lags are the last figures computation's, as of {} (every {}), not counted per page.</p>",
        s.total(),
        m.exact_rows,
        esc(&s.as_of.to_string()),
        esc(&human_ms(m.figures_interval.as_millis() as u64)),
    )
}

/// `outbox serve`: runs until SIGTERM or Ctrl-C.
pub(crate) async fn serve<J: CliJournal, P: CliStore>(ctx: &Ctx<'_, J, P>, a: &ServeArgs) -> Result<()> {
    let mut door = door(a.addr, &a.http, "the monitor")?;
    if let Some(d) = Arc::get_mut(&mut door) {
        d.store_read_only = ctx.read_only;
    }
    let monitor = Arc::new(Monitor {
        app: ctx.app.name().to_owned(),
        journal: ctx.journal.clone(),
        store: ctx.store.clone(),
        projections: crate::commands::ctx::projections::<P>(ctx.app),
        door: door.clone(),
        limit: a.limit as usize,
        lag_streams: a.lag_streams as usize,
        lag_threshold_ms: a.lag_threshold_ms,
        figures: Arc::default(),
        figures_interval: std::time::Duration::from_millis(a.figures_interval_ms),
        exact_rows: a.exact_rows,
        snapshot_of: ctx
            .journal
            .wal_file()
            .filter(|wal| ctx.read_only && !wal.exists()),
    });
    let read_only = !monitor.door.acts();
    // The first figures before the first request (bounded by
    // --lag-streams); a failure is shown on the pages until the task's
    // next computation succeeds.
    if let Err(e) = monitor
        .figures
        .compute(
            &monitor.journal,
            &monitor.store,
            &monitor.projections,
            monitor.lag_streams,
        )
        .await
    {
        tracing::warn!("computing the monitor's figures failed: {e}");
    }
    let cancel = outbox_runtime::cancel_on_shutdown_signal();
    let keeper = tokio::spawn(figures::keep(
        monitor.figures.clone(),
        monitor.journal.clone(),
        monitor.store.clone(),
        monitor.projections.clone(),
        monitor.lag_streams,
        monitor.figures_interval,
        cancel.clone(),
    ));
    let router = monitor_router(monitor);
    let listener = bind(a.addr).await?;
    let local = listener.local_addr()?;
    outln!(
        "serving the {} monitor on http://{local}/ ({})",
        ctx.app.name(),
        if ctx.read_only {
            "read-only: the journal is open read-only"
        } else if read_only {
            "read-only: OUTBOX_SERVE_TOKEN is not set"
        } else {
            "actions need OUTBOX_SERVE_TOKEN"
        }
    )?;
    let served = run_server(listener, router, door, cancel.clone()).await;
    cancel.cancel();
    let _ = keeper.await;
    served
}

/// The monitor's pages and actions (behind the front door once served).
fn monitor_router<J: CliJournal, P: CliStore>(monitor: Arc<Monitor<J, P>>) -> Router {
    Router::new()
        .route("/", get(overview::<J, P>))
        .route("/blocked", get(blocked::<J, P>))
        .route("/runs", get(runs::<J, P>))
        .route("/row", get(rows::row_page::<J, P>))
        .route("/stream", get(rows::stream_page::<J, P>))
        .route("/audit", get(audit::<J, P>))
        .route("/dead", get(rows::dead_page::<J, P>))
        .route("/partitions", get(fleet::partitions_page::<J, P>))
        .route("/sinks", get(fleet::sinks_page::<J, P>))
        .route("/metrics", get(metrics::<J, P>))
        .route("/style.css", get(style))
        .route("/actions/requeue", post(requeue::<J, P>))
        .route("/actions/requeue-dead", post(requeue_dead::<J, P>))
        .route("/actions/retry", post(retry::<J, P>))
        .route("/actions/cancel-run", post(cancel_run::<J, P>))
        .route("/actions/requeue-group", post(rows::requeue_group::<J, P>))
        .route("/actions/requeue-sink", post(fleet::requeue_sink::<J, P>))
        .route("/actions/pause-consumer", post(fleet::pause_consumer::<J, P>))
        .route("/actions/resume-consumer", post(fleet::resume_consumer::<J, P>))
        .fallback(not_found)
        .with_state(monitor.clone())
        .layer(middleware::from_fn_with_state(
            Arc::<str>::from(monitor.app.as_str()),
            name_the_binary,
        ))
}

/// The monitor's one-line error answers with their command hints naming
/// the application's binary (`output::named_for`): a port error names the
/// stock `outbox`, and the monitor of an application's own binary would
/// tell its operator to run a command that is not installed.
async fn name_the_binary(State(bin): State<Arc<str>>, req: Request, next: Next) -> Response {
    let res = next.run(req).await;
    let plain = res
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/plain"));
    let error = res.status().is_client_error() || res.status().is_server_error();
    if &*bin == "outbox" || !plain || !error {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    // One line, never more than a page of text: a larger body is not ours.
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return text(parts.status, "error answer too large to show");
    };
    let named = crate::output::named_for(&String::from_utf8_lossy(&bytes), &bin);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(named))
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {addr}: {e}")).into())
}

/// Serves `router` behind the front door (`door.rs`), with the security
/// headers and the body limit, until `cancel`; then lets the requests in
/// flight finish (each is bounded by [`Door::connection_deadline`]).
async fn run_server(
    listener: tokio::net::TcpListener,
    router: Router,
    door: Arc<Door>,
    cancel: CancellationToken,
) -> Result<()> {
    let app = router
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(door.clone(), door::front_door))
        .layer(middleware::from_fn(security_headers));
    let slots = Arc::new(tokio::sync::Semaphore::new(door.max_connections));
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: wait a moment
                    // instead of spinning.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            // Every slot taken: the oldest connection still sending its
            // request makes room (its task ends at once and gives its slot
            // back), so idle or trickling sockets cannot keep this one out.
            Err(_) if door.shed_oldest(peer) => {
                let freed = tokio::select! {
                    () = cancel.cancelled() => break,
                    slot = slots.clone().acquire_owned() => slot,
                };
                match freed {
                    Ok(slot) => slot,
                    Err(_) => break,
                }
            }
            // Every open connection has its request in: this one waits
            // for none of them.
            Err(_) => {
                door.note_full(peer);
                drop(stream);
                continue;
            }
        };
        // In accept order, before the task runs: "oldest" is by accept.
        let place = door.wait_for_request(peer);
        let closed = place.closed.clone();
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let cancel = cancel.clone();
        let door = door.clone();
        tracker.spawn(async move {
            let _slot = slot;
            tokio::select! {
                biased;
                // Closed for a newer connection while its request was not
                // in yet (the place is left once it is: then never).
                () = closed.cancelled() => {}
                () = serve_connection(&door, stream, peer, place, service, &cancel) => {}
            }
        });
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

/// One connection: its head read by the door, then served by hyper within
/// [`Door::connection_deadline`].
async fn serve_connection(
    door: &door::Door,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    place: door::WaitingPlace,
    service: hyper_util::service::TowerToHyperService<Router>,
    cancel: &CancellationToken,
) {
    let Some(stream) = door::read_head(door, stream, peer, place).await else {
        return;
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(door.head_timeout)
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let mut conn = std::pin::pin!(conn);
    let deadline = door.connection_deadline();
    let served = tokio::time::timeout(deadline, async {
        tokio::select! {
            _ = conn.as_mut() => {}
            () = cancel.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
            }
        }
    })
    .await;
    if served.is_err() {
        tracing::warn!(target: "outbox::audit", %peer, "connection closed after {deadline:?}");
    }
}

/// The `/metrics` endpoint of `outbox work --metrics-addr`: this worker's
/// counters and the queue gauges read at each scrape. Returns the bound
/// address and the server future (it ends when `cancel` fires).
pub(crate) async fn worker_metrics<J: CliJournal, P: CliStore>(
    rt: Outbox<J, P>,
    journal: J,
    addr: SocketAddr,
    http: &HttpArgs,
    cancel: CancellationToken,
) -> Result<(SocketAddr, impl Future<Output = Result<()>>)> {
    let door = door(addr, http, "metrics")?;
    let listener = bind(addr).await?;
    let local = listener.local_addr()?;
    let state = Arc::new((rt, journal));
    let router = Router::new()
        .route(
            "/metrics",
            get(async |State(s): State<Arc<(Outbox<J, P>, J)>>| {
                let snapshot: MetricsSnapshot = s.0.metrics();
                match s.1.summary().await {
                    Ok(summary) => {
                        let g = Gauges::from_summary(&summary);
                        metrics_response(&Scrape {
                            gauges: Some(&g),
                            worker: Some(&snapshot),
                            ..Scrape::default()
                        })
                    }
                    Err(e) => fail(&e),
                }
            }),
        )
        .fallback(not_found)
        .with_state(state);
    Ok((local, run_server(listener, router, door, cancel)))
}

/// The security headers of every answer. The referrer policy is
/// `same-origin`, not `no-referrer`: with `no-referrer` browsers send
/// `Origin: null` on the monitor's own form posts, which the cross-origin
/// check must refuse.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    for (k, v) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    res
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "no such page")
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], html::STYLE).into_response()
}

fn metrics_response(s: &Scrape<'_>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], render(s)).into_response()
}

// ---------------------------------------------------------------------------
// pages
// ---------------------------------------------------------------------------

/// `?refresh=N`: the overview reloads itself every N seconds (a meta
/// refresh, no script); off by default, so a token being typed into a form
/// is never wiped.
#[derive(Deserialize)]
struct RefreshQuery {
    refresh: Option<u32>,
}

async fn overview<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    q: Result<Query<RefreshQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let refresh = q
        .ok()
        .and_then(|Query(q)| q.refresh)
        .filter(|n| (5..=3600).contains(n));
    match overview_body(&m, refresh).await {
        Ok(body) => {
            let mut out = page(&m.app, "Overview", &body);
            if let Some(n) = refresh {
                out = out.replacen(
                    "<head>",
                    &format!("<head><meta http-equiv=\"refresh\" content=\"{n}\">"),
                    1,
                );
            }
            html(StatusCode::OK, out)
        }
        Err(e) => fail(&e),
    }
}

/// The overview's health banner: what is wrong first, or that all is well.
fn health_banner(
    g: &Gauges,
    workers: usize,
    lag_threshold_ms: u64,
    held_back: u64,
    exceptions: ExceptionCounts,
    consumers: &[ConsumerStatus],
    stale_snapshot: bool,
) -> String {
    let mut bad = Vec::new();
    let mut warn = Vec::new();
    let orphan_consumers = consumers.iter().filter(|c| !c.live).count();
    if orphan_consumers > 0 {
        warn.push(format!(
            "{orphan_consumers} registered consumer(s) with no live worker (<a href=\"/#consumers\">consumers</a>)"
        ));
    }
    // Amber, not red: a pause is an operator's decision (or an applier's
    // `stop`), but its consumer falls behind until resumed, and the worker
    // lag does not show it (a paused consumer's work is never due).
    let paused: Vec<String> = consumers
        .iter()
        .filter(|c| c.info.paused)
        .map(|c| esc(c.projection.as_deref().unwrap_or(c.info.key.as_str())))
        .collect();
    if !paused.is_empty() {
        warn.push(format!(
            "{} consumer(s) paused, falling behind until resumed: {} (<a href=\"/#consumers\">consumers</a>)",
            paused.len(),
            paused.join(", ")
        ));
    }
    if stale_snapshot {
        warn.push(
            "a process has opened the journal since this monitor read it as a read-only snapshot: these pages \
             do not show its writes (restart the monitor)"
                .to_owned(),
        );
    }
    if workers == 0 {
        bad.push("no live worker is registered: nothing is being applied".to_owned());
    }
    if g.dead > 0 {
        bad.push(format!(
            "{} dead row(s) block their streams (<a href=\"/blocked\">blocked streams</a>)",
            g.dead
        ));
    }
    if g.worker_lag_ms > lag_threshold_ms {
        bad.push(format!(
            "the workers are {} behind (over {})",
            esc(&human_ms(g.worker_lag_ms)),
            esc(&human_ms(lag_threshold_ms))
        ));
    }
    if exceptions.dead > 0 {
        bad.push(format!(
            "{} projection(s) dead on a stream each holds back (<a href=\"/#projection-exceptions\">projection \
             exceptions</a>)",
            exceptions.dead
        ));
    }
    if g.failed > 0 {
        warn.push(format!("{} stream(s) failing and retrying", g.failed));
    }
    if exceptions.failed > 0 {
        warn.push(format!(
            "{} projection(s) failing or behind on a stream, the others going on",
            exceptions.failed
        ));
    }
    if held_back > 0 {
        warn.push(format!(
            "{held_back} committed event(s) held back from the sinks by an open transaction"
        ));
    }
    let (class, text) = if !bad.is_empty() {
        ("bad", [bad, warn].concat().join("; "))
    } else if !warn.is_empty() {
        ("warn", warn.join("; "))
    } else {
        (
            "ok",
            format!(
                "Healthy: {workers} live worker(s), worker lag {}, nothing blocked",
                esc(&human_ms(g.worker_lag_ms))
            ),
        )
    };
    format!("<p id=\"health\" class=\"banner {class}\">{text}</p>")
}

async fn overview_body<J: JournalBackend, P: CliStore>(
    m: &Monitor<J, P>,
    refresh: Option<u32>,
) -> Result<String, Error> {
    let (summary, stored) = page_summary(m).await?;
    let g = Gauges::from_summary(&summary);
    // Each read once: the consumer summaries give the sinks and the
    // projections' exceptions, the live workers the consumers' liveness.
    let workers = m.journal.workers().await?;
    let consumer_summaries = m.journal.sinks().await?;
    let (exceptions, listed) =
        projection_exceptions_of(&m.journal, &consumer_summaries, None, m.limit).await?;
    let sinks = only_sinks(consumer_summaries);
    let held_back = SinkSummary::held_back_of(&sinks);
    let consumers = consumer_statuses_with(&m.journal, &workers).await?;
    let mut b = health_banner(
        &g,
        workers.len(),
        m.lag_threshold_ms,
        held_back,
        exceptions,
        &consumers,
        m.snapshot_of.as_deref().is_some_and(std::path::Path::exists),
    );
    if stored {
        b.push_str(&stored_counts_note(m, &summary));
    }
    let _ = write!(
        b,
        "<p class=\"note\">as of {} (the database's clock); {}</p>",
        esc(&summary.as_of.to_string()),
        match refresh {
            Some(n) => format!("refreshing every {n} s (<a href=\"/\">stop</a>)"),
            None => "<a href=\"/?refresh=10\">refresh every 10 s</a>".to_owned(),
        }
    );
    b.push_str("<h2>Rows by status</h2>");
    b.push_str(&table(
        "rows",
        &[
            "pending",
            "processing",
            "failed",
            "dead",
            "total",
            "worker lag",
            "blocked streams",
            "oldest due age",
        ],
        &[vec![
            format!("<span id=\"count-pending\">{}</span>", summary.pending),
            format!("<span id=\"count-processing\">{}</span>", summary.processing),
            format!(
                "<span id=\"count-failed\" class=\"failed\">{}</span>",
                summary.failed
            ),
            format!("<span id=\"count-dead\" class=\"dead\">{}</span>", summary.dead),
            format!("<span id=\"count-total\">{}</span>", summary.total()),
            format!(
                "<span id=\"worker-lag\" data-ms=\"{}\">{}</span>",
                g.worker_lag_ms,
                esc(&human_ms(g.worker_lag_ms))
            ),
            format!("<span id=\"blocked-streams\">{}</span>", g.failed + g.dead),
            format!(
                "<span id=\"oldest-due-age\" data-ms=\"{}\">{}</span>",
                g.oldest_due_age_ms,
                esc(&human_ms(g.oldest_due_age_ms))
            ),
        ]],
    ));
    b.push_str(
        "<p class=\"note\">Worker lag: how long the oldest work a worker may take now has waited. \
         Blocked streams: those whose head row failed (retrying) or is dead; what waits behind them \
         counts in the oldest due age, not in the worker lag.</p>",
    );
    b.push_str(&exceptions_section(m, exceptions, &listed));
    b.push_str(&consumers_section(m, &consumers));
    let skipped = m.store.skipped(None, SKIPPED_SHOWN).await?;
    b.push_str(&skipped_section(&skipped, &m.app));
    b.push_str("<h2>Throughput, last 60 minutes</h2>");
    match m.journal.activity(CHART_MINUTES).await {
        Ok(activity) => b.push_str(&chart::throughput(&activity.filled(CHART_MINUTES as usize))),
        // An optional capability (ADR 0035): the chart is left out.
        Err(outbox_core::Error::Unsupported(why)) => {
            let _ = write!(b, "<p class=\"note\">{}</p>", html::esc(&why));
        }
        Err(e) => return Err(e),
    }
    b.push_str(
        "<p class=\"note\">Rows completed (their events applied), failures recorded and rows \
         dead-lettered per minute, by every worker (each adds its counts at its heartbeat).</p>",
    );
    if summary.dead > 0 {
        let _ = write!(
            b,
            "<p>{} dead row(s) block their streams: see <a href=\"/blocked\">blocked streams</a>, \
             or the <a href=\"/dead\">dead rows by error</a>.</p>",
            summary.dead
        );
        if m.door.acts() {
            b.push_str(&action_form(
                "/actions/requeue-dead",
                &[("limit", summary.dead.min(10_000).to_string())],
                "Requeue every dead row",
            ));
        }
    }
    if m.door.store_read_only {
        b.push_str(
            "<p class=\"note\" id=\"read-only\">Read-only: the journal is open read-only (?mode=ro, or files \
             this user cannot write); actions need write access.</p>",
        );
    } else if !m.door.acts() {
        b.push_str(
            "<p class=\"note\" id=\"read-only\">Read-only: set OUTBOX_SERVE_TOKEN to enable actions.</p>",
        );
    }
    b.push_str(&lag_section(m, &m.figures.read(), summary.as_of));
    b.push_str(&sinks_section(&sinks));
    b.push_str("<h2>Workers</h2>");
    if workers.is_empty() {
        b.push_str("<p>No live worker registered.</p>");
    } else {
        let rows: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                let ttl = w.expires_at.duration_since(summary.as_of).as_millis() as u64;
                vec![
                    esc(w.id.as_str()),
                    esc(&w.mode.to_string()),
                    esc(&w.host),
                    num(w.pid),
                    esc(&w.started_at.to_string()),
                    esc(&w.last_beat.to_string()),
                    esc(&format!("{} (in {})", w.expires_at, human_ms(ttl))),
                ]
            })
            .collect();
        b.push_str(&table(
            "workers",
            &[
                "id",
                "mode",
                "host",
                "pid",
                "started",
                "last heartbeat",
                "expires",
            ],
            &rows,
        ));
    }
    b.push_str("<h2>Stream leases</h2>");
    let leases = m.journal.leases(None, m.limit).await?;
    if leases.is_empty() {
        b.push_str("<p>No stream lease held.</p>");
    } else {
        let rows: Vec<Vec<String>> = leases
            .iter()
            .map(|e| {
                vec![
                    esc(e.lease.stream.as_str()),
                    esc(e.lease.owner.as_str()),
                    num(e.lease.epoch),
                    esc(&e.lease.expires_at.to_string()),
                    if e.expired {
                        "expired".into()
                    } else {
                        "held".into()
                    },
                ]
            })
            .collect();
        b.push_str(&table(
            "leases",
            &["stream", "owner", "epoch", "expires", "state"],
            &rows,
        ));
        if leases.len() == m.limit {
            let _ = write!(b, "<p class=\"note\">First {} leases only.</p>", m.limit);
        }
    }
    Ok(b)
}

/// The projections' checkpoint lag of the last computation of the figures
/// (a background task's, every `--figures-interval-ms`), with when it was
/// made: a page never scans the streams itself.
fn lag_section<J, P: CliStore>(
    m: &Monitor<J, P>,
    f: &figures::Reading,
    now: outbox_core::Timestamp,
) -> String {
    if m.projections.is_empty() || m.lag_streams == 0 {
        return String::new();
    }
    let mut b = String::from("<h2 id=\"projection-lag\">Projection lag</h2>");
    let Some(c) = f.computed.as_deref() else {
        let _ = write!(
            b,
            "<p class=\"note\" id=\"figures-as-of\">computing… (the first computation has not finished{})</p>",
            f.error
                .as_deref()
                .map(|e| format!(": {}", esc(e)))
                .unwrap_or_default()
        );
        return b;
    };
    let Some(lag) = &c.lag else {
        return String::new();
    };
    let scope = if lag.complete {
        format!("all {} stream(s)", lag.streams_scanned)
    } else {
        format!("the first {} stream(s) (--lag-streams)", lag.streams_scanned)
    };
    let _ = write!(
        b,
        "<p class=\"note\" id=\"figures-as-of\" data-as-of-ms=\"{}\">over {}, as of {} ({} before this page; \
         computed in {}, every {})</p>",
        c.as_of.as_millis(),
        esc(&scope),
        esc(&c.as_of.to_string()),
        esc(&human_ms(now.duration_since(c.as_of).as_millis() as u64)),
        esc(&human_ms(c.took.as_millis() as u64)),
        esc(&human_ms(m.figures_interval.as_millis() as u64)),
    );
    if let Some(e) = &f.error {
        let _ = write!(
            b,
            "<p class=\"note failed\" id=\"figures-error\">the last computation failed (these are the figures \
             before it): {}</p>",
            esc(e)
        );
    }
    let rows: Vec<Vec<String>> = lag
        .projections
        .iter()
        .map(|p| vec![esc(&p.projection), num(p.streams_behind), num(p.events_behind)])
        .collect();
    b.push_str(&table(
        "lag",
        &["projection", "streams behind", "events behind"],
        &rows,
    ));
    b
}

/// The consumers the journal knows, with whether a live worker runs each.
fn consumers_section<J: JournalBackend, P: CliStore>(
    m: &Monitor<J, P>,
    consumers: &[ConsumerStatus],
) -> String {
    let mut b = String::from("<h2 id=\"consumers\">Consumers</h2>");
    if consumers.is_empty() {
        b.push_str("<p>No consumer registered yet: workers register theirs when they start.</p>");
        return b;
    }
    let rows: Vec<Vec<String>> = consumers
        .iter()
        .map(|c| {
            vec![
                esc(c.projection.as_deref().unwrap_or(c.info.key.as_str())),
                esc(c.info.kind.as_str()),
                esc(&c.info.version),
                esc(&c.info.first_seen.to_string()),
                esc(&c.info.last_seen.to_string()),
                esc(c.info.last_worker.as_str()),
                if c.live {
                    "live".into()
                } else {
                    "<span class=\"failed\">no live worker</span>".into()
                },
                if c.info.paused {
                    "<span class=\"failed\">paused</span>".into()
                } else {
                    "running".into()
                },
                if m.door.acts() {
                    let (path, label) = if c.info.paused {
                        ("/actions/resume-consumer", "Resume")
                    } else {
                        ("/actions/pause-consumer", "Pause")
                    };
                    action_form(path, &[("sink", c.info.key.to_string())], label)
                } else {
                    String::new()
                },
            ]
        })
        .collect();
    b.push_str(&table(
        "consumers",
        &[
            "consumer",
            "kind",
            "version",
            "first seen",
            "last registered",
            "by",
            "worker",
        ],
        &rows,
    ));
    b
}

/// How many skipped events the overview lists.
const SKIPPED_SHOWN: usize = 50;

/// The events projections skipped with a record (ADR 0032), read-only: a
/// re-apply runs the projection's applier, which the application's own
/// binary has (`skipped reapply`).
fn skipped_section(skipped: &[outbox_core::SkippedEvent], bin: &str) -> String {
    let mut b = String::from("<h2 id=\"skipped\">Skipped events</h2>");
    if skipped.is_empty() {
        b.push_str("<p>No event is skipped: every projection applied every event it was given.</p>");
        return b;
    }
    let rows: Vec<Vec<String>> = skipped
        .iter()
        .map(|s| {
            vec![
                esc(s.projection.as_str()),
                esc(s.stream.as_str()),
                s.seq.to_string(),
                esc(&s.skipped_at.to_string()),
                esc(&s.error),
            ]
        })
        .collect();
    b.push_str(&table(
        "skipped",
        &["projection", "stream", "seq", "skipped at", "error"],
        &rows,
    ));
    let _ = write!(
        b,
        "<p class=\"note\">Each event was passed over by its projection only, with this record; \
         after the fix, <code>{} skipped reapply --projection P --stream S --seq N</code> applies it \
         once. The first {SKIPPED_SHOWN} are shown.</p>",
        esc(bin)
    );
    b
}

/// The projections that left the shared path on some stream, with a
/// requeue of each behind the token.
fn exceptions_section<J: JournalBackend, P: CliStore>(
    m: &Monitor<J, P>,
    counts: ExceptionCounts,
    listed: &[ProjectionException],
) -> String {
    let mut b = String::from("<h2 id=\"projection-exceptions\">Projection exceptions</h2>");
    if counts.failed + counts.dead == 0 {
        b.push_str(
            "<p>Every projection is on the shared path: none failing, dead or behind on any stream.</p>",
        );
        return b;
    }
    let _ = write!(
        b,
        "<p><span id=\"exceptions-failed\" class=\"failed\">{}</span> failing or behind, \
         <span id=\"exceptions-dead\" class=\"dead\">{}</span> dead: each holds back only that projection \
         on that stream; the other projections applied it.</p>",
        counts.failed, counts.dead
    );
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|e| {
            let action = if m.door.acts() && e.status == SinkStatus::Dead {
                action_form(
                    "/actions/requeue-sink",
                    &[
                        (
                            "sink",
                            format!("{}{}", outbox_core::PROJECTION_CONSUMER_PREFIX, e.projection),
                        ),
                        ("stream", e.stream.to_string()),
                    ],
                    "Requeue",
                )
            } else {
                String::new()
            };
            vec![
                esc(&e.projection),
                format!(
                    "<a href=\"/stream?stream={}\">{}</a>/{}",
                    esc(&rows::url_encode(e.stream.as_str())),
                    esc(e.stream.as_str()),
                    e.seq
                ),
                format!("<span class=\"{0}\">{0}</span>", esc(&e.status.to_string())),
                num(e.attempt_count),
                esc(&e.next_attempt_at.to_string()),
                esc(e.last_error.as_deref().unwrap_or("")),
                action,
            ]
        })
        .collect();
    b.push_str(&table(
        "exceptions",
        &[
            "projection",
            "waits on",
            "status",
            "attempts",
            "next attempt",
            "last error",
            "action",
        ],
        &rows,
    ));
    b
}

async fn blocked<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let r = async {
        let (summary, stored) = page_summary(&m).await?;
        let r = blocked_streams_at(&m.journal, m.limit, summary.as_of).await?;
        Ok::<_, Error>((r, stored.then(|| stored_counts_note(&m, &summary))))
    };
    let (r, note) = match r.await {
        Ok(r) => r,
        Err(e) => return fail(&e),
    };
    let mut b = note.unwrap_or_default();
    let _ = write!(
        b,
        "<p class=\"note\">as of {}; every stream whose head row is failed or dead, \
         failing since its head row's first failure (a requeue starts it afresh).</p>",
        esc(&r.as_of)
    );
    if r.streams.is_empty() {
        b.push_str("<p id=\"none-blocked\" class=\"ok\">No blocked stream.</p>");
    } else {
        let rows: Vec<Vec<String>> = r
            .streams
            .iter()
            .map(|s| {
                let action = match (m.door.acts(), s.status) {
                    (false, _) => String::new(),
                    (true, outbox_core::OutboxStatus::Dead) => action_form(
                        "/actions/requeue",
                        &[("stream", s.stream.clone()), ("seq", s.seq.to_string())],
                        "Requeue",
                    ),
                    (true, _) => action_form(
                        "/actions/retry",
                        &[("stream", s.stream.clone()), ("seq", s.seq.to_string())],
                        "Retry now",
                    ),
                };
                vec![
                    format!(
                        "<a href=\"/row?stream={}&amp;seq={}\">{}</a>",
                        esc(&rows::url_encode(&s.stream)),
                        s.seq,
                        esc(&s.stream)
                    ),
                    num(s.seq),
                    esc(&s.event_type),
                    format!("<span class=\"{0}\">{0}</span>", esc(&s.status.to_string())),
                    num(s.attempts),
                    format!(
                        "<span title=\"since {}\">{}</span>",
                        esc(&s.first_failure_at),
                        esc(&human_ms(s.failing_for_ms))
                    ),
                    esc(s.next_attempt_at.as_deref().unwrap_or("never (requeue it)")),
                    esc(s.last_error.as_deref().unwrap_or("")),
                    num(s.waiting_behind),
                    action,
                ]
            })
            .collect();
        b.push_str(&table(
            "blocked",
            &[
                "stream",
                "seq",
                "type",
                "status",
                "attempts",
                "failing for",
                "next attempt",
                "last error",
                "waiting behind",
                "action",
            ],
            &rows,
        ));
    }
    if !r.complete {
        let _ = write!(
            b,
            "<p class=\"note\">First {} rows of each status only.</p>",
            m.limit
        );
    }
    html(StatusCode::OK, page(&m.app, "Blocked streams", &b))
}

#[derive(Deserialize)]
struct RunsQuery {
    digests: Option<String>,
}

async fn runs<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    q: Result<Query<RunsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return text(StatusCode::BAD_REQUEST, "malformed query string");
    };
    let with_digests = match q.digests.as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => return text(StatusCode::BAD_REQUEST, "digests must be 0 or 1"),
    };
    match runs_body(&m, with_digests).await {
        Ok(body) => html(StatusCode::OK, page(&m.app, "Runs", &body)),
        Err(e) => fail(&e),
    }
}

/// The generation records (ADR 0021): which generation of each projection
/// is live, and the build in progress.
fn generations_section(bin: &str, records: &[outbox_core::GenerationInfo]) -> String {
    let mut b = String::from("<h2>Generations</h2>");
    if records.is_empty() {
        b.push_str(&format!(
            "<p>No projection has a second generation (<code>{} rebuild --blue-green</code> builds one).</p>",
            esc(bin)
        ));
        return b;
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            let storage = r.live_storage().map(|s| s.to_string()).unwrap_or_default();
            let building = match (r.building, r.building_version) {
                (Some(g), Some(v)) => format!("g{g} (version {v}) at position {}", r.building_position),
                _ => String::new(),
            };
            vec![
                esc(r.projection.as_str()),
                esc(&format!("g{} ({storage})", r.live)),
                num(u64::from(r.live_version)),
                num(r.epoch),
                esc(&building),
                esc(&r.updated_at.to_string()),
            ]
        })
        .collect();
    b.push_str(&table(
        "generations",
        &["projection", "live", "version", "epoch", "building", "updated"],
        &rows,
    ));
    let _ = write!(
        b,
        "<p class=\"note\">Older generations are kept until <code>{bin} generations drop</code>; \
         <code>{bin} generations</code> lists what each holds.</p>",
        bin = esc(bin)
    );
    b
}

async fn runs_body<J: JournalBackend, P: CliStore>(
    m: &Monitor<J, P>,
    with_digests: bool,
) -> Result<String, Error> {
    let runs = m.store.runs(m.limit).await?;
    let mut b = String::from("<h2>Replay and rebuild runs</h2>");
    if runs.is_empty() {
        b.push_str("<p>No run recorded.</p>");
    } else {
        let rows: Vec<Vec<String>> = runs
            .iter()
            .map(|r| {
                let last = match (&r.last_stream, r.last_seq) {
                    (Some(s), Some(q)) => format!("{s}/{q}"),
                    _ => String::new(),
                };
                let cancel = if r.state.is_active() && !r.cancel_requested && m.door.acts() {
                    action_form("/actions/cancel-run", &[("id", r.id.to_string())], "Cancel")
                } else if r.cancel_requested && r.state.is_active() {
                    "cancel requested".into()
                } else {
                    String::new()
                };
                vec![
                    num(r.id),
                    esc(&r.kind.to_string()),
                    esc(r.projection.as_str()),
                    esc(&r.state.to_string()),
                    num(r.processed),
                    esc(&r.since.map(|u| u.to_string()).unwrap_or_default()),
                    esc(&r.until.map(|u| u.to_string()).unwrap_or_default()),
                    esc(&r.position.map(|u| u.to_string()).unwrap_or_default()),
                    esc(&last),
                    esc(r.owner.as_str()),
                    esc(&r.updated_at.to_string()),
                    esc(r.error_message.as_deref().unwrap_or("")),
                    cancel,
                ]
            })
            .collect();
        b.push_str(&table(
            "runs",
            &[
                "id",
                "kind",
                "projection",
                "state",
                "processed",
                "since",
                "until",
                "position",
                "last event",
                "owner",
                "updated",
                "error",
                "action",
            ],
            &rows,
        ));
    }
    b.push_str(&generations_section(&m.app, &m.store.generations().await?));
    b.push_str("<h2>Running digests</h2>");
    let running = m.store.view_digests().await?;
    if running.is_empty() {
        b.push_str("<p>No view projection has documents yet.</p>");
    } else {
        let rows: Vec<Vec<String>> = running
            .iter()
            .map(|d| {
                let digest = d.digest.map_or_else(
                    || "untracked (documents predate running digests: rebuild it)".to_owned(),
                    |h| h.to_string(),
                );
                let last = d
                    .last_event
                    .as_ref()
                    .map(|(s, q)| format!("{s}/{q}"))
                    .unwrap_or_default();
                vec![
                    esc(d.projection.as_str()),
                    format!("<code>{}</code>", esc(&digest)),
                    num(d.documents),
                    esc(&last),
                    esc(&d.updated_at.map(|t| t.to_string()).unwrap_or_default()),
                ]
            })
            .collect();
        b.push_str(&table(
            "running-digests",
            &[
                "projection",
                "running digest",
                "documents",
                "as of event",
                "updated",
            ],
            &rows,
        ));
        let _ = write!(
            b,
            "<p class=\"note\">Kept by every apply transaction, read without a scan; \
             <code>{} verify</code> recomputes them from every document.</p>",
            esc(&m.app)
        );
    }
    b.push_str("<h2>Projection digests</h2>");
    if m.projections.is_empty() {
        b.push_str("<p class=\"note\">This binary has no projections.</p>");
    } else if with_digests {
        let d = digests(&m.store, &m.projections).await?;
        let mut rows: Vec<Vec<String>> = d.projections.iter().map(|(p, h)| vec![esc(p), esc(h)]).collect();
        rows.push(vec!["(store)".into(), esc(&d.store)]);
        b.push_str(&table("digests", &["projection", "digest"], &rows));
    } else {
        b.push_str(
            "<p class=\"note\">Digests read every projection document: \
             <a href=\"/runs?digests=1\">compute them</a>.</p>",
        );
    }
    Ok(b)
}

async fn metrics<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let read = async {
        let (summary, _) = page_summary(&m).await?;
        let live = m.journal.workers().await?;
        let workers = live.len();
        let sinks = m.journal.sinks().await?;
        let consumers = consumer_statuses_with(&m.journal, &live).await?;
        let count = |f: fn(&ConsumerStatus) -> bool| consumers.iter().filter(|c| f(c)).count() as u64;
        let (orphans, paused) = (count(|c| !c.live), count(|c| c.info.paused));
        Ok::<_, Error>((Gauges::from_summary(&summary), workers, sinks, orphans, paused))
    };
    // The lag comes from the last computation (never a scan per scrape),
    // with its time and count so an alert can see it go stale.
    let figures = m.figures.read();
    let computed = figures.computed.as_deref();
    match read.await {
        Ok((g, workers, sinks, orphans, paused)) => metrics_response(&Scrape {
            gauges: Some(&g),
            lag: computed.and_then(|c| c.lag.as_ref()),
            figures: Some(crate::metrics::FiguresAge {
                as_of_ms: computed.map(|c| c.as_of.as_millis()),
                took: computed.map(|c| c.took),
                computations: figures.computations,
            }),
            workers: Some(workers),
            orphan_consumers: Some(orphans),
            paused_consumers: Some(paused),
            sinks: Some(&sinks),
            worker: None,
        }),
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------------------
// actions
// ---------------------------------------------------------------------------

/// `/audit`: the last actions and refusals of this monitor, newest first.
async fn audit<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let entries = m.door.audit_entries();
    let mut b = String::from(
        "<p class=\"note\">The last 200 actions and refusals of this monitor since it started, \
         newest first (this process's clock). Every one is also a log line on the target \
         <code>outbox::audit</code>, the durable record.</p>",
    );
    if entries.is_empty() {
        b.push_str("<p id=\"no-audit\">Nothing yet.</p>");
    } else {
        let rows: Vec<Vec<String>> = entries
            .iter()
            .map(|e| {
                vec![
                    esc(&e.at.to_string()),
                    esc(&e.peer.to_string()),
                    esc(e.token.as_deref().unwrap_or("")),
                    esc(&e.action),
                    esc(&e.on),
                    esc(&e.result),
                ]
            })
            .collect();
        b.push_str(&table(
            "audit",
            &["at", "from", "token id", "action", "on", "result"],
            &rows,
        ));
    }
    html(StatusCode::OK, page(&m.app, "Audit", &b))
}

fn stream_seq(f: &ActionForm) -> Result<(outbox_core::StreamId, Seq), Refusal> {
    let stream = outbox_core::StreamId::new(field(&f.stream, "stream")?).map_err(|e| refusal(&e))?;
    let seq = Seq::new(number(&f.seq, "seq")?).map_err(|e| refusal(&e))?;
    Ok((stream, seq))
}

macro_rules! try_resp {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return r.into_response(),
        }
    };
}

async fn requeue<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = try_resp!(authorize(&m, peer, "requeue", &headers, form));
    let (stream, seq) = checked!(m, (peer, &token), "requeue", stream_seq(&f));
    let result = m.journal.requeue(&stream, seq).await.map(|row| {
        format!(
            "requeued {}/{} ({}): pending, attempts 0, due now",
            row.stream, row.seq, row.event_type
        )
    });
    finish(
        &m,
        (peer, &token),
        "requeue",
        &format!("{stream}/{seq}"),
        result,
        "/blocked",
    )
}

async fn retry<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = try_resp!(authorize(&m, peer, "retry", &headers, form));
    let (stream, seq) = checked!(m, (peer, &token), "retry", stream_seq(&f));
    let result = m.journal.retry(&stream, seq).await.map(|row| {
        format!(
            "retrying {}/{} ({}): pending, attempts {} kept, due {}",
            row.stream, row.seq, row.event_type, row.attempt_count, row.next_attempt_at
        )
    });
    finish(
        &m,
        (peer, &token),
        "retry",
        &format!("{stream}/{seq}"),
        result,
        "/blocked",
    )
}

async fn requeue_dead<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = try_resp!(authorize(&m, peer, "requeue-dead", &headers, form));
    let who = (peer, token.as_str());
    let limit = checked!(m, who, "requeue-dead", number(&f.limit, "limit"));
    if !(1..=10_000).contains(&limit) {
        let r = refuse(StatusCode::BAD_REQUEST, "`limit` must be between 1 and 10000");
        return bad_input(&m, who, "requeue-dead", r);
    }
    let result = m
        .journal
        .requeue_dead(limit as usize)
        .await
        .map(|rows| format!("requeued {} dead row(s)", rows.len()));
    finish(
        &m,
        (peer, &token),
        "requeue-dead",
        &format!("limit {limit}"),
        result,
        "/",
    )
}

async fn cancel_run<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = try_resp!(authorize(&m, peer, "cancel-run", &headers, form));
    let id = checked!(m, (peer, &token), "cancel-run", number(&f.id, "id"));
    let result = m.store.cancel_run(id).await.map(|run| {
        format!(
            "cancel requested for run {} ({} {}): {}",
            run.id, run.kind, run.projection, run.state
        )
    });
    finish(
        &m,
        (peer, &token),
        "cancel-run",
        &format!("run {id}"),
        result,
        "/runs",
    )
}

#[cfg(test)]
mod tests {
    use super::kit::cross_origin;
    use super::*;

    #[test]
    fn skipped_events_are_listed_escaped_with_the_reapply_command() {
        assert!(skipped_section(&[], "shop").contains("No event is skipped"));
        let hostile = outbox_core::SkippedEvent {
            projection: outbox_core::ProjectionName::new("orders").unwrap(),
            stream: outbox_core::StreamId::new("s<1>").unwrap(),
            seq: outbox_core::Seq::new(7).unwrap(),
            error: "<script>alert(1)</script>".into(),
            skipped_at: outbox_core::Timestamp::from_millis(0),
        };
        let page = skipped_section(&[hostile], "shop");
        assert!(page.contains("<table id=\"skipped\">"), "{page}");
        assert!(
            page.contains("s&lt;1&gt;") && page.contains("&lt;script&gt;"),
            "{page}"
        );
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("shop skipped reapply"), "{page}");
    }

    #[test]
    fn cross_origin_posts_are_recognized() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9464"));
        assert_eq!(cross_origin(&h), None);
        h.insert(header::ORIGIN, HeaderValue::from_static("http://127.0.0.1:9464"));
        assert_eq!(cross_origin(&h), None);
        h.insert(header::ORIGIN, HeaderValue::from_static("http://evil.example"));
        assert!(cross_origin(&h).is_some());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_origin(&h).is_some());
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert_eq!(cross_origin(&h), None);
    }
}
