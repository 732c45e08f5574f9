//! What the monitor's pages share: its state, refusals and one-line
//! answers, and the actions' authorization and audit (their own module, so
//! the fleet and row pages import them without importing the router).

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox_core::{Error, Projection, SinkSummary};
use serde::Deserialize;

use super::door::{self, Door};
use super::figures;
use super::html::{esc, page, table};
use crate::backend::CliStore;

/// The monitor's shared state.
pub(super) struct Monitor<J, P: CliStore> {
    pub(super) app: String,
    pub(super) journal: J,
    pub(super) store: P,
    pub(super) projections: Vec<Arc<dyn Projection<P::Tx>>>,
    pub(super) door: Arc<Door>,
    pub(super) limit: usize,
    pub(super) lag_streams: usize,
    /// Worker lag over this is shown as a problem in the health banner.
    pub(super) lag_threshold_ms: u64,
    /// The figures that cost a scan, kept by one background task
    /// ([`figures::keep`]); pages and `/metrics` only read them.
    pub(super) figures: Arc<figures::Figures>,
    /// The background task's cadence (shown with the figures).
    pub(super) figures_interval: std::time::Duration,
    /// Outbox rows up to which a page counts them itself (`--exact-rows`).
    pub(super) exact_rows: u64,
    /// On a journal opened read-only with no `-wal` beside it (read as
    /// immutable: a snapshot), that file: once it exists, a process writes
    /// the journal and the pages say the monitor does not see it.
    pub(super) snapshot_of: Option<std::path::PathBuf>,
}

pub(super) type St<J, P> = State<Arc<Monitor<J, P>>>;

/// A refused request: its status and one-line reason.
pub(super) struct Refusal(pub(super) StatusCode, pub(super) String);

impl IntoResponse for Refusal {
    /// One line; a 401 challenges Bearer (actions take no Basic).
    fn into_response(self) -> Response {
        let mut r = text(self.0, self.1);
        if self.0 == StatusCode::UNAUTHORIZED {
            door::challenge(&mut r, false);
        }
        r
    }
}

pub(super) fn refuse(status: StatusCode, msg: impl Into<String>) -> Refusal {
    Refusal(status, msg.into())
}

/// A one-line plain-text answer.
pub(super) fn text(status: StatusCode, msg: impl Into<String>) -> Response {
    let mut line = msg.into().replace('\n', " ");
    line.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        line,
    )
        .into_response()
}

pub(super) fn html(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// The status of a port error: not found 404, wrong state 409, bad input
/// 400, anything else 500. One line, no secret (adapters never put a URL in
/// their messages).
pub(super) fn fail(e: &Error) -> Response {
    refusal(e).into_response()
}

pub(super) fn refusal(e: &Error) -> Refusal {
    let status = match e {
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::InvalidState(_) | Error::Conflict { .. } => StatusCode::CONFLICT,
        Error::InvalidInput(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    refuse(status, e.to_string())
}

pub(super) fn num(n: impl std::fmt::Display) -> String {
    format!("<span class=\"num\">{n}</span>")
}

/// Each sink's delivery, and the events a long-open transaction holds back
/// from every sink (ADR 0030): nothing is lost, but nothing committed after
/// that transaction began is published until it ends.
pub(super) fn sinks_section(sinks: &[SinkSummary]) -> String {
    let mut b = String::from("<h2>Sinks</h2>");
    if sinks.is_empty() {
        b.push_str("<p>No sink has delivered anything yet.</p>");
        return b;
    }
    let rows: Vec<Vec<String>> = sinks
        .iter()
        .map(|s| {
            vec![
                esc(s.sink.as_str()),
                num(s.streams),
                format!("<span class=\"failed\">{}</span>", s.failed),
                format!("<span class=\"dead\">{}</span>", s.dead),
                num(s.position),
            ]
        })
        .collect();
    b.push_str(&table(
        "sinks",
        &["sink", "streams", "failing", "dead", "scanned through"],
        &rows,
    ));
    // The count is the same for every sink: the feed is the journal's.
    let held = SinkSummary::held_back_of(sinks);
    if held > 0 {
        let _ = write!(
            b,
            "<p class=\"failed\" id=\"sinks-held-back\" data-events=\"{held}\">Held back: {}{} \
             committed event(s) wait for an older transaction still open on the database server; \
             every sink publishes them once it ends (see the runbook, \"Sinks\").</p>",
            num(held),
            if held >= SinkSummary::HELD_BACK_CAP {
                "+"
            } else {
                ""
            }
        );
    }
    b
}

/// Every action's form fields (each action reads the ones it needs).
#[derive(Deserialize)]
pub(super) struct ActionForm {
    pub(super) token: Option<String>,
    pub(super) stream: Option<String>,
    pub(super) seq: Option<String>,
    pub(super) limit: Option<String>,
    pub(super) id: Option<String>,
    pub(super) dry_run: Option<String>,
    pub(super) sink: Option<String>,
}

/// Checks an action request: a token is configured, the request is not
/// cross-origin, the form parsed, the address is not locked out, and the
/// token matches (in constant time). `Ok` has the form and the token's id;
/// `Err` is the refusal (logged on the audit target); nothing has been read
/// or changed.
pub(super) fn authorize<J, P: CliStore>(
    m: &Monitor<J, P>,
    peer: SocketAddr,
    action: &str,
    headers: &HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Result<(ActionForm, String), Refusal> {
    let refused = |(status, why): (StatusCode, String)| Refusal(status, why);
    if !m.door.acts() {
        return Err(refused(m.door.check_action(peer, action, None).unwrap_err()));
    }
    if let Some(why) = cross_origin(headers) {
        return Err(refused(m.door.refused(
            peer,
            action,
            StatusCode::FORBIDDEN,
            &format!("cross-origin request refused ({why})"),
        )));
    }
    let form = match form {
        Ok(Form(f)) => f,
        Err(e) => {
            let (status, why) = match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body too large (limit {BODY_LIMIT} bytes)"),
                ),
                StatusCode::UNSUPPORTED_MEDIA_TYPE => (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "actions take an application/x-www-form-urlencoded body".to_owned(),
                ),
                _ => (StatusCode::BAD_REQUEST, "malformed form body".to_owned()),
            };
            return Err(refused(m.door.refused(peer, action, status, &why)));
        }
    };
    let given = door::bearer(headers).or(form.token.as_deref().filter(|t| !t.is_empty()));
    let token = m.door.check_action(peer, action, given).map_err(refused)?;
    Ok((form, token))
}

/// Logs an action's outcome on the audit target (who, what, on what,
/// result) and answers with it.
pub(super) fn finish<J, P: CliStore>(
    m: &Monitor<J, P>,
    who: (SocketAddr, &str),
    action: &str,
    on: &str,
    result: Result<String, Error>,
    back: &str,
) -> Response {
    let (peer, token) = who;
    let on = crate::output::visible(on);
    let (outcome, response) = match result {
        Ok(what) => {
            tracing::info!(target: "outbox::audit", %peer, token, action, on = %on, "done: {}", crate::output::visible(&what));
            (format!("done: {what}"), done(m, &what, back))
        }
        Err(e) => {
            tracing::warn!(target: "outbox::audit", %peer, token, action, on = %on, "failed: {}", crate::output::visible(&e.to_string()));
            (format!("failed: {e}"), fail(&e))
        }
    };
    m.door.record(door::AuditEntry {
        at: door::now(),
        peer,
        token: Some(token.to_owned()),
        action: action.to_owned(),
        on: on.into_owned(),
        result: outcome,
    });
    response
}

/// An authorized action refused for its input (a missing or malformed
/// field, nothing to act on): logged on the audit target with the token's
/// id, kept for the audit page, answered with its one line.
pub(super) fn bad_input<J, P: CliStore>(
    m: &Monitor<J, P>,
    who: (SocketAddr, &str),
    action: &str,
    refusal: Refusal,
) -> Response {
    let (peer, token) = who;
    let Refusal(status, why) = &refusal;
    tracing::warn!(target: "outbox::audit", %peer, token, action, status = status.as_u16(),
        "refused: {}", crate::output::visible(why));
    m.door.record(door::AuditEntry {
        at: door::now(),
        peer,
        token: Some(token.to_owned()),
        action: action.to_owned(),
        on: String::new(),
        result: format!("refused ({}): {why}", status.as_u16()),
    });
    refusal.into_response()
}

/// The value of an action's input check, or the audited refusal
/// ([`bad_input`]) returned from the handler.
macro_rules! checked {
    ($m:expr, $who:expr, $action:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(r) => return bad_input(&$m, $who, $action, r),
        }
    };
}
pub(crate) use checked;

pub(super) fn field<'a>(v: &'a Option<String>, name: &str) -> Result<&'a str, Refusal> {
    match v.as_deref().map(str::trim) {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(refuse(
            StatusCode::BAD_REQUEST,
            format!("missing form field `{name}`"),
        )),
    }
}

pub(super) fn number(v: &Option<String>, name: &str) -> Result<u64, Refusal> {
    let s = field(v, name)?;
    s.parse::<u64>().map_err(|_| {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("`{name}` must be a positive whole number, not {s:?}"),
        )
    })
}

/// The largest request body accepted (forms are a few hundred bytes).
pub(crate) const BODY_LIMIT: usize = 8 * 1024;

/// Why a request is cross-origin, if it is: an `Origin` other than this
/// host, or `Sec-Fetch-Site` other than same-origin or none.
pub(super) fn cross_origin(headers: &HeaderMap) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!("Sec-Fetch-Site: {site}"));
    }
    let origin = headers.get(header::ORIGIN)?;
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = origin.to_str().unwrap_or("");
    let same = host.is_some_and(|h| origin == format!("http://{h}") || origin == format!("https://{h}"));
    (!same).then(|| "Origin does not match Host".to_string())
}

/// The page an action answers with: what was done and a link back.
pub(super) fn done<J, P: CliStore>(m: &Monitor<J, P>, what: &str, back: &str) -> Response {
    html(
        StatusCode::OK,
        page(
            &m.app,
            "Done",
            &format!(
                "<p class=\"msg\" id=\"result\">{}</p><p><a href=\"{}\">Back</a></p>",
                esc(what),
                esc(back)
            ),
        ),
    )
}

/// The sinks' summaries among the consumer summaries the journal keeps
/// (the projections' exceptions are shown apart, ADR 0032).
pub(super) fn only_sinks(all: Vec<SinkSummary>) -> Vec<SinkSummary> {
    all.into_iter()
        .filter(|s| outbox_core::consumer_projection(&s.sink).is_none())
        .collect()
}
