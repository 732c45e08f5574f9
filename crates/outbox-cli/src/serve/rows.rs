//! The monitor's row pages: one stream found by its id (`/stream`), one
//! row with its event (`/row`), and the dead rows grouped by their error
//! (`/dead`) with a requeue of a whole group (a dry run first, capped).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::SocketAddr;

use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{ConnectInfo, Form, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use outbox_core::{Error, OutboxRow, OutboxStatus, Seq, StreamId};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::html::{action_form, esc, page, table};
use super::kit::{ActionForm, St, authorize, bad_input, fail, finish, html, num, refuse, text};
use crate::backend::{CliJournal, CliStore};

/// The most payload bytes the row page shows.
const PAYLOAD_SHOWN: usize = 4 * 1024;
/// The most dead rows read to group them (the page says when it stopped).
const DEAD_READ: usize = 10_000;
/// The most rows one group requeue touches.
pub(super) const GROUP_REQUEUE_CAP: usize = 1_000;
/// The most outbox rows the stream page lists.
const STREAM_ROWS: u64 = 50;

#[derive(Deserialize)]
pub(super) struct StreamQuery {
    stream: Option<String>,
}

/// `/stream?stream=S` (the search box of every page): the stream's version,
/// each projection's checkpoint of it, its outbox rows from its head (the
/// first 50), and each sink's state of it.
pub(super) async fn stream_page<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    q: Result<Query<StreamQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return text(StatusCode::BAD_REQUEST, "malformed query");
    };
    let wanted = q.stream.as_deref().map(str::trim).unwrap_or("");
    if wanted.is_empty() {
        return text(StatusCode::BAD_REQUEST, "type a stream id into the search box");
    }
    let stream = match StreamId::new(wanted) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    match stream_body(&m, &stream).await {
        Ok(b) => html(StatusCode::OK, page(&m.app, &format!("Stream {stream}"), &b)),
        Err(e) => fail(&e),
    }
}

async fn stream_body<J: CliJournal, P: CliStore>(
    m: &super::kit::Monitor<J, P>,
    stream: &StreamId,
) -> Result<String, Error> {
    let version = m.journal.stream_version(stream).await?;
    let head = m.journal.head(stream).await?;
    let mut b = String::new();
    if version == 0 && head.is_none() {
        let _ = write!(
            b,
            "<p id=\"no-stream\">No stream {} in the journal.</p>",
            esc(stream.as_str())
        );
        return Ok(b);
    }
    let _ = write!(
        b,
        "<p>Version <span id=\"version\">{version}</span> in the journal.</p>"
    );
    let mut checkpoints = Vec::new();
    for p in &m.projections {
        let cp = m.store.checkpoint(p.name(), stream).await?;
        checkpoints.push(vec![
            esc(p.name().as_str()),
            num(cp),
            if cp >= version {
                "<span class=\"ok\">up to date</span>".into()
            } else {
                format!("<span class=\"failed\">{} behind</span>", version - cp)
            },
        ]);
    }
    if !checkpoints.is_empty() {
        b.push_str("<h2>Projections</h2>");
        b.push_str(&table(
            "checkpoints",
            &["projection", "checkpoint", "state"],
            &checkpoints,
        ));
    }
    b.push_str("<h2>Outbox rows</h2>");
    match &head {
        None => b.push_str("<p>None: every event has been applied (rows are deleted once applied).</p>"),
        Some(head) => {
            let mut rows = Vec::new();
            let last = version.min(head.seq.get() + STREAM_ROWS - 1);
            for n in head.seq.get()..=last {
                let Some(r) = m.journal.row(stream, Seq::new(n)?).await? else {
                    continue;
                };
                rows.push(vec![
                    format!(
                        "<a href=\"/row?stream={}&amp;seq={n}\">{n}</a>",
                        esc(&url_encode(stream.as_str()))
                    ),
                    esc(r.event_type.as_str()),
                    format!("<span class=\"{0}\">{0}</span>", esc(&r.status.to_string())),
                    num(r.attempt_count),
                    esc(r.last_error.as_deref().unwrap_or("")),
                ]);
            }
            b.push_str(&table(
                "stream-rows",
                &["seq", "type", "status", "attempts", "last error"],
                &rows,
            ));
            if version > last {
                let _ = write!(
                    b,
                    "<p class=\"note\">The first {STREAM_ROWS} rows from the head only.</p>"
                );
            }
        }
    }
    let sinks = m.journal.sinks().await?;
    if !sinks.is_empty() {
        let mut rows = Vec::new();
        for s in &sinks {
            let state = m
                .journal
                .sink_states(&s.sink, std::slice::from_ref(stream))
                .await?;
            if let Some(st) = state.first() {
                rows.push(vec![
                    esc(s.sink.as_str()),
                    num(st.seq),
                    format!("<span class=\"{0}\">{0}</span>", esc(&st.status.to_string())),
                    esc(st.last_error.as_deref().unwrap_or("")),
                ]);
            }
        }
        b.push_str("<h2>Sinks</h2>");
        b.push_str(&table(
            "stream-sinks",
            &["sink", "delivered through", "status", "last error"],
            &rows,
        ));
    }
    Ok(b)
}

#[derive(Deserialize)]
pub(super) struct RowQuery {
    stream: Option<String>,
    seq: Option<String>,
}

/// `/row?stream=S&seq=N`: the row's state, its event (payload capped and
/// escaped, metadata) and the actions its state allows.
pub(super) async fn row_page<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    q: Result<Query<RowQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return text(StatusCode::BAD_REQUEST, "malformed query");
    };
    let stream = match q.stream.as_deref().map(StreamId::new) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return fail(&e),
        None => return text(StatusCode::BAD_REQUEST, "missing `stream`"),
    };
    let seq = match q.seq.as_deref().map(str::parse::<u64>) {
        Some(Ok(n)) => match Seq::new(n) {
            Ok(s) => s,
            Err(e) => return fail(&e),
        },
        _ => return text(StatusCode::BAD_REQUEST, "`seq` must be a positive whole number"),
    };
    let row = match m.journal.row(&stream, seq).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return text(
                StatusCode::NOT_FOUND,
                format!("no outbox row {stream}/{seq} (rows are deleted once applied)"),
            );
        }
        Err(e) => return fail(&e),
    };
    let event = match m.journal.load(&stream, seq).await {
        Ok(e) => Some(e),
        Err(Error::NotFound(_)) => None,
        Err(e) => return fail(&e),
    };
    let mut b = String::new();
    b.push_str(&table(
        "row",
        &["field", "value"],
        &[
            vec!["stream".into(), esc(row.stream.as_str())],
            vec!["seq".into(), num(row.seq)],
            vec!["type".into(), esc(row.event_type.as_str())],
            vec![
                "status".into(),
                format!("<span class=\"{0}\">{0}</span>", esc(&row.status.to_string())),
            ],
            vec!["attempts".into(), num(row.attempt_count)],
            vec![
                "first failure".into(),
                esc(&row
                    .first_failed_at
                    .map_or_else(|| "none".into(), |t| t.to_string())),
            ],
            vec![
                "next attempt".into(),
                esc(&if row.status == OutboxStatus::Dead {
                    "never (requeue it)".to_owned()
                } else {
                    row.next_attempt_at.to_string()
                }),
            ],
            vec!["last error".into(), esc(row.last_error.as_deref().unwrap_or(""))],
            vec!["updated".into(), esc(&row.updated_at.to_string())],
            vec![
                "applied alone".into(),
                (if row.alone {
                    "yes (a worker stopped during an attempt on it)"
                } else {
                    "no"
                })
                .into(),
            ],
        ],
    ));
    b.push_str(
        "<p class=\"note\">The attempt count and the last error are what the store keeps: every \
         failure counts one attempt and replaces the error.</p>",
    );
    if m.door.acts() {
        let fields = [("stream", row.stream.to_string()), ("seq", row.seq.to_string())];
        match row.status {
            OutboxStatus::Dead => b.push_str(&action_form("/actions/requeue", &fields, "Requeue")),
            OutboxStatus::Failed | OutboxStatus::Pending => {
                b.push_str(&action_form("/actions/retry", &fields, "Retry now"));
            }
            OutboxStatus::Processing => {}
        }
    }
    if row.status == OutboxStatus::Dead {
        // The row's error group, so an operator who found one dead row
        // (by the search box, a link) can requeue every row that died the
        // same way once the cause is fixed, a dry run first.
        let shape = error_shape(&row);
        let _ = write!(
            b,
            "<p id=\"error-group\">Its error group: <code>{}</code> (all of them: \
             <a href=\"/dead\">dead rows by error</a>)</p>",
            esc(&shape)
        );
        if m.door.acts() {
            b.push_str(&action_form(
                "/actions/requeue-group",
                &[("id", group_id(&shape)), ("dry_run", "1".into())],
                "Requeue its error group (dry run first)",
            ));
        }
    }
    b.push_str("<h2>Event</h2>");
    match event {
        None => b.push_str("<p>The journal has no such event.</p>"),
        Some(e) => {
            b.push_str(&table(
                "event",
                &["field", "value"],
                &[
                    vec!["global position".into(), num(e.global_position)],
                    vec!["intent".into(), esc(&format!("{:?}", e.intent))],
                    vec!["recorded".into(), esc(&e.metadata.recorded_at.to_string())],
                    vec![
                        "correlation id".into(),
                        esc(e.metadata.correlation_id.as_deref().unwrap_or("")),
                    ],
                    vec![
                        "causation id".into(),
                        esc(e.metadata.causation_id.as_deref().unwrap_or("")),
                    ],
                    vec!["payload bytes".into(), num(e.payload.len())],
                ],
            ));
            let shown = &e.payload[..e.payload.len().min(PAYLOAD_SHOWN)];
            let body = match std::str::from_utf8(shown) {
                Ok(t) => esc(t),
                // Cut inside a character, or binary: hex.
                Err(_) => shown
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            };
            let _ = write!(b, "<pre id=\"payload\">{body}</pre>");
            if e.payload.len() > PAYLOAD_SHOWN {
                let _ = write!(
                    b,
                    "<p class=\"note\">First {PAYLOAD_SHOWN} of {} bytes.</p>",
                    e.payload.len()
                );
            }
        }
    }
    html(
        StatusCode::OK,
        page(&m.app, &format!("Row {}/{}", row.stream, row.seq), &b),
    )
}

/// The group of a dead row's error: its text with the row's own stream
/// id and every run of digits replaced, so "cursed die on campaign-066/51"
/// and "cursed die on campaign-070/3" are one group.
fn error_shape(row: &OutboxRow) -> String {
    let text = row.last_error.as_deref().unwrap_or("(no error recorded)");
    let text = text.replace(row.stream.as_str(), "{stream}");
    let mut out = String::with_capacity(text.len());
    let mut in_digits = false;
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

/// A group's id in forms: the first 16 hex digits of its shape's SHA-256.
fn group_id(shape: &str) -> String {
    Sha256::digest(shape.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The dead rows (up to [`DEAD_READ`]) by error shape, each group in
/// (stream, seq) order; and whether every dead row was read.
async fn dead_groups<J: CliJournal>(journal: &J) -> Result<(BTreeMap<String, Vec<OutboxRow>>, bool), Error> {
    let rows = journal.list(Some(OutboxStatus::Dead), DEAD_READ).await?;
    let complete = rows.len() < DEAD_READ;
    let mut groups: BTreeMap<String, Vec<OutboxRow>> = BTreeMap::new();
    for r in rows {
        groups.entry(error_shape(&r)).or_default().push(r);
    }
    for g in groups.values_mut() {
        g.sort_by(|a, b| (a.stream.as_str(), a.seq).cmp(&(b.stream.as_str(), b.seq)));
    }
    Ok((groups, complete))
}

/// `/dead`: the dead rows grouped by their error, largest group first,
/// each with a few of its rows and a requeue of the group.
pub(super) async fn dead_page<J: CliJournal, P: CliStore>(State(m): St<J, P>) -> Response {
    let (groups, complete) = match dead_groups(&m.journal).await {
        Ok(g) => g,
        Err(e) => return fail(&e),
    };
    let mut b = String::new();
    if groups.is_empty() {
        b.push_str("<p id=\"no-dead\" class=\"ok\">No dead row.</p>");
    }
    let mut ordered: Vec<(&String, &Vec<OutboxRow>)> = groups.iter().collect();
    ordered.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(b.0)));
    let rows: Vec<Vec<String>> = ordered
        .iter()
        .map(|(shape, rows)| {
            let examples: Vec<String> = rows
                .iter()
                .take(5)
                .map(|r| {
                    format!(
                        "<a href=\"/row?stream={}&amp;seq={}\">{}/{}</a>",
                        esc(&url_encode(r.stream.as_str())),
                        r.seq,
                        esc(r.stream.as_str()),
                        r.seq
                    )
                })
                .collect();
            let action = if m.door.acts() {
                action_form(
                    "/actions/requeue-group",
                    &[("id", group_id(shape)), ("dry_run", "1".into())],
                    "Requeue this group (dry run first)",
                )
            } else {
                String::new()
            };
            vec![
                num(rows.len()),
                format!("<code>{}</code>", esc(shape)),
                esc(rows[0].last_error.as_deref().unwrap_or("")),
                examples.join(", "),
                action,
            ]
        })
        .collect();
    if !rows.is_empty() {
        b.push_str(&table(
            "dead-groups",
            &[
                "rows",
                "error (ids and numbers as {stream} and #)",
                "example",
                "rows (first 5)",
                "action",
            ],
            &rows,
        ));
    }
    if !complete {
        let _ = write!(
            b,
            "<p class=\"note\">Grouped the first {DEAD_READ} dead rows only.</p>"
        );
    }
    html(StatusCode::OK, page(&m.app, "Dead rows by error", &b))
}

/// `/actions/requeue-group` (`id`, `dry_run`): with `dry_run` lists what
/// would be requeued and offers the real run; without it requeues the
/// group's rows in (stream, seq) order, at most [`GROUP_REQUEUE_CAP`].
pub(super) async fn requeue_group<J: CliJournal, P: CliStore>(
    State(m): St<J, P>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let (f, token) = match authorize(&m, peer, "requeue-group", &headers, form) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let Some(id) =
        f.id.as_deref()
            .filter(|i| i.len() == 16 && i.chars().all(|c| c.is_ascii_hexdigit()))
    else {
        let r = refuse(StatusCode::BAD_REQUEST, "`id` must be a group id (16 hex digits)");
        return bad_input(&m, (peer, &token), "requeue-group", r);
    };
    let dry_run = f.dry_run.as_deref().is_some_and(|v| v == "1");
    let (groups, _) = match dead_groups(&m.journal).await {
        Ok(g) => g,
        Err(e) => return fail(&e),
    };
    let Some((shape, rows)) = groups.iter().find(|(shape, _)| group_id(shape) == id) else {
        let r = refuse(
            StatusCode::NOT_FOUND,
            "no dead rows with that error (requeued already?)",
        );
        return bad_input(&m, (peer, &token), "requeue-group", r);
    };
    let take = &rows[..rows.len().min(GROUP_REQUEUE_CAP)];
    if dry_run {
        tracing::info!(target: "outbox::audit", %peer, token, action = "requeue-group", on = %id,
            "dry run: {} dead row(s) would be requeued", take.len());
        let listed: Vec<Vec<String>> = take
            .iter()
            .map(|r| vec![esc(r.stream.as_str()), num(r.seq), esc(r.event_type.as_str())])
            .collect();
        let mut b = format!(
            "<p class=\"msg\" id=\"result\">Dry run: {} dead row(s) with the error <code>{}</code> \
             would be requeued{}.</p>",
            take.len(),
            esc(shape),
            if rows.len() > take.len() {
                format!(" (the first {GROUP_REQUEUE_CAP} of {})", rows.len())
            } else {
                String::new()
            }
        );
        b.push_str(&action_form(
            "/actions/requeue-group",
            &[("id", id.to_owned()), ("dry_run", "0".into())],
            "Requeue them",
        ));
        b.push_str(&table("group-rows", &["stream", "seq", "type"], &listed));
        return html(StatusCode::OK, page(&m.app, "Requeue a group: dry run", &b));
    }
    let mut done = 0usize;
    let mut errors = Vec::new();
    for r in take {
        match m.journal.requeue(&r.stream, r.seq).await {
            Ok(_) => done += 1,
            // Requeued meanwhile (another operator, a worker after a requeue):
            // not this action's to redo.
            Err(Error::InvalidState(_) | Error::NotFound(_)) => {}
            Err(e) => {
                errors.push(e);
                break;
            }
        }
    }
    let result = match errors.pop() {
        Some(e) if done == 0 => Err(e),
        Some(e) => Ok(format!(
            "requeued {done} dead row(s) of the group, then stopped: {e}"
        )),
        None => Ok(format!(
            "requeued {done} dead row(s) with the error {shape} (attempts 0, due now)"
        )),
    };
    finish(
        &m,
        (peer, &token),
        "requeue-group",
        &format!("group {id} ({shape})"),
        result,
        "/dead",
    )
}

/// `s` percent-encoded for a query string.
pub(super) fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_group_by_their_shape() {
        let row = |stream: &str, error: &str| OutboxRow {
            stream: StreamId::new(stream).unwrap(),
            seq: Seq::new(4).unwrap(),
            event_type: outbox_core::EventType::new("t").unwrap(),
            status: OutboxStatus::Dead,
            attempt_count: 8,
            next_attempt_at: outbox_core::Timestamp::from_millis(0),
            last_error: Some(error.to_owned()),
            updated_at: outbox_core::Timestamp::from_millis(0),
            first_failed_at: None,
            alone: false,
        };
        let a = error_shape(&row("campaign-066", "cursed die on campaign-066/51: bug #42"));
        let b = error_shape(&row("campaign-070", "cursed die on campaign-070/3: bug #42"));
        assert_eq!(a, b);
        assert_eq!(a, "cursed die on {stream}/#: bug ##");
        assert_ne!(a, error_shape(&row("x", "timeout after 30s")));
        assert_eq!(group_id(&a).len(), 16);
        assert_eq!(url_encode("a b/ü"), "a%20b%2F%C3%BC");
    }
}
