//! Prometheus metrics: the queue gauges read from the database, the
//! projections' checkpoint lag, and a worker process's own counters, in the
//! OpenMetrics text format Prometheus scrapes (`prometheus-client`, ADR 0017).
//!
//! A scrape builds a fresh registry from one reading, so two processes
//! (`outbox serve` and `outbox work --metrics-addr`) never disagree about
//! what a gauge means. The one exception is `serve`'s projection lag: it is
//! the last computation of a background task (ADR 0036's amendment), with
//! its time as `outbox_monitor_figures_as_of_seconds`.

use std::sync::atomic::AtomicU64;

use outbox_core::SinkSummary;
use outbox_runtime::{Gauges, LagSnapshot, MetricsSnapshot, StoreCallStats};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::report::LagReport;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What one scrape reports; every part is optional.
#[derive(Default)]
pub struct Scrape<'a> {
    /// The queue gauges (rows by status, oldest due age).
    pub gauges: Option<&'a Gauges>,
    /// The projections' checkpoint lag.
    pub lag: Option<&'a LagReport>,
    /// Live registered workers.
    pub workers: Option<usize>,
    /// Registered consumers no live worker runs (ADR 0032).
    pub orphan_consumers: Option<u64>,
    /// Registered consumers paused (ADR 0032): they fall behind until
    /// resumed, and the worker lag does not count their work.
    pub paused_consumers: Option<u64>,
    /// Each sink's delivery state.
    pub sinks: Option<&'a [SinkSummary]>,
    /// This process's worker counters (`outbox work`).
    pub worker: Option<&'a MetricsSnapshot>,
    /// When the monitor's stored figures (the lag) were computed (`serve`).
    pub figures: Option<FiguresAge>,
}

/// The age of the monitor's stored figures: the lag on a scrape is the
/// last background computation's, not the scrape's own.
#[derive(Debug, Clone, Copy)]
pub struct FiguresAge {
    /// When the last successful computation began (ms since the epoch, the
    /// database's clock); `None` before the first.
    pub as_of_ms: Option<i64>,
    /// How long it took.
    pub took: Option<std::time::Duration>,
    /// Computations finished, failed ones included.
    pub computations: u64,
}

type Labelled = Family<Vec<(String, String)>, Gauge>;

fn gauge(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let g: Gauge = Gauge::default();
    g.set(i64::try_from(v).unwrap_or(i64::MAX));
    reg.register(name, help, g);
}

fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c: Counter = Counter::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// The worker's store calls, one series per port method (`call` label):
/// how many, how many ended in infrastructure trouble or at their deadline,
/// and the time they took.
fn store_call_families(reg: &mut Registry, calls: &[StoreCallStats]) {
    let counted: Family<Vec<(String, String)>, Counter> = Family::default();
    let troubled: Family<Vec<(String, String)>, Counter> = Family::default();
    let timed_out: Family<Vec<(String, String)>, Counter> = Family::default();
    let took: Family<Vec<(String, String)>, Counter<f64, AtomicU64>> = Family::default();
    for c in calls {
        let l = label("call", c.call);
        counted.get_or_create(&l).inc_by(c.calls);
        troubled.get_or_create(&l).inc_by(c.temporary_errors);
        timed_out.get_or_create(&l).inc_by(c.timeouts);
        took.get_or_create(&l).inc_by(c.total_us as f64 / 1e6);
    }
    reg.register("store_calls", "Store calls made, by port method", counted);
    reg.register(
        "store_call_errors",
        "Store calls that ended in a temporary error (deadline passes included), by port method",
        troubled,
    );
    reg.register(
        "store_call_timeouts",
        "Store calls dropped at their deadline, by port method",
        timed_out,
    );
    reg.register_with_unit(
        "store_call",
        "Time spent in store calls, by port method",
        Unit::Seconds,
        took,
    );
}

/// A histogram aggregated elsewhere (the worker's lag histogram), encoded
/// as it is: non-cumulative bucket counts, the unbounded bucket last.
#[derive(Debug)]
struct Aggregated {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl Aggregated {
    fn lag(s: &LagSnapshot) -> Self {
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = s
            .buckets
            .iter()
            .map(|&(le_ms, cumulative)| {
                let n = cumulative.saturating_sub(below);
                below = cumulative;
                (le_ms as f64 / 1000.0, n)
            })
            .collect();
        buckets.push((f64::INFINITY, s.count.saturating_sub(below)));
        Aggregated {
            sum: s.sum_ms as f64 / 1000.0,
            count: s.count,
            buckets,
        }
    }
}

impl EncodeMetric for Aggregated {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

fn label(k: &str, v: &str) -> Vec<(String, String)> {
    vec![(k.to_owned(), v.to_owned())]
}

/// Renders one scrape as OpenMetrics text (ends with `# EOF`).
pub fn render(s: &Scrape<'_>) -> String {
    let mut reg = Registry::with_prefix("outbox");
    if let Some(g) = s.gauges {
        let rows = Labelled::default();
        for (status, n) in [
            ("pending", g.pending),
            ("processing", g.processing),
            ("failed", g.failed),
            ("dead", g.dead),
        ] {
            rows.get_or_create(&label("status", status))
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        reg.register("rows", "Outbox rows by status", rows);
        for (name, help, ms) in [
            (
                "oldest_due_age_seconds",
                "How long the oldest due pending-or-failed row has waited (0 when none is due), \
                 rows held back behind a failed or dead row included",
                g.oldest_due_age_ms,
            ),
            (
                "oldest_applicable_age_seconds",
                "How long the oldest work a worker may take now has waited (0 when none is due); \
                 rows that failures hold back do not count",
                g.worker_lag_ms,
            ),
        ] {
            let age: Gauge<f64, AtomicU64> = Gauge::default();
            age.set(ms as f64 / 1000.0);
            reg.register(name, help, age);
        }
    }
    if let Some(lag) = s.lag {
        let streams = Labelled::default();
        let events = Labelled::default();
        for p in &lag.projections {
            streams
                .get_or_create(&label("projection", &p.projection))
                .set(i64::try_from(p.streams_behind).unwrap_or(i64::MAX));
            events
                .get_or_create(&label("projection", &p.projection))
                .set(i64::try_from(p.events_behind).unwrap_or(i64::MAX));
        }
        reg.register(
            "projection_streams_behind",
            "Streams whose checkpoint of the projection is below the journal's version",
            streams,
        );
        reg.register(
            "projection_events_behind",
            "Events the projection has not applied yet, over the scanned streams",
            events,
        );
        gauge(
            &mut reg,
            "projection_lag_streams_scanned",
            "Streams compared for the checkpoint lag",
            lag.streams_scanned,
        );
        gauge(
            &mut reg,
            "projection_lag_complete",
            "1 when the lag scan covered every stream, 0 when it stopped at its bound",
            u64::from(lag.complete),
        );
    }
    if let Some(f) = s.figures {
        if let Some(ms) = f.as_of_ms {
            let at: Gauge<f64, AtomicU64> = Gauge::default();
            at.set(ms as f64 / 1000.0);
            reg.register(
                "monitor_figures_as_of_seconds",
                "When the stored figures (the projection lag) were computed, seconds since the epoch",
                at,
            );
        }
        if let Some(took) = f.took {
            let t: Gauge<f64, AtomicU64> = Gauge::default();
            t.set(took.as_secs_f64());
            reg.register(
                "monitor_figures_duration_seconds",
                "How long the last computation of the stored figures took",
                t,
            );
        }
        counter(
            &mut reg,
            "monitor_figures_computations",
            "Computations of the stored figures finished, failed ones included",
            f.computations,
        );
    }
    if let Some(n) = s.orphan_consumers {
        gauge(
            &mut reg,
            "consumers_without_live_worker",
            "Registered consumers (projections, sinks) that no live worker runs",
            n,
        );
    }
    if let Some(n) = s.paused_consumers {
        gauge(
            &mut reg,
            "consumers_paused",
            "Registered consumers (projections, sinks) paused: nothing is applied or delivered to them until resumed",
            n,
        );
    }
    if let Some(n) = s.workers {
        gauge(&mut reg, "workers", "Live registered workers", n as u64);
    }
    if let Some(sinks) = s.sinks {
        let streams = Labelled::default();
        for sink in sinks {
            for (status, n) in [("failed", sink.failed), ("dead", sink.dead)] {
                streams
                    .get_or_create(&vec![
                        ("sink".to_owned(), sink.sink.as_str().to_owned()),
                        ("status".to_owned(), status.to_owned()),
                    ])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
        reg.register(
            "sink_streams",
            "Streams a sink is retrying (failed) or has dead-lettered (dead)",
            streams,
        );
        gauge(
            &mut reg,
            "sink_held_back_events",
            &format!(
                "Committed events every sink holds back until an older open transaction ends (counted up to {})",
                SinkSummary::HELD_BACK_CAP
            ),
            SinkSummary::held_back_of(sinks),
        );
    }
    if let Some(m) = s.worker {
        let w = reg.sub_registry_with_prefix("worker");
        for (name, help, v) in [
            ("applied", "Events applied to projections", m.applied),
            (
                "duplicates",
                "Events skipped because every projection had applied them",
                m.duplicates,
            ),
            ("audit_only", "Audit-only events checkpointed", m.audit_only),
            ("failures", "Failures recorded (retries scheduled)", m.failed),
            ("dead_lettered", "Rows dead-lettered", m.dead_lettered),
            ("skipped", "Events a projection skipped with a record", m.skipped),
            (
                "completed_rows",
                "Outbox rows deleted after apply",
                m.completed_rows,
            ),
            ("claims", "Successful claims", m.claims),
            (
                "contended",
                "Streams skipped because another worker held the lease",
                m.contended,
            ),
            ("caught_up", "Gap catch-ups from the journal", m.caught_up),
            ("inline_applied", "Appends applied inline", m.inline_applied),
            ("inline_failed", "Inline applies that failed", m.inline_failed),
            (
                "shadow_verified",
                "Rows the shadow worker verified",
                m.shadow_verified,
            ),
            (
                "storage_errors",
                "Passes stopped by a temporary storage error or a lost lease",
                m.storage_errors,
            ),
            (
                "lease_takeovers",
                "Claims that took over rows a crashed, killed or stalled worker left processing",
                m.lease_takeovers,
            ),
        ] {
            counter(w, name, help, v);
        }
        store_call_families(w, &m.store_calls);
        w.register_with_unit(
            "lag",
            "Append-to-applied lag of the events this worker applied, by the database's clock",
            Unit::Seconds,
            Aggregated::lag(&m.lag),
        );
    }
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}
