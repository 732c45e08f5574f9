//! `outbox serve` and `outbox work --metrics-addr` over HTTP: the real
//! binary on real SQLite files, requests over a socket. Bad requests get a
//! clear 4xx and change nothing; the read-only monitor refuses every action;
//! `/metrics` parses strictly and its gauges follow the backlog as it drains
//! (the drain is driven in steps with `work --once`: no timing involved).

mod support;

use std::time::Duration;

use support::{Server, Site, TOKEN, eventually, scrape};

const SERVE: &[&str] = &["serve", "--addr", "127.0.0.1:0"];
const LISTENING: &str = "serving the";

fn with_token() -> [(&'static str, &'static str); 1] {
    [("OUTBOX_SERVE_TOKEN", TOKEN)]
}

/// The cursed campaign `c-bad` (dead at seq 4, three rows behind) and two clean ones.
fn site_with_dead() -> Site {
    let site = Site::migrated();
    site.seed_with_dead(&[("c-bad", true), ("c-ok1", false), ("c-ok2", false)]);
    site
}

#[test]
fn pages_render_with_security_headers_and_escaped_values() {
    let site = site_with_dead();
    let server = Server::start(&site, SERVE, &[], LISTENING);
    for path in ["/", "/blocked", "/runs", "/runs?digests=1", "/style.css"] {
        let r = server.get(path);
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.headers["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(r.headers["x-frame-options"], "DENY", "{path}");
        assert_eq!(r.headers["referrer-policy"], "same-origin", "{path}");
        assert!(
            r.headers["content-security-policy"].starts_with("default-src 'self'"),
            "{path}"
        );
        assert!(!r.body.contains("<script"), "{path}: no script");
        assert!(
            !r.body.contains(&site.journal.display().to_string()) || path == "/",
            "{path}"
        );
    }
    let overview = server.get("/").body;
    assert!(
        overview.contains("<span id=\"count-dead\" class=\"dead\">1</span>"),
        "{overview}"
    );
    assert!(
        overview.contains("<span id=\"count-pending\">3</span>"),
        "{overview}"
    );
    let blocked = server.get("/blocked").body;
    assert!(blocked.contains("c-bad"), "{blocked}");
    assert!(!blocked.contains("c-ok1"), "{blocked}");
    // The blocked page and `report --blocked --json` agree.
    let json = site.json(&["report", "--blocked", "--json"]);
    let streams = json["streams"].as_array().expect("streams");
    assert_eq!(streams.len(), 1, "{json}");
    assert_eq!(streams[0]["stream"], "c-bad");
    assert_eq!(streams[0]["seq"], 4);
    assert_eq!(streams[0]["status"], "dead");
    assert_eq!(streams[0]["waiting_behind"], 3);
    assert!(streams[0]["last_error"].as_str().is_some_and(|e| !e.is_empty()));
    let text = site.ok(&["report", "--blocked"]);
    assert!(
        text.contains("c-bad/4") && text.contains("3 row(s) waiting behind"),
        "{text}"
    );
    // Digests on the runs page are the report's: the full ones on request,
    // the running ones always (no scan).
    let report = site.json(&["report", "--json", "--limit", "0"]);
    let store = report["digests"]["store"].as_str().expect("store digest");
    assert!(server.get("/runs?digests=1").body.contains(store));
    let runs = server.get("/runs").body;
    let running = report["running_digests"].as_array().expect("running digests");
    assert!(!running.is_empty(), "{report}");
    for d in running {
        let digest = d["digest"].as_str().expect("a tracked digest");
        assert!(
            runs.contains(&format!("<code>{digest}</code>")),
            "{digest} on the runs page: {runs}"
        );
    }
    assert_eq!(server.stop().code(), Some(0), "SIGTERM stops the monitor cleanly");
}

#[test]
fn stream_names_and_errors_are_escaped() {
    let site = Site::migrated();
    let evil = "c<script>alert('x')</script>&\"";
    site.seed_with_dead(&[(evil, true)]);
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let page = server.get("/blocked").body;
    assert!(!page.contains("<script"), "{page}");
    assert!(
        page.contains("c&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"),
        "{page}"
    );
    // The requeue form carries the name back exactly.
    let r = server.post(
        "/actions/requeue",
        "stream=c%3Cscript%3Ealert(%27x%27)%3C%2Fscript%3E%26%22&seq=4",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(!r.body.contains("<script"), "{r:?}");
}

/// Look-alike stream ids and terminal escapes in an application's error
/// text are shown as their codes, in the monitor and in every CLI output;
/// the monitor's forms still carry the exact id back.
#[test]
fn look_alikes_and_control_characters_are_shown_as_their_codes() {
    let site = Site::migrated();
    let hidden = "campaign-00\u{200b}1";
    let reversed = "campaign-\u{202e}xod";
    site.seed_with_dead(&[(hidden, true), (reversed, true)]);
    // An application's error text with a terminal escape: retitle the
    // window and clear the screen.
    let escape = "bad\u{1b}]0;owned\u{7}\u{1b}[2J\u{9b}31m";
    {
        let c = outbox_sqlite::rusqlite::Connection::open(&site.journal).unwrap();
        let done = c
            .execute(
                "UPDATE outbox SET last_error = ?1 WHERE stream = ?2 AND status = 'dead'",
                [escape, reversed],
            )
            .unwrap();
        assert_eq!(done, 1);
    }
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let page = server.get("/blocked").body;
    // What the page shows: everything but the forms' hidden fields.
    let mut parts = page.split("<input");
    let mut shown = parts.next().unwrap_or_default().to_owned();
    for part in parts {
        shown.push_str(part.split_once('>').map_or(part, |(_, rest)| rest));
    }
    for raw in ['\u{200b}', '\u{202e}', '\u{1b}', '\u{7}', '\u{9b}'] {
        assert!(!shown.contains(raw), "{raw:?} is shown on the page: {page}");
    }
    assert!(page.contains("campaign-00\\u200B1"), "{page}");
    assert!(page.contains("campaign-\\u202Exod"), "{page}");
    assert!(
        page.contains("bad\\u001B]0;owned\\u0007\\u001B[2J\\u009B31m"),
        "{page}"
    );
    // The form sends the stored id back: the requeue finds the row.
    let r = server.post(
        "/actions/requeue",
        "stream=campaign-00%E2%80%8B1&seq=4",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(page.contains("value=\"campaign-00\u{200b}1\""), "{page}");
    drop(server);
    for args in [
        &["row", "--stream", reversed, "--seq", "4"][..],
        &["report", "--blocked"],
        &["report", "--blocked", "--json"],
        &["report"],
    ] {
        let out = site.ok(args);
        for raw in ['\u{200b}', '\u{202e}', '\u{1b}', '\u{7}', '\u{9b}'] {
            assert!(!out.contains(raw), "{args:?} prints {raw:?}: {out}");
        }
    }
    let row = site.ok(&["row", "--stream", reversed, "--seq", "4"]);
    assert!(row.contains("campaign-\\u202Exod"), "{row}");
    assert!(row.contains("bad\\u001B]0;owned\\u0007\\u001B[2J"), "{row}");
    // JSON output stays JSON and reads back the stored text.
    let json = site.json(&["report", "--blocked", "--json"]);
    let streams = json["streams"].as_array().expect("streams");
    assert!(streams.iter().any(|s| s["stream"] == reversed), "{json}");
}

#[test]
fn the_read_only_monitor_refuses_every_action_and_changes_nothing() {
    let site = site_with_dead();
    let before = site.report();
    let server = Server::start(&site, SERVE, &[], LISTENING);
    assert!(server.get("/").body.contains("id=\"read-only\""));
    for path in ["/", "/blocked", "/dead", "/sinks", "/row?stream=c-bad&seq=4"] {
        assert!(
            !server.get(path).body.contains("method=\"post\""),
            "no action form without a token: {path}"
        );
    }
    for (path, body) in [
        ("/actions/requeue", format!("stream=c-bad&seq=4&token={TOKEN}")),
        ("/actions/retry", format!("stream=c-bad&seq=5&token={TOKEN}")),
        ("/actions/requeue-dead", format!("limit=10&token={TOKEN}")),
        ("/actions/cancel-run", format!("id=1&token={TOKEN}")),
    ] {
        let auth = format!("Bearer {TOKEN}");
        let r = server.post(path, &body, &[("Authorization", &auth)]);
        assert_eq!(r.status, 403, "{path}: {r:?}");
        assert!(
            r.body.contains("read-only") && r.body.lines().count() == 1,
            "{path}: {r:?}"
        );
    }
    drop(server);
    assert_eq!(site.report()["rows"], before["rows"], "nothing changed");
}

#[test]
fn bad_requests_get_a_clear_4xx_and_change_nothing() {
    let site = site_with_dead();
    let before = site.report();
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let auth = format!("Bearer {TOKEN}");
    let big = format!("stream=c-bad&seq=4&pad={}", "x".repeat(9 * 1024));
    // (path, body, headers, status, what the one-line answer says)
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, u16, &'a str);
    let cases: Vec<Case<'_>> = vec![
        (
            "/actions/requeue",
            "stream=c-bad&seq=4".into(),
            vec![],
            401,
            "needs the operator token",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=4&token=".into(),
            vec![],
            401,
            "needs the operator token",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=4&token=wrong-token-000000".into(),
            vec![],
            403,
            "wrong operator token",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=4".into(),
            vec![("Authorization", "Bearer nope")],
            403,
            "wrong operator token",
        ),
        (
            "/actions/requeue",
            format!("stream=c-bad&seq=4&token={TOKEN}"),
            vec![("Origin", "http://evil.example")],
            403,
            "cross-origin",
        ),
        (
            "/actions/requeue",
            format!("stream=c-bad&seq=4&token={TOKEN}"),
            vec![("Sec-Fetch-Site", "cross-site")],
            403,
            "cross-origin",
        ),
        (
            "/actions/requeue",
            "stream=no-such-stream&seq=4".into(),
            vec![("Authorization", &auth)],
            404,
            "no-such-stream",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=abc".into(),
            vec![("Authorization", &auth)],
            400,
            "positive whole number",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=0".into(),
            vec![("Authorization", &auth)],
            400,
            "out of range",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=-1".into(),
            vec![("Authorization", &auth)],
            400,
            "positive whole number",
        ),
        (
            "/actions/requeue",
            "seq=4".into(),
            vec![("Authorization", &auth)],
            400,
            "missing form field `stream`",
        ),
        (
            "/actions/requeue",
            "stream=c-bad&seq=5".into(),
            vec![("Authorization", &auth)],
            409,
            "not dead",
        ),
        (
            "/actions/retry",
            "stream=c-bad&seq=4".into(),
            vec![("Authorization", &auth)],
            409,
            "requeue",
        ),
        (
            "/actions/retry",
            "stream=c-bad&seq=99".into(),
            vec![("Authorization", &auth)],
            404,
            "c-bad",
        ),
        (
            "/actions/requeue-dead",
            "limit=0".into(),
            vec![("Authorization", &auth)],
            400,
            "between 1 and 10000",
        ),
        (
            "/actions/requeue-dead",
            "limit=many".into(),
            vec![("Authorization", &auth)],
            400,
            "positive whole number",
        ),
        (
            "/actions/cancel-run",
            "id=12345".into(),
            vec![("Authorization", &auth)],
            404,
            "12345",
        ),
        (
            "/actions/requeue",
            big,
            vec![("Authorization", &auth)],
            413,
            "too large",
        ),
    ];
    for (path, body, headers, status, says) in &cases {
        let r = server.post(path, body, headers);
        assert_eq!(r.status, *status, "{path} {body:.60} {headers:?}: {r:?}");
        assert_eq!(r.body.lines().count(), 1, "one line: {r:?}");
        assert!(
            r.body.contains(says),
            "{path} {body:.60}: {:?} does not say {says:?}",
            r.body
        );
        assert!(!r.body.contains(TOKEN), "the token is never echoed");
    }
    // Not a form, not a page, not a POST.
    let r = support::http(
        &server.addr,
        "POST",
        "/actions/requeue",
        &[("Content-Type", "application/json"), ("Authorization", &auth)],
        b"{\"stream\":\"c-bad\",\"seq\":4}",
    );
    assert_eq!(r.status, 415, "{r:?}");
    assert_eq!(server.get("/nope").status, 404);
    assert_eq!(server.get("/runs?digests=maybe").status, 400);
    assert_eq!(server.get("/actions/requeue").status, 405);
    assert_eq!(
        site.report()["rows"],
        before["rows"],
        "no bad request changed anything"
    );

    // The same request, well formed and authorized, requeues the row.
    let r = server.post(
        "/actions/requeue",
        "stream=c-bad&seq=4",
        &[("Authorization", &auth)],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("requeued c-bad/4"), "{r:?}");
    assert_eq!(site.counts(), [4, 0, 0, 0]);
    site.ok(&["work", "--once"]);
    assert_eq!(
        site.counts(),
        [0, 0, 0, 0],
        "the requeued row and those behind it applied"
    );
}

#[test]
fn actions_with_the_token_requeue_dead_retry_and_cancel() {
    let auth = format!("Bearer {TOKEN}");
    let h = [("Authorization", auth.as_str())];

    // Requeue every dead row (the overview's button), then a pass applies them.
    let site = Site::migrated();
    site.seed_with_dead(&[("d-1", true), ("d-2", true), ("d-3", false)]);
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let overview = server.get("/").body;
    assert!(
        overview.contains("action=\"/actions/requeue-dead\""),
        "{overview}"
    );
    assert!(overview.contains("name=\"limit\" value=\"2\""), "{overview}");
    assert!(!overview.contains(TOKEN), "the token is never rendered");
    let r = server.post("/actions/requeue-dead", "limit=2", &h);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("requeued 2 dead row(s)"), "{r:?}");
    assert_eq!(site.counts(), [8, 0, 0, 0]);
    site.ok(&["work", "--once"]);
    assert_eq!(site.counts(), [0, 0, 0, 0]);
    drop(server);

    // Retry a failed row now: it keeps its attempts and is due at once.
    let site = Site::migrated();
    site.seed_with_failed(&[("f-1", true), ("f-2", false)]);
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let blocked = server.get("/blocked").body;
    assert!(blocked.contains("action=\"/actions/retry\""), "{blocked}");
    let json = site.json(&["report", "--blocked", "--json"]);
    assert_eq!(json["streams"][0]["status"], "failed", "{json}");
    assert!(json["streams"][0]["next_attempt_at"].is_string(), "{json}");
    site.ok(&["work", "--once"]);
    assert_eq!(site.counts(), [3, 0, 1, 0], "not due for an hour: nothing moves");
    let r = server.post("/actions/retry", "stream=f-1&seq=4", &h);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains("retrying f-1/4") && r.body.contains("attempts 1 kept"),
        "{r:?}"
    );
    site.ok(&["work", "--once"]);
    assert_eq!(
        site.counts(),
        [0, 0, 0, 0],
        "the retried row and those behind it applied"
    );
    drop(server);

    // Cancel an active run.
    let site = Site::migrated();
    let id = site.active_run();
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let runs = server.get("/runs").body;
    assert!(runs.contains("action=\"/actions/cancel-run\""), "{runs}");
    let r = server.post("/actions/cancel-run", &format!("id={id}"), &h);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains(&format!("cancel requested for run {id}")),
        "{r:?}"
    );
    // A run that has not started yet stops at once.
    let shown = site.json(&["runs", "show", &id.to_string(), "--json"]);
    assert_eq!(shown[0]["state"], "cancelled", "{shown}");
    assert!(
        !server
            .get("/runs")
            .body
            .contains("action=\"/actions/cancel-run\"")
    );
}

#[test]
fn a_non_loopback_bind_without_a_token_and_a_short_token_are_refused_at_start_up() {
    let site = Site::migrated();
    for (args, env, says) in [
        (
            vec!["serve", "--addr", "0.0.0.0:0"],
            vec![],
            "refusing to serve the monitor on non-loopback address 0.0.0.0:0",
        ),
        (
            vec!["work", "--metrics-addr", "0.0.0.0:0"],
            vec![],
            "refusing to serve metrics on non-loopback address",
        ),
        (
            vec!["serve", "--addr", "127.0.0.1:0"],
            vec![("OUTBOX_SERVE_TOKEN", "short")],
            "at least 16 characters",
        ),
        (
            vec!["serve", "--addr", "0.0.0.0:0"],
            vec![("OUTBOX_SERVE_TOKEN", "xxxxxxxxxxxxxxxx")],
            "OUTBOX_SERVE_TOKEN looks guessable",
        ),
        (
            vec!["work", "--metrics-addr", "0.0.0.0:0"],
            vec![("OUTBOX_SERVE_READ_TOKEN", "passwordpassword")],
            "OUTBOX_SERVE_READ_TOKEN looks guessable",
        ),
    ] {
        let (code, out, err) = site.run_env(&args, &env);
        assert_eq!(code, Some(2), "{args:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
        for (_, token) in &env {
            assert!(!err.contains(token), "the token is never echoed: {err}");
        }
        assert!(out.is_empty());
    }
}

#[test]
fn metrics_gauges_follow_the_backlog_as_it_drains() {
    let site = Site::migrated();
    let names: Vec<String> = (0..6).map(|i| format!("m-{i}")).collect();
    let campaigns: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), false)).collect();
    site.seed_backlog(&campaigns);
    // The projection lag is computed before the monitor listens, then by
    // its task every 100 ms; the rows by status are read per scrape.
    let server = Server::start(
        &site,
        &[SERVE, &["--figures-interval-ms", "100"]].concat(),
        &[],
        LISTENING,
    );
    let pending = |m: &std::collections::BTreeMap<String, f64>| m["outbox_rows{status=\"pending\"}"];
    let computations =
        |m: &std::collections::BTreeMap<String, f64>| m["outbox_monitor_figures_computations_total"];
    let behind = |m: &std::collections::BTreeMap<String, f64>| m["outbox_projection_events_behind{projection=\"roster\"}"];
    let first = scrape(&server);
    assert_eq!(pending(&first), 42.0, "{first:?}");
    assert_eq!(behind(&first), 42.0, "{first:?}");
    assert_eq!(first["outbox_rows{status=\"dead\"}"], 0.0);
    assert_eq!(first["outbox_projection_lag_complete"], 1.0);
    assert!(first["outbox_oldest_due_age_seconds"] >= 0.0);
    // Two streams per pass, one stream at a time (no sweep): 42 -> 28 -> 14
    // -> 0, one scrape after each.
    let mut seen = vec![pending(&first)];
    while *seen.last().unwrap() > 0.0 {
        assert!(seen.len() <= 4, "the drain must take three passes: {seen:?}");
        site.ok_env(
            &["work", "--once"],
            &[("OUTBOX_STREAMS_PER_PASS", "2"), ("OUTBOX_SWEEP_ROWS", "0")],
        );
        // Two computations ended after the pass: the second began after it
        // (the first may have been running during it). No outcome depends
        // on how long that takes.
        let before = computations(&scrape(&server));
        let mut m = scrape(&server);
        support::eventually("two computations of the figures after the pass", || {
            m = scrape(&server);
            computations(&m) >= before + 2.0
        });
        let [p, ..] = site.counts();
        assert_eq!(pending(&m), p as f64, "the gauge is the report's count");
        assert_eq!(
            behind(&m),
            pending(&m),
            "every pending event is an event the projection lacks"
        );
        seen.push(pending(&m));
    }
    assert_eq!(seen, [42.0, 28.0, 14.0, 0.0]);
    let last = scrape(&server);
    assert_eq!(last["outbox_oldest_due_age_seconds"], 0.0);
    assert!(last["outbox_monitor_figures_as_of_seconds"] > 0.0, "{last:?}");
    assert!(last["outbox_monitor_figures_duration_seconds"] >= 0.0, "{last:?}");
}

#[test]
fn work_metrics_addr_serves_the_workers_counters_and_the_gauges() {
    let site = Site::migrated();
    site.seed_backlog(&[("w-1", false), ("w-2", false), ("w-3", false)]);
    // No start-up repair: the worker's sweeps apply the backlog (and
    // observe its lag).
    let server = Server::start(
        &site,
        &["work", "--metrics-addr", "127.0.0.1:0"],
        &[("OUTBOX_REPAIR_ON_START", "false")],
        "metrics on http://",
    );
    let mut last = Default::default();
    // Drained: no row left at all (rows are deleted once their events are
    // applied; the counters and the lag are recorded before that).
    eventually("the worker to apply the backlog", || {
        last = scrape(&server);
        ["pending", "processing"]
            .iter()
            .all(|s| last.get(&format!("outbox_rows{{status=\"{s}\"}}")) == Some(&0.0))
    });
    // 21 events: 18 applied, the 3 chat messages audit-only.
    assert_eq!(
        (
            last["outbox_worker_applied_total"],
            last["outbox_worker_audit_only_total"]
        ),
        (18.0, 3.0),
        "{last:?}"
    );
    for counter in [
        "outbox_worker_failures_total",
        "outbox_worker_dead_lettered_total",
        "outbox_worker_contended_total",
        "outbox_worker_claims_total",
    ] {
        assert!(last.contains_key(counter), "{counter} missing: {last:?}");
    }
    assert_eq!(last["outbox_worker_dead_lettered_total"], 0.0);
    assert_eq!(last["outbox_worker_lease_takeovers_total"], 0.0, "{last:?}");
    // Every event of the drained runs (applied or audit-only) has its lag observed.
    assert_eq!(last["outbox_worker_lag_seconds_count"], 21.0, "{last:?}");
    assert_eq!(
        last["outbox_worker_lag_seconds_bucket{le=\"+Inf\"}"], 21.0,
        "{last:?}"
    );
    assert!(last["outbox_worker_lag_seconds_sum"] >= 0.0);
    // Every store call is counted by the runtime's store decorator: the
    // sweeps applied the backlog through `apply_runs`, none timed out.
    let applies = "{call=\"apply_runs\"}";
    assert!(
        last[&format!("outbox_worker_store_calls_total{applies}")] >= 1.0,
        "{last:?}"
    );
    assert_eq!(
        last[&format!("outbox_worker_store_call_timeouts_total{applies}")],
        0.0,
        "{last:?}"
    );
    assert!(
        last[&format!("outbox_worker_store_call_seconds_total{applies}")] > 0.0,
        "{last:?}"
    );
    assert_eq!(server.get("/").status, 404, "only /metrics");
    assert_eq!(
        server.stop().code(),
        Some(0),
        "SIGTERM stops the worker and its endpoint"
    );
}

/// The overview's throughput chart shows what workers did, from the
/// journal's per-minute activity: a library pass with a dead letter (the
/// tally's, on the cursed campaign) and a `work --once` pass of the binary
/// add up on the page, which lists the dead projection exception. A
/// stream held back by a dead row reports its first failure.
#[test]
fn the_throughput_chart_counts_what_the_workers_did() {
    let site = Site::migrated();
    let first = site.seed_with_dead_projection(&[("c-bad", true), ("c-ok", false)]);
    assert_eq!(first.dead_lettered, 1, "fixture");
    site.seed_backlog(&[("c-more", false)]);
    let out = site.ok(&["work", "--once", "--json"]);
    let tick: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON line");
    let count = |k: &str| tick[k].as_u64().unwrap_or_else(|| panic!("{k} in {tick}"));
    assert!(
        count("completed") > 0,
        "the second pass applied the new campaign: {tick}"
    );
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let overview = server.get("/").body;
    for (id, n) in [
        ("applied", first.completed_rows + count("completed")),
        ("failed", first.failed + count("failed")),
        ("dead", first.dead_lettered + count("dead_lettered")),
    ] {
        assert!(
            overview.contains(&format!("<span id=\"activity-{id}\" class=\"num\">{n}</span>")),
            "{id} = {n}: {overview}"
        );
    }
    assert!(overview.contains("<svg id=\"throughput\""), "{overview}");
    assert!(
        overview.contains("character_tally") && overview.contains("c-bad/4"),
        "the dead projection exception is listed: {overview}"
    );
    assert_eq!(server.stop().code(), Some(0));

    let site = Site::migrated();
    site.seed_with_dead(&[("c-bad", true), ("c-ok", false)]);
    let json = site.json(&["report", "--blocked", "--json"]);
    let blocked = &json["streams"][0];
    assert_eq!(blocked["stream"], "c-bad", "{json}");
    assert!(
        blocked["first_failure_at"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "the head's first failure is reported: {json}"
    );
    assert!(blocked["failing_for_ms"].is_u64(), "{json}");
}

/// The runs page shows a run's bounds and the global position it
/// committed through, as `outbox runs --json` reports them.
#[test]
fn the_runs_page_shows_run_bounds_cursors_and_generations() {
    let site = Site::migrated();
    site.seed_backlog(&[("campaign-a", false), ("campaign-b", false)]);
    let runs = site.json(&[
        "replay",
        "--projection",
        "campaign_summary",
        "--since",
        "10",
        "--json",
    ]);
    let run = &runs[0];
    let (id, position) = (
        run["id"].as_u64().expect("id"),
        run["position"].as_u64().expect("a committed position"),
    );
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let page = server.get("/runs").body;
    let row = page
        .split("<tr>")
        .find(|r| r.starts_with(&format!("<td><span class=\"num\">{id}</span></td>")))
        .unwrap_or_else(|| panic!("run {id} on the page: {page}"));
    assert!(row.contains("<td>campaign_summary</td>"), "{row}");
    assert!(row.contains("<td>10</td>"), "since 10: {row}");
    assert!(
        row.contains(&format!("<td>{position}</td>")),
        "position {position}: {row}"
    );
    assert!(page.contains("No projection has a second generation"), "{page}");
    assert_eq!(server.stop().code(), Some(0));

    // After a blue/green rebuild the page shows the live generation.
    site.json(&["rebuild", "--blue-green", "--projection", "roster", "--json"]);
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let page = server.get("/runs").body;
    let row = page
        .split("<tr>")
        .find(|r| r.starts_with("<td>roster</td>"))
        .unwrap_or_else(|| panic!("roster's generation record on the page: {page}"));
    assert!(row.contains("<td>g2 (roster@g2)</td>"), "{row}");
    assert!(row.contains("<span class=\"num\">1</span>"), "epoch 1: {row}");
    assert_eq!(server.stop().code(), Some(0));
}

/// A web page whose DNS name was rebound to 127.0.0.1 reaches the port but
/// not the monitor: its `Host` is not one the monitor answers to.
#[test]
fn a_rebound_host_name_gets_421_and_a_log_line() {
    let site = site_with_dead();
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    for path in ["/", "/blocked", "/metrics"] {
        let r = support::http(
            &server.addr,
            "GET",
            path,
            &[("Host", &format!("rebind.attacker.example:{port}"))],
            b"",
        );
        assert_eq!(r.status, 421, "{path}: {r:?}");
        assert!(!r.body.contains("c-bad"), "{r:?}");
        assert_eq!(r.body.lines().count(), 1, "{r:?}");
    }
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = support::http(&server.addr, "GET", "/", &[("Host", &host)], b"");
        assert_eq!(r.status, 200, "{host}: {r:?}");
    }
    eventually("the refusal logged", || {
        server.stderr().contains("rebind.attacker.example")
    });
}

/// Off loopback every page and `/metrics` need credentials: the read token
/// or the operator token, Bearer (any case) or Basic; the read token opens
/// no action; a 401 carries `WWW-Authenticate`.
#[test]
fn a_public_bind_needs_credentials_for_every_read() {
    const READ: &str = "read-token-9f8e7d6c5b4a3210";
    let site = site_with_dead();
    let server = Server::start(
        &site,
        &["serve", "--addr", "0.0.0.0:0"],
        &[("OUTBOX_SERVE_TOKEN", TOKEN), ("OUTBOX_SERVE_READ_TOKEN", READ)],
        LISTENING,
    );
    for path in ["/", "/blocked", "/runs", "/metrics", "/style.css"] {
        let r = server.get(path);
        assert_eq!(r.status, 401, "{path}: {r:?}");
        assert!(r.headers["www-authenticate"].starts_with("Basic realm="), "{r:?}");
        assert!(!r.body.contains("c-bad"), "{r:?}");
    }
    let basic = |password: &str| {
        // base64 of "ops:" + password, written out by hand (no dependency).
        let text = format!("ops:{password}");
        let table = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in text.as_bytes().chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(table[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        format!("Basic {out}")
    };
    for auth in [
        format!("Bearer {READ}"),
        format!("bearer {TOKEN}"),
        format!("BEARER {READ}"),
        basic(READ),
        basic(TOKEN),
    ] {
        for path in ["/", "/metrics"] {
            let r = support::http(&server.addr, "GET", path, &[("Authorization", &auth)], b"");
            assert_eq!(r.status, 200, "{auth} {path}: {r:?}");
        }
    }
    // The read token is no operator token.
    let r = server.post(
        "/actions/requeue",
        "stream=c-bad&seq=4",
        &[("Authorization", &format!("Bearer {READ}"))],
    );
    assert_eq!(r.status, 403, "{r:?}");
    // Basic never carries an action's token (a browser resends it alone).
    let r = server.post(
        "/actions/requeue",
        "stream=c-bad&seq=4",
        &[("Authorization", &basic(TOKEN))],
    );
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(site.counts()[3], 1, "the dead row is still dead");
    let r = server.post(
        "/actions/requeue",
        "stream=c-bad&seq=4",
        &[("Authorization", &format!("bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 200, "{r:?}");
}

/// Wrong tokens from one address lock it out: the right token then gets
/// 429 too, and every refusal and action is an audit line naming the
/// address and, for an action done, the token's id (never the token).
#[test]
fn guessing_the_token_locks_the_address_out_and_everything_is_audited() {
    let site = site_with_dead();
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let auth = format!("Bearer {TOKEN}");
    let r = server.post(
        "/actions/retry",
        "stream=c-bad&seq=5",
        &[("Authorization", &auth)],
    );
    assert_eq!(r.status, 200, "{r:?}");
    for i in 0..10 {
        let r = server.post(
            "/actions/requeue",
            &format!("stream=c-bad&seq=4&token=guess-{i:02}-abcdefghijklmnop"),
            &[],
        );
        assert_eq!(r.status, 403, "guess {i}: {r:?}");
    }
    let r = server.post(
        "/actions/requeue",
        "stream=c-bad&seq=4",
        &[("Authorization", &auth)],
    );
    assert_eq!(r.status, 429, "{r:?}");
    assert_eq!(site.counts()[3], 1, "nothing requeued");
    eventually("the audit lines", || {
        let log = server.stderr();
        log.matches("refused: wrong operator token").count() == 10
            && log.contains("refused: too many refused credentials")
            && log.contains("done: retrying c-bad/5")
    });
    let log = server.stderr();
    assert!(log.contains("127.0.0.1"), "{log}");
    assert!(
        !log.contains(TOKEN) && !log.contains("guess-0"),
        "no token in the log: {log}"
    );
    assert_eq!(server.stop().code(), Some(0));
}

/// Connections are bounded in number and idle ones make room for a real
/// request, a client that never finishes its head is cut off, a declared body over the limit is refused before it is
/// read, and the router's own error answers say what they are in a line.
#[test]
fn slow_clients_floods_and_bad_requests_are_bounded() {
    use std::io::{Read, Write};
    let site = site_with_dead();
    let server = Server::start(
        &site,
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--max-connections",
            "4",
            "--head-timeout-ms",
            "600000",
        ],
        &with_token(),
        LISTENING,
    );
    // Twenty idle connections (no timeout frees them: the head timeout is
    // ten minutes here), then a real request. The server accepts in
    // connect order, and each connection past the fourth closes the oldest
    // one that has not sent its request: never more than four are open,
    // and the real request is answered.
    let idle: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(&server.addr).unwrap())
        .collect();
    let r = server.get("/");
    assert_eq!(r.status, 200, "idle sockets do not keep a request out: {r:?}");
    for (i, mut s) in idle.into_iter().enumerate().take(17) {
        s.set_read_timeout(Some(support::PATIENCE)).unwrap();
        let mut got = Vec::new();
        // Closed without an answer (a reset counts: nothing was sent).
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty(), "idle #{i}: {}", String::from_utf8_lossy(&got));
    }
    eventually("the closing logged", || {
        server.stderr().contains("connection closed for a newer one")
    });
    drop(server);

    // A head that never ends is cut off.
    let server = Server::start(
        &site,
        &["serve", "--addr", "127.0.0.1:0", "--head-timeout-ms", "200"],
        &with_token(),
        LISTENING,
    );
    let mut slow = std::net::TcpStream::connect(&server.addr).unwrap();
    slow.set_read_timeout(Some(support::PATIENCE)).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .unwrap();
    let mut got = Vec::new();
    let read = slow.read_to_end(&mut got);
    assert!(read.is_ok(), "the server closes the connection: {read:?}");
    assert!(!String::from_utf8_lossy(&got).contains("200 OK"));

    // 50 MiB declared, nothing sent: refused from the header.
    let r = support::http(
        &server.addr,
        "POST",
        "/actions/requeue",
        &[
            ("Content-Length", "52428800"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        b"",
    );
    assert_eq!(r.status, 413, "{r:?}");
    assert_eq!(r.body.lines().count(), 1, "{r:?}");
    let r = server.get("/actions/requeue");
    assert_eq!(r.status, 405, "{r:?}");
    assert_eq!(r.body.trim(), "method not allowed", "{r:?}");
    let long = format!("/{}", "a".repeat(5000));
    let r = server.get(&long);
    assert_eq!(r.status, 414, "{r:?}");
    assert_eq!(r.body.lines().count(), 1, "{r:?}");
}

/// The headline tells caught-up workers from blocked streams: rows that
/// wait behind a dead row count in the oldest due age, not in the worker
/// lag; the health banner names what is wrong first (no worker, dead rows)
/// and says "Healthy" once a worker has drained the rest; the overview
/// reloads itself only when asked (`?refresh=N`).
#[test]
fn the_headline_tells_caught_up_workers_from_blocked_streams() {
    let site = site_with_dead();
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let page = server.get("/").body;
    assert!(page.contains("<p id=\"health\" class=\"banner bad\">"), "{page}");
    assert!(page.contains("no live worker is registered"), "{page}");
    assert!(page.contains("1 dead row(s) block their streams"), "{page}");
    // Nothing but the rows behind the dead one is queued: no worker lag.
    assert!(page.contains("<span id=\"worker-lag\" data-ms=\"0\">"), "{page}");
    assert!(page.contains("<span id=\"blocked-streams\">1</span>"), "{page}");
    assert!(!page.contains("http-equiv=\"refresh\""), "{page}");
    let refreshing = server.get("/?refresh=10").body;
    assert!(
        refreshing.contains("<meta http-equiv=\"refresh\" content=\"10\">"),
        "{refreshing}"
    );
    assert!(!server.get("/?refresh=1").body.contains("http-equiv"));
    let metrics = scrape(&server);
    assert_eq!(
        metrics["outbox_oldest_applicable_age_seconds"], 0.0,
        "{metrics:?}"
    );
    drop(server);

    let site = Site::migrated();
    site.seed_backlog(&[("h-1", false), ("h-2", false)]);
    let worker = Server::start(
        &site,
        &["work", "--metrics-addr", "127.0.0.1:0"],
        &[],
        "metrics on http://",
    );
    let server = Server::start(&site, SERVE, &[], LISTENING);
    eventually("the banner to say healthy", || {
        server
            .get("/")
            .body
            .contains("<p id=\"health\" class=\"banner ok\">Healthy: 1 live worker(s)")
    });
    drop(worker);
}

/// At 3 a.m.: the dead rows grouped by their error, a row's page with its
/// event, and a whole group requeued with the token after a dry run that
/// changes nothing; the banner then no longer reports dead rows.
#[test]
fn dead_rows_group_by_error_and_a_group_is_requeued_after_a_dry_run() {
    let site = Site::migrated();
    site.seed_with_dead(&[("c-a", true), ("c-b", true), ("c-ok", false)]);
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let page = server.get("/dead").body;
    assert!(
        page.contains("cursed die on {stream}/#: its attempts ended the process"),
        "{page}"
    );
    assert!(
        page.contains("<td><span class=\"num\">2</span></td>"),
        "one group of two: {page}"
    );
    let id = page
        .split("name=\"id\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a group id in the form")
        .to_owned();
    // The blocked page links each row to its page.
    let blocked = server.get("/blocked").body;
    assert!(
        blocked.contains("href=\"/row?stream=c-a&amp;seq=4\""),
        "{blocked}"
    );
    let row = server.get("/row?stream=c-a&seq=4");
    assert_eq!(row.status, 200, "{row:?}");
    for shown in [
        "dice_rolled",
        "cursed die on c-a/4",
        "<pre id=\"payload\">",
        "global position",
    ] {
        assert!(row.body.contains(shown), "{shown}: {}", row.body);
    }
    // The dead row's page offers its group's requeue, the same group.
    assert!(
        row.body
            .contains("<p id=\"error-group\">Its error group: <code>cursed die on {stream}/#"),
        "{}",
        row.body
    );
    assert!(
        row.body.contains(&format!("name=\"id\" value=\"{id}\"")),
        "{}",
        row.body
    );
    assert_eq!(server.get("/row?stream=c-a&seq=999").status, 404);
    assert_eq!(server.get("/row?stream=c-a&seq=abc").status, 400);

    let auth = format!("Bearer {TOKEN}");
    let dry = server.post(
        "/actions/requeue-group",
        &format!("id={id}&dry_run=1"),
        &[("Authorization", &auth)],
    );
    assert_eq!(dry.status, 200, "{dry:?}");
    assert!(dry.body.contains("Dry run: 2 dead row(s)"), "{}", dry.body);
    assert_eq!(site.counts()[3], 2, "a dry run changes nothing");
    let r = server.post(
        "/actions/requeue-group",
        "id=0123456789abcdef&dry_run=0",
        &[("Authorization", &auth)],
    );
    assert_eq!(r.status, 404, "{r:?}");
    let r = server.post("/actions/requeue-group", &format!("id={id}&dry_run=0"), &[]);
    assert_eq!(r.status, 401, "the token is needed: {r:?}");
    assert_eq!(site.counts()[3], 2);
    let done = server.post(
        "/actions/requeue-group",
        &format!("id={id}&dry_run=0"),
        &[("Authorization", &auth)],
    );
    assert_eq!(done.status, 200, "{done:?}");
    assert!(done.body.contains("requeued 2 dead row(s)"), "{}", done.body);
    assert_eq!(site.counts()[3], 0, "both requeued");
    assert!(server.get("/dead").body.contains("No dead row."));
    let overview = server.get("/").body;
    assert!(!overview.contains("dead row(s) block"), "{overview}");
    eventually("the group requeue audited", || {
        server.stderr().contains("action=\"requeue-group\"")
    });
}

/// The partitions page lists every partition's lease and rows; the sinks
/// page lists a sink's dead and failing streams, and one is requeued for
/// its sink with the token.
#[test]
fn the_partitions_and_sinks_pages_and_a_sink_stream_requeued() {
    use outbox_core::{Partition, RetryPolicy, Seq, SinkName, SinkStore, StreamId};
    let site = site_with_dead();
    support::block_on(async {
        let j = outbox_sqlite::SqliteJournal::open(&site.journal, outbox_sqlite::SqliteOptions::default())
            .await
            .unwrap();
        let once = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(1), 1).unwrap();
        j.fail_sink(
            &SinkName::new("bus").unwrap(),
            &StreamId::new("c-ok1").unwrap(),
            Partition::new(0),
            Seq::new(1).unwrap(),
            "bus down: 503 Service Unavailable",
            &once,
        )
        .await
        .unwrap();
        j.close().await;
    });
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let partitions = server.get("/partitions").body;
    assert_eq!(
        partitions.matches("<tr>").count(),
        1 + 16,
        "16 partitions: {partitions}"
    );
    let sinks = server.get("/sinks").body;
    for shown in [
        "<td>bus</td>",
        "c-ok1",
        "bus down: 503 Service Unavailable",
        "<span class=\"dead\">dead</span>",
    ] {
        assert!(sinks.contains(shown), "{shown}: {sinks}");
    }
    let r = server.post(
        "/actions/requeue-sink",
        "sink=bus&stream=c-ok1",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains("requeued stream c-ok1 for sink bus"),
        "{}",
        r.body
    );
    let sinks = server.get("/sinks").body;
    assert!(
        sinks.contains("<span class=\"failed\">failed</span>"),
        "due again: {sinks}"
    );
    let r = server.post(
        "/actions/requeue-sink",
        "sink=bus&stream=c-never",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
    );
    assert_eq!(r.status, 404, "a stream the sink has no state for: {r:?}");
    let r = server.post("/actions/requeue-sink", "sink=bus&stream=c-ok1", &[]);
    assert_eq!(r.status, 401, "{r:?}");
}

/// The search box finds a stream: its version, each projection's
/// checkpoint, its outbox rows from the head (linked to their pages).
#[test]
fn the_search_box_finds_a_stream_with_its_checkpoints_and_rows() {
    let site = site_with_dead();
    let server = Server::start(&site, SERVE, &[], LISTENING);
    let home = server.get("/").body;
    assert!(home.contains("action=\"/stream\""), "a search box: {home}");
    let page = server.get("/stream?stream=c-bad").body;
    assert!(page.contains("<span id=\"version\">"), "{page}");
    assert!(page.contains("href=\"/row?stream=c-bad&amp;seq=4\""), "{page}");
    assert!(page.contains("<span class=\"dead\">dead</span>"), "{page}");
    assert!(page.contains("behind</span>"), "{page}");
    let ok = server.get("/stream?stream=c-ok1").body;
    assert!(ok.contains("every event has been applied"), "{ok}");
    assert!(!ok.contains("behind</span>"), "{ok}");
    assert!(server.get("/stream?stream=nope").body.contains("No stream nope"));
    assert_eq!(server.get("/stream?stream=").status, 400);
}

/// The overview lists the consumers the journal knows and, with the
/// token, pauses and resumes one (ADR 0032); a dead projection exception
/// is requeued from its own table; the health banner names both, and a
/// paused consumer while it is paused (on /metrics too).
#[test]
fn consumers_are_listed_paused_resumed_and_a_dead_projection_requeued() {
    let site = Site::migrated();
    site.seed_with_dead_projection(&[("c-bad", true), ("c-ok", false)]);
    let server = Server::start(&site, SERVE, &with_token(), LISTENING);
    let home = server.get("/").body;
    assert!(home.contains("id=\"consumers\""), "{home}");
    assert!(home.contains("character_tally"), "{home}");
    assert!(
        home.contains("registered consumer(s) with no live worker"),
        "the library pass registered them and stopped: {home}"
    );
    assert!(
        home.contains("projection(s) dead on a stream"),
        "the banner names the dead exception: {home}"
    );
    let auth = [("Authorization", format!("Bearer {TOKEN}"))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = server.post(
        "/actions/pause-consumer",
        "sink=projection%3Acharacter_tally",
        &auth,
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains("paused consumer projection:character_tally"),
        "{}",
        r.body
    );
    let paused = site.json(&["consumers", "--json"]);
    let tally = paused
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["projection"] == "character_tally")
        .unwrap();
    assert_eq!(tally["paused"], true, "{paused}");
    // The banner and /metrics say so: a paused consumer's work is never
    // due, so the worker lag cannot show it falling behind.
    let home = server.get("/").body;
    assert!(
        home.contains("1 consumer(s) paused, falling behind until resumed: character_tally"),
        "{home}"
    );
    assert_eq!(scrape(&server)["outbox_consumers_paused"], 1.0);
    let r = server.post(
        "/actions/resume-consumer",
        "sink=projection%3Acharacter_tally",
        &auth,
    );
    assert!(
        r.body.contains("resumed consumer projection:character_tally"),
        "{}",
        r.body
    );
    assert!(!server.get("/").body.contains("paused, falling behind"));
    assert_eq!(scrape(&server)["outbox_consumers_paused"], 0.0);
    let r = server.post(
        "/actions/requeue-sink",
        "sink=projection%3Acharacter_tally&stream=c-bad",
        &auth,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = server.post("/actions/pause-consumer", "sink=projection%3Anope", &auth);
    assert_eq!(r.status, 404, "an unregistered consumer: {r:?}");
    let r = server.post("/actions/pause-consumer", "sink=projection%3Aroster", &[]);
    assert_eq!(r.status, 401, "{r:?}");
    let report = site.report();
    let x = &report["projection_exceptions"];
    assert_eq!(
        (x["dead"].as_u64(), x["failed"].as_u64()),
        (Some(0), Some(1)),
        "requeued: due again: {report}"
    );
}

/// Read-your-writes across processes (ADR 0032): a worker runs in one
/// process, the events are appended in this one, and `outbox wait` in a
/// third resolves once they are applied; it exits 4 at once naming a
/// projection that is dead on the stream (dead-lettered by an earlier pass
/// without the fix), or paused, and 0 again once the paused one is resumed
/// and caught up.
#[test]
fn outbox_wait_across_processes_resolves_and_names_a_dead_or_paused_projection() {
    let site = Site::migrated();
    site.seed_with_dead_projection(&[("w-bad", true)]);
    let fast = [
        ("OUTBOX_DEAD_LETTER_THRESHOLD", "1"),
        ("OUTBOX_HEARTBEAT_INTERVAL_MS", "200"),
        ("OUTBOX_POLL_INTERVAL_MS", "50"),
    ];
    let worker = Server::start(
        &site,
        &["work", "--metrics-addr", "127.0.0.1:0"],
        &fast,
        "metrics on http://",
    );
    site.seed_backlog(&[("w-ok", false)]);
    site.ok(&["wait", "--stream", "w-ok", "--seq", "7", "--timeout-ms", "60000"]);
    let out = site.ok(&[
        "wait",
        "--stream",
        "w-bad",
        "--seq",
        "7",
        "--projection",
        "roster",
        "--projection",
        "campaign_summary",
        "--timeout-ms",
        "60000",
    ]);
    assert!(
        out.contains("w-bad/7 is applied by roster, campaign_summary"),
        "{out}"
    );
    let (code, _, err) = site.run_env(
        &["wait", "--stream", "w-bad", "--seq", "7", "--timeout-ms", "60000"],
        &[],
    );
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("projection character_tally is dead on w-bad/4"),
        "{err}"
    );
    assert_eq!(worker.stop().code(), Some(0));

    // No worker runs now: a paused projection cannot get there.
    site.ok(&["consumers", "pause", "--consumer", "roster"]);
    site.seed_backlog(&[("w-late", false)]);
    let (code, _, err) = site.run_env(
        &[
            "wait",
            "--stream",
            "w-late",
            "--seq",
            "7",
            "--projection",
            "roster",
        ],
        &[],
    );
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("projection roster is paused"), "{err}");
    let (code, _, err) = site.run_env(
        &[
            "wait",
            "--stream",
            "w-late",
            "--seq",
            "7",
            "--projection",
            "campaign_summary",
            "--timeout-ms",
            "200",
        ],
        &[],
    );
    assert_eq!(code, Some(5), "no worker: the time runs out: {err}");
    assert!(
        err.contains("projection campaign_summary is at w-late/0"),
        "{err}"
    );
    site.ok(&["consumers", "resume", "--consumer", "roster"]);
    let worker = Server::start(
        &site,
        &["work", "--metrics-addr", "127.0.0.1:0"],
        &fast,
        "metrics on http://",
    );
    site.ok(&[
        "wait",
        "--stream",
        "w-late",
        "--seq",
        "7",
        "--projection",
        "roster",
        "--timeout-ms",
        "60000",
    ]);
    assert_eq!(worker.stop().code(), Some(0));
}
