//! The stored figures (ADR 0036's amendment): pages and `/metrics` read the
//! last computation and never scan; the figures move only when the task
//! computes again. The task's tick is driven by hand ([`Figures::compute`]),
//! so no outcome depends on a clock.

use std::sync::Arc;

use axum::extract::State;
use outbox_core::{
    AppendOptions, AppendRequest, EventJournal, EventType, ExpectedVersion, Intent, NewEvent, Projection,
    ProjectionName, StreamId,
};

use super::door::{Door, DoorConfig};
use super::{BODY_LIMIT, Monitor, metrics, overview_body};
use outbox_sqlite::{SqliteJournal, SqliteProjectionStore, SqliteTx};

/// A projection no worker runs here: its checkpoint stays 0, so it lacks
/// every appended event.
struct NeverApplied(ProjectionName);

#[outbox_core::async_trait]
impl<Tx: Send + 'static> Projection<Tx> for NeverApplied {
    fn name(&self) -> &ProjectionName {
        &self.0
    }
    async fn apply(&self, _: &mut Tx, _: &outbox_core::Event) -> Result<(), outbox_core::BoxError> {
        Ok(())
    }
    async fn reset(&self, _: &mut Tx) -> Result<(), outbox_core::BoxError> {
        Ok(())
    }
    async fn digest(
        &self,
        _: &mut Tx,
        _: &mut outbox_core::DigestBuilder,
    ) -> Result<(), outbox_core::BoxError> {
        Ok(())
    }
}

async fn append<J: EventJournal>(journal: &J, stream: &str, events: usize) {
    let events = (0..events)
        .map(|_| NewEvent::new(EventType::new("tick").unwrap(), Intent::Apply, b"{}".to_vec()))
        .collect();
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
        .expect("append");
}

/// The value of one sample line of a `/metrics` answer.
/// A monitor over fresh SQLite files (in the returned directory) showing
/// `projections`, counting rows exactly up to `exact_rows`.
async fn monitor(
    projections: Vec<Arc<dyn Projection<SqliteTx>>>,
    exact_rows: u64,
) -> (
    tempfile::TempDir,
    Arc<Monitor<SqliteJournal, SqliteProjectionStore>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let door = Door::new(&DoorConfig {
        bound: "127.0.0.1:0".parse().unwrap(),
        allowed_hosts: None,
        max_connections: 16,
        head_timeout: std::time::Duration::from_secs(60),
        request_timeout: std::time::Duration::from_secs(60),
        busy_pages: 4,
        body_limit: BODY_LIMIT,
        what: "the monitor",
    })
    .unwrap();
    let m = super::test_monitor::monitor(Arc::new(door), dir.path(), projections, 100, exact_rows).await;
    (dir, m)
}

fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

async fn scrape<J: crate::backend::CliJournal, P: crate::backend::CliStore>(
    m: &Arc<Monitor<J, P>>,
) -> String {
    let res = metrics(State(m.clone())).await;
    assert_eq!(res.status(), 200);
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// The projection-lag row of the overview: (streams behind, events behind).
fn lag_row(page: &str) -> String {
    let at = page
        .find("id=\"projection-lag\"")
        .expect("a projection lag section");
    let table = &page[at..];
    table[table.find("<tbody>").unwrap_or(0)..table.find("</table>").expect("its table")].to_owned()
}

#[tokio::test]
async fn pages_and_metrics_read_the_last_computation_and_only_the_task_scans() {
    let tally: Arc<dyn Projection<_>> = Arc::new(NeverApplied(ProjectionName::new("tally").unwrap()));
    let (_dir, m) = monitor(vec![tally], 100_000).await;
    append(&m.journal, "s-1", 3).await;

    // Before the first computation: "computing…", no lag gauge, and the
    // requests ran none.
    let page = overview_body(&m, None).await.unwrap();
    assert!(page.contains("computing…"), "{page}");
    let body = scrape(&m).await;
    assert_eq!(
        sample(&body, "outbox_monitor_figures_computations_total"),
        Some(0.0),
        "{body}"
    );
    assert!(!body.contains("outbox_projection_events_behind"), "{body}");
    assert!(!body.contains("outbox_monitor_figures_as_of_seconds"), "{body}");

    // The task's tick, by hand.
    let first = m
        .figures
        .compute(&m.journal, &m.store, &m.projections, m.lag_streams)
        .await
        .unwrap();
    assert_eq!(m.figures.read().computations, 1);

    // Many requests later, still one computation; each shows its figures
    // and their time.
    for _ in 0..20 {
        let page = overview_body(&m, None).await.unwrap();
        assert!(
            page.contains(&format!("data-as-of-ms=\"{}\"", first.as_of.as_millis())),
            "{page}"
        );
        assert!(page.contains(&format!("as of {}", first.as_of)), "{page}");
        assert!(lag_row(&page).contains("<span class=\"num\">1</span></td><td><span class=\"num\">3</span>"));
        let body = scrape(&m).await;
        assert_eq!(
            sample(&body, "outbox_projection_events_behind{projection=\"tally\"}"),
            Some(3.0),
            "{body}"
        );
        assert_eq!(
            sample(&body, "outbox_monitor_figures_computations_total"),
            Some(1.0),
            "{body}"
        );
        assert_eq!(
            sample(&body, "outbox_monitor_figures_as_of_seconds"),
            Some(first.as_of.as_millis() as f64 / 1000.0),
            "{body}"
        );
    }
    assert_eq!(
        m.figures.read().computations,
        1,
        "a request never computes the figures"
    );

    // New events: the pages keep the last computation's figures (a request
    // that scanned would see them)...
    append(&m.journal, "s-2", 2).await;
    let page = overview_body(&m, None).await.unwrap();
    assert!(lag_row(&page).contains("<span class=\"num\">1</span></td><td><span class=\"num\">3</span>"));
    let body = scrape(&m).await;
    assert_eq!(
        sample(&body, "outbox_projection_events_behind{projection=\"tally\"}"),
        Some(3.0),
        "{body}"
    );
    // ... while the cheap counts are per request.
    assert_eq!(
        sample(&body, "outbox_rows{status=\"pending\"}"),
        Some(5.0),
        "{body}"
    );

    // ... until the task computes again.
    let second = m
        .figures
        .compute(&m.journal, &m.store, &m.projections, m.lag_streams)
        .await
        .unwrap();
    assert!(second.as_of >= first.as_of);
    let page = overview_body(&m, None).await.unwrap();
    assert!(
        lag_row(&page).contains("<span class=\"num\">2</span></td><td><span class=\"num\">5</span>"),
        "{page}"
    );
    assert!(
        page.contains(&format!("data-as-of-ms=\"{}\"", second.as_of.as_millis())),
        "{page}"
    );
    let body = scrape(&m).await;
    assert_eq!(
        sample(&body, "outbox_projection_events_behind{projection=\"tally\"}"),
        Some(5.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "outbox_projection_streams_behind{projection=\"tally\"}"),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        sample(&body, "outbox_monitor_figures_computations_total"),
        Some(2.0),
        "{body}"
    );
}

/// Past `--exact-rows` (here 2), pages and `/metrics` show the last
/// computation's counts, say so and when they were made, and count nothing
/// themselves; under it they count per request.
#[tokio::test]
async fn past_exact_rows_the_counts_are_the_figures_and_say_so() {
    let (_dir, m) = monitor(vec![], 2).await;
    append(&m.journal, "s-1", 2).await;
    m.figures
        .compute(&m.journal, &m.store, &m.projections, m.lag_streams)
        .await
        .unwrap();
    // 2 rows: not over the limit, counted per request.
    append(&m.journal, "s-2", 1).await;
    let page = overview_body(&m, None).await.unwrap();
    assert!(page.contains("<span id=\"count-pending\">3</span>"), "{page}");
    assert!(!page.contains("counts-stored"), "{page}");
    // The task counts 3: over the limit, the pages show its counts.
    let third = m
        .figures
        .compute(&m.journal, &m.store, &m.projections, m.lag_streams)
        .await
        .unwrap();
    append(&m.journal, "s-3", 4).await;
    let page = overview_body(&m, None).await.unwrap();
    assert!(page.contains("<span id=\"count-pending\">3</span>"), "{page}");
    assert!(
        page.contains("id=\"counts-stored\"") && page.contains(&format!("as of {}", third.as_of)),
        "{page}"
    );
    let body = scrape(&m).await;
    assert_eq!(
        sample(&body, "outbox_rows{status=\"pending\"}"),
        Some(3.0),
        "{body}"
    );
    // The next computation moves them.
    m.figures
        .compute(&m.journal, &m.store, &m.projections, m.lag_streams)
        .await
        .unwrap();
    let page = overview_body(&m, None).await.unwrap();
    assert!(page.contains("<span id=\"count-pending\">7</span>"), "{page}");
}
