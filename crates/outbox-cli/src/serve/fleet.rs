//! The monitor's pages of who does the work: the partitions with their
//! leases and rows (`/partitions`), and the sinks with their failing and
//! dead streams (`/sinks`, with a requeue of one stream behind the token).

use std::net::SocketAddr;

use axum::extract::rejection::FormRejection;
use axum::extract::{ConnectInfo, Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox_core::{SinkName, SinkStatus, StreamId};

use super::html::{action_form, esc, page, table};
use super::kit::{
    ActionForm, St, authorize, bad_input, checked, fail, field, finish, html, num, refusal, sinks_section,
};
use crate::backend::{CliJournal, CliStore};

/// `/partitions`: every partition's lease and rows.
pub(super) async fn partitions_page<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let list = match m.journal.partitions().await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let partitioning = m.journal.partitioning();
    let held = list.iter().filter(|p| p.held).count();
    let mut b = format!(
        "<p class=\"note\">{} partition(s) by {}; {held} held by a live lease. A worker with \
         partition leasing applies and publishes the streams of the partitions it holds.</p>",
        partitioning.count(),
        esc(partitioning.partitioner_name())
    );
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                num(p.partition.get()),
                esc(p.owner.as_ref().map_or("", |o| o.as_str())),
                num(p.epoch),
                esc(&p.expires_at.map_or_else(String::new, |t| t.to_string())),
                if p.held {
                    "<span class=\"ok\">held</span>".into()
                } else {
                    "<span class=\"failed\">free</span>".into()
                },
                num(p.streams),
                num(p.rows),
                num(p.due_rows),
            ]
        })
        .collect();
    b.push_str(&table(
        "partitions",
        &[
            "partition",
            "owner",
            "epoch",
            "expires",
            "lease",
            "streams",
            "rows",
            "due rows",
        ],
        &rows,
    ));
    html(StatusCode::OK, page(&m.app, "Partitions", &b))
}

/// `/sinks`: each sink's delivery, then its dead and failing streams (the
/// first `--limit` of each), with a requeue of each behind the token.
pub(super) async fn sinks_page<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let sinks = match m.journal.sinks().await {
        Ok(s) => super::kit::only_sinks(s),
        Err(e) => return fail(&e),
    };
    let mut b = sinks_section(&sinks);
    for s in &sinks {
        let mut streams = Vec::new();
        for status in [SinkStatus::Dead, SinkStatus::Failed] {
            match m.journal.sink_streams(&s.sink, Some(status), m.limit).await {
                Ok(v) => streams.extend(v),
                Err(e) => return fail(&e),
            }
        }
        if streams.is_empty() {
            continue;
        }
        b.push_str(&format!(
            "<h2>{}: failing and dead streams</h2>",
            esc(s.sink.as_str())
        ));
        let rows: Vec<Vec<String>> = streams
            .iter()
            .map(|f| {
                let action = if m.door.acts() {
                    action_form(
                        "/actions/requeue-sink",
                        &[("sink", f.sink.to_string()), ("stream", f.stream.to_string())],
                        "Requeue",
                    )
                } else {
                    String::new()
                };
                vec![
                    esc(f.stream.as_str()),
                    num(f.seq + 1),
                    format!("<span class=\"{0}\">{0}</span>", esc(&f.status.to_string())),
                    num(f.attempt_count),
                    esc(&f.next_attempt_at.to_string()),
                    esc(f.last_error.as_deref().unwrap_or("")),
                    action,
                ]
            })
            .collect();
        b.push_str(&table(
            &format!("sink-streams-{}", s.sink),
            &[
                "stream",
                "at seq",
                "status",
                "attempts",
                "next attempt",
                "last error",
                "action",
            ],
            &rows,
        ));
    }
    html(StatusCode::OK, page(&m.app, "Sinks", &b))
}

/// `/actions/requeue-sink` (`sink`, `stream`): the stream is retried for
/// that sink from its checkpoint, now, attempts reset.
pub(super) async fn requeue_sink<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = match authorize(&m, peer, "requeue-sink", &headers, form) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let names = field(&f.sink, "sink").and_then(|sink| {
        let stream = field(&f.stream, "stream")?;
        Ok((
            SinkName::new(sink).map_err(|e| refusal(&e))?,
            StreamId::new(stream).map_err(|e| refusal(&e))?,
        ))
    });
    let (sink, stream) = checked!(m, (peer, &token), "requeue-sink", names);
    let result = m.journal.requeue_sink(&sink, &stream).await.map(|s| {
        format!(
            "requeued stream {} for sink {}: due now from seq {} (attempts reset)",
            s.stream,
            s.sink,
            s.seq + 1
        )
    });
    finish(
        &m,
        (peer, &token),
        "requeue-sink",
        &format!("{sink} {stream}"),
        result,
        "/sinks",
    )
}

/// `/actions/pause-consumer` and `/actions/resume-consumer` (`sink`: the
/// consumer's key, `projection:NAME` or a sink's name): ADR 0032.
pub(super) async fn pause_consumer<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    set_paused(m, peer, headers, form, true).await
}

/// See [`pause_consumer`].
pub(super) async fn resume_consumer<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    set_paused(m, peer, headers, form, false).await
}

async fn set_paused<J: CliJournal, P: CliStore>(
    m: std::sync::Arc<super::kit::Monitor<J, P>>,
    peer: SocketAddr,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
    paused: bool,
) -> Response {
    let action = if paused {
        "pause-consumer"
    } else {
        "resume-consumer"
    };
    let (f, token) = match authorize(&m, peer, action, &headers, form) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let key = checked!(
        m,
        (peer, &token),
        action,
        field(&f.sink, "sink").and_then(|k| SinkName::new(k).map_err(|e| refusal(&e)))
    );
    let result = outbox_runtime::consumers::pause_consumer(&m.journal, &key, paused)
        .await
        .map(|changed| {
            let state = if paused { "paused" } else { "resumed" };
            if changed {
                format!("{state} consumer {key} (live workers see it within a heartbeat interval)")
            } else {
                format!("consumer {key} was already {state}")
            }
        });
    finish(&m, (peer, &token), action, key.as_str(), result, "/#consumers")
}
