//! The front door over real sockets, in this process: the door and the
//! server loop of `serve` and `work --metrics-addr` in front of a small
//! router (or the monitor's own, on SQLite files). Nothing here waits on a
//! clock to decide an outcome: where a timeout is the subject, the client
//! writes what it sends before the server accepts, so only what it never
//! sends can time out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::door::{Door, DoorConfig, Token};
use super::{BODY_LIMIT, monitor_router, run_server};

const TOKEN: &str = "3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e";
const READ: &str = "read-9f8e7d6c5b4a3210-abcdef";
/// How long a client waits for an answer before the test fails (a hang
/// guard only: no outcome depends on it).
const PATIENCE: Duration = Duration::from_secs(60);

fn config(bound: &str) -> DoorConfig<'static> {
    DoorConfig {
        bound: bound.parse().unwrap(),
        allowed_hosts: None,
        max_connections: 16,
        head_timeout: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
        busy_pages: 4,
        body_limit: BODY_LIMIT,
        what: "the monitor",
    }
}

/// A small router: an "expensive" overview and `/metrics`, the stylesheet,
/// and a POST that reads its body.
fn pages() -> Router {
    Router::new()
        .route("/", get(async || "overview"))
        .route("/metrics", get(async || "metrics"))
        .route("/style.css", get(async || "css"))
        .route("/echo", post(async |body: String| body))
}

struct Running {
    addr: SocketAddr,
    cancel: CancellationToken,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Serves `router` behind `door` on `listener` (bound by the caller, who
/// may connect and write before the server accepts).
fn start_on(listener: TcpListener, door: Arc<Door>, router: Router) -> Running {
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    tokio::spawn(run_server(listener, router, door, cancel.clone()));
    Running { addr, cancel }
}

async fn listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.unwrap()
}

async fn start(door: Door, router: Router) -> Running {
    start_on(listener().await, Arc::new(door), router)
}

/// The monitor's own router on fresh SQLite files in `dir`.
async fn monitor(door: Arc<Door>, dir: &std::path::Path) -> Router {
    monitor_router(super::test_monitor::monitor(door, dir, Vec::new(), 10, 100_000).await)
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body is one non-empty line.
    fn one_line(&self) -> bool {
        self.body.ends_with('\n') && self.body.trim_end().lines().count() == 1 && !self.body.trim().is_empty()
    }
}

/// Reads a whole answer (the server closes after one request).
async fn answer(mut s: TcpStream) -> Reply {
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut raw))
        .await
        .expect("an answer in time")
        .expect("reading the answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an HTTP response: {text:?}"));
    let mut lines = head.lines();
    let status = lines
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

async fn exchange(addr: SocketAddr, raw: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    answer(s).await
}

async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST"
        && !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    exchange(addr, req.as_bytes()).await
}

/// A page whose DNS name was rebound to the monitor's address gets 421 on
/// a non-loopback bind too, credentials or not; the bound address, the
/// loopback names and (on `0.0.0.0`) any address are answered.
#[tokio::test]
async fn a_rebound_name_is_refused_on_a_non_loopback_bind_too() {
    let auth = format!("Bearer {READ}");
    let door = Door::with_tokens(&config("10.0.0.5:9464"), None, Some(Token::new(READ))).unwrap();
    let s = start(door, pages()).await;
    for path in ["/", "/metrics"] {
        let r = request(
            s.addr,
            "GET",
            path,
            &[("Host", "rebind.attacker.example:9464"), ("Authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(r.status, 421, "{path}: {r:?}");
        assert!(r.one_line() && !r.body.contains("overview"), "{r:?}");
    }
    for host in ["10.0.0.5:9464", "localhost:9464", "127.0.0.1"] {
        let r = request(
            s.addr,
            "GET",
            "/",
            &[("Host", host), ("Authorization", &auth)],
            "",
        )
        .await;
        assert_eq!((r.status, r.body.as_str()), (200, "overview"), "{host}: {r:?}");
    }

    let door = Door::with_tokens(&config("0.0.0.0:9464"), None, Some(Token::new(READ))).unwrap();
    let s = start(door, pages()).await;
    for host in ["192.168.1.20:9464", "[fe80::1]:9464"] {
        let r = request(
            s.addr,
            "GET",
            "/",
            &[("Host", host), ("Authorization", &auth)],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{host}: {r:?}");
    }
    let r = request(
        s.addr,
        "GET",
        "/",
        &[("Host", "rebind.attacker.example"), ("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(r.status, 421, "{r:?}");

    // Names the monitor is reached by are configured.
    let mut c = config("0.0.0.0:9464");
    c.allowed_hosts = Some("monitor.internal");
    let s = start(
        Door::with_tokens(&c, None, Some(Token::new(READ))).unwrap(),
        pages(),
    )
    .await;
    let r = request(
        s.addr,
        "GET",
        "/",
        &[("Host", "monitor.internal:9464"), ("Authorization", &auth)],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{r:?}");
}

/// Every 401 challenges Bearer: an action without the token (Bearer only:
/// actions take no Basic), a read off loopback without credentials (Bearer,
/// then Basic for a browser). The scheme's case does not matter.
#[tokio::test]
async fn every_401_challenges_bearer() {
    let dir = tempfile::tempdir().unwrap();
    let door = Arc::new(Door::with_tokens(&config("127.0.0.1:9464"), Some(Token::new(TOKEN)), None).unwrap());
    let s = start_on(listener().await, door.clone(), monitor(door, dir.path()).await);
    let r = request(s.addr, "POST", "/actions/requeue", &[], "stream=s-1&seq=1").await;
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(
        r.all("www-authenticate"),
        ["Bearer realm=\"outbox monitor\""],
        "{r:?}"
    );
    assert!(r.one_line(), "{r:?}");
    let r = request(
        s.addr,
        "POST",
        "/actions/requeue",
        &[("Authorization", &format!("bearer {TOKEN}"))],
        "stream=s-1&seq=1",
    )
    .await;
    assert_eq!(r.status, 404, "the token is taken; there is no such row: {r:?}");

    let door = Door::with_tokens(&config("10.0.0.5:9464"), None, Some(Token::new(READ))).unwrap();
    let s = start(door, pages()).await;
    let r = request(s.addr, "GET", "/metrics", &[], "").await;
    assert_eq!(r.status, 401, "{r:?}");
    assert_eq!(
        r.all("www-authenticate"),
        [
            "Bearer realm=\"outbox monitor\"",
            "Basic realm=\"outbox monitor\", charset=\"UTF-8\""
        ],
        "{r:?}"
    );
    assert!(r.one_line() && !r.body.contains("metrics\n"), "{r:?}");
    let r = request(
        s.addr,
        "GET",
        "/metrics",
        &[("Authorization", &format!("BeArEr {READ}"))],
        "",
    )
    .await;
    assert_eq!((r.status, r.body.as_str()), (200, "metrics"), "{r:?}");
}

/// Heads that hyper would answer itself with an empty body (a target over
/// its 64 KiB, more than its 100 header lines, a malformed request line)
/// get one line from the door.
#[tokio::test]
async fn heads_hyper_would_answer_with_an_empty_body_get_one_line() {
    let s = start(
        Door::with_tokens(&config("127.0.0.1:9464"), None, None).unwrap(),
        pages(),
    )
    .await;
    let long = format!("GET /{} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(70_000));
    let r = exchange(s.addr, long.as_bytes()).await;
    assert_eq!(r.status, 414, "{r:?}");
    assert!(r.one_line(), "{r:?}");

    let mut many = String::from("GET / HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..120 {
        many.push_str(&format!("X-Header-{i}: v\r\n"));
    }
    many.push_str("\r\n");
    let r = exchange(s.addr, many.as_bytes()).await;
    assert_eq!(r.status, 431, "{r:?}");
    assert!(r.one_line(), "{r:?}");

    let r = exchange(s.addr, b"NONSENSE\r\n\r\n").await;
    assert_eq!(r.status, 400, "{r:?}");
    assert!(r.one_line(), "{r:?}");
    // The door's own answers carry the security headers too.
    assert_eq!(r.all("x-content-type-options"), ["nosniff"], "{r:?}");
    assert_eq!(r.all("x-frame-options"), ["DENY"], "{r:?}");
    assert_eq!(
        r.all("content-length"),
        [r.body.len().to_string().as_str()],
        "{r:?}"
    );

    // Within the limits, a request passes, its body included.
    let r = request(s.addr, "GET", "/", &[], "").await;
    assert_eq!((r.status, r.body.as_str()), (200, "overview"), "{r:?}");
    let r = request(s.addr, "POST", "/echo", &[], "a=1").await;
    assert_eq!((r.status, r.body.as_str()), (200, "a=1"), "{r:?}");
}

/// A head that never ends and a body that never comes get 408 in one line
/// once `--head-timeout-ms` or `--request-timeout-ms` has passed. The
/// clients write what they send before the server accepts.
#[tokio::test]
async fn a_stalled_head_or_body_gets_408_in_one_line() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let mut head = TcpStream::connect(addr).await.unwrap();
    head.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        .await
        .unwrap();
    let mut body = TcpStream::connect(addr).await.unwrap();
    body.write_all(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nten bytes.")
        .await
        .unwrap();
    let mut c = config("127.0.0.1:9464");
    c.head_timeout = Duration::from_millis(100);
    c.request_timeout = Duration::from_millis(100);
    let _s = start_on(
        listener,
        Arc::new(Door::with_tokens(&c, None, None).unwrap()),
        pages(),
    );
    let r = answer(head).await;
    assert_eq!(r.status, 408, "{r:?}");
    assert!(r.one_line() && r.body.contains("head"), "{r:?}");
    let r = answer(body).await;
    assert_eq!(r.status, 408, "{r:?}");
    assert!(r.one_line(), "{r:?}");
}

/// Expensive pages beyond `--max-busy-pages` get 503 with `Retry-After`;
/// cheap ones are still served.
#[tokio::test]
async fn expensive_pages_beyond_the_limit_get_503() {
    let (entered, mut inside) = tokio::sync::mpsc::channel::<()>(1);
    let release = Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    let router = pages().route(
        "/blocked",
        get(move || {
            let (entered, held) = (entered.clone(), held.clone());
            async move {
                entered.send(()).await.unwrap();
                held.notified().await;
                "blocked"
            }
        }),
    );
    let mut c = config("127.0.0.1:9464");
    c.busy_pages = 1;
    let s = start(Door::with_tokens(&c, None, None).unwrap(), router).await;
    let addr = s.addr;
    let first = tokio::spawn(async move { request(addr, "GET", "/blocked", &[], "").await });
    inside.recv().await.unwrap();
    for path in ["/", "/metrics"] {
        let r = request(addr, "GET", path, &[], "").await;
        assert_eq!(r.status, 503, "{path}: {r:?}");
        assert_eq!(r.all("retry-after"), ["1"], "{r:?}");
        assert!(r.one_line(), "{r:?}");
    }
    let r = request(addr, "GET", "/style.css", &[], "").await;
    assert_eq!(r.status, 200, "{r:?}");
    release.notify_one();
    let r = first.await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "blocked"), "{r:?}");
    let r = request(addr, "GET", "/", &[], "").await;
    assert_eq!(r.status, 200, "the slot is back: {r:?}");
}

/// An action refused for its input after its token was taken, and a body
/// refused before, are audited: who, which token (by id), what, result.
#[tokio::test]
async fn refused_action_inputs_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let door = Arc::new(Door::with_tokens(&config("127.0.0.1:9464"), Some(Token::new(TOKEN)), None).unwrap());
    let s = start_on(
        listener().await,
        door.clone(),
        monitor(door.clone(), dir.path()).await,
    );
    let auth = format!("Bearer {TOKEN}");
    let r = request(
        s.addr,
        "POST",
        "/actions/requeue",
        &[("Authorization", &auth)],
        "stream=s-1&seq=zero",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = request(
        s.addr,
        "POST",
        "/actions/requeue-dead",
        &[("Authorization", &auth)],
        "limit=0",
    )
    .await;
    assert_eq!(r.status, 400, "{r:?}");
    let r = request(
        s.addr,
        "POST",
        "/actions/retry",
        &[("Authorization", &auth), ("Content-Type", "text/plain")],
        "stream=s-1&seq=1",
    )
    .await;
    assert_eq!(r.status, 415, "{r:?}");
    let id = Token::new(TOKEN).id;
    let audit = door.audit_entries();
    let seen: Vec<(&str, Option<&str>, &str)> = audit
        .iter()
        .map(|e| (e.action.as_str(), e.token.as_deref(), e.result.as_str()))
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!((seen[0].0, seen[0].1), ("retry", None), "{seen:?}");
    assert!(seen[0].2.starts_with("refused (415)"), "{seen:?}");
    assert_eq!(
        (seen[1].0, seen[1].1),
        ("requeue-dead", Some(id.as_str())),
        "{seen:?}"
    );
    assert!(seen[1].2.starts_with("refused (400)"), "{seen:?}");
    assert_eq!((seen[2].0, seen[2].1), ("requeue", Some(id.as_str())), "{seen:?}");
    assert!(seen[2].2.starts_with("refused (400)"), "{seen:?}");
    assert!(audit.iter().all(|e| e.peer.ip().is_loopback()));
}

/// Waits until the door counts `n` connections still sending their
/// request: each socket is accepted before the next one connects, so
/// "oldest" is the order the test opened them in. A hang guard only.
async fn waiting(door: &Door, n: usize) {
    tokio::time::timeout(PATIENCE, async {
        while door.waiting.len() != n {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} connections waiting, not {n}", door.waiting.len()));
}

/// Reads what the server sends until it closes: nothing (a reset counts
/// as nothing) for a connection closed without an answer.
async fn closed_silently(mut s: TcpStream) -> bool {
    let mut rest = Vec::new();
    match tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest))
        .await
        .expect("closed in time")
    {
        Ok(_) => rest.is_empty(),
        Err(_) => true,
    }
}

/// Sockets that sent nothing, half a head, or a head whose declared body
/// never comes fill every slot; a real request still gets its answer: it
/// closes the oldest of them (here the trickling body) and the others stay.
/// No timeout is involved (the head and request timeouts are an hour).
#[tokio::test]
async fn idle_and_trickling_sockets_at_the_cap_make_room_for_a_real_request() {
    let mut c = config("127.0.0.1:9464");
    c.max_connections = 3;
    c.head_timeout = Duration::from_secs(3600);
    c.request_timeout = Duration::from_secs(3600);
    let door = Arc::new(Door::with_tokens(&c, None, None).unwrap());
    let s = start_on(listener().await, door.clone(), pages());
    let mut idle = Vec::new();
    for sent in [
        &b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nten bytes."[..],
        b"GET / HTTP/1.1\r\nHost: localhost\r\n",
        b"",
    ] {
        let mut sock = TcpStream::connect(s.addr).await.unwrap();
        sock.write_all(sent).await.unwrap();
        idle.push(sock);
        waiting(&door, idle.len()).await;
    }
    let r = request(s.addr, "GET", "/", &[], "").await;
    assert_eq!((r.status, r.body.as_str()), (200, "overview"), "{r:?}");
    assert_eq!(
        door.waiting.shed_total.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let mut idle = idle.into_iter();
    assert!(
        closed_silently(idle.next().unwrap()).await,
        "the oldest made room"
    );
    waiting(&door, 2).await;
}

/// A connection whose request is in (a page being rendered) is never
/// closed for a newer one: with it holding the only slot, the newcomer is
/// turned away and the page is still answered.
#[tokio::test]
async fn a_request_being_answered_is_not_closed_for_a_newer_one() {
    let (entered, mut inside) = tokio::sync::mpsc::channel::<()>(1);
    let release = Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    let router = pages().route(
        "/blocked",
        get(move || {
            let (entered, held) = (entered.clone(), held.clone());
            async move {
                entered.send(()).await.unwrap();
                held.notified().await;
                "blocked"
            }
        }),
    );
    let mut c = config("127.0.0.1:9464");
    c.max_connections = 1;
    let door = Arc::new(Door::with_tokens(&c, None, None).unwrap());
    let s = start_on(listener().await, door.clone(), router);
    let addr = s.addr;
    let first = tokio::spawn(async move { request(addr, "GET", "/blocked", &[], "").await });
    inside.recv().await.unwrap();
    assert_eq!(door.waiting.len(), 0, "its request is in");
    let mut late = TcpStream::connect(addr).await.unwrap();
    late.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_silently(late).await, "turned away");
    release.notify_one();
    let r = first.await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "blocked"), "{r:?}");
    assert_eq!(
        door.waiting.shed_total.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// The monitor of an application's own binary names that binary in the
/// command hints of its error answers (a port error names `outbox`);
/// pages are left as they are.
#[tokio::test]
async fn error_answers_name_the_running_binary() {
    let router = Router::new()
        .route(
            "/conflict",
            get(async || {
                super::text(
                    axum::http::StatusCode::CONFLICT,
                    "a run is active: wait for it or cancel it with `outbox runs cancel 3`",
                )
            }),
        )
        .route("/page", get(async || "run `outbox report`"))
        .layer(axum::middleware::from_fn_with_state(
            Arc::<str>::from("bankctl"),
            super::name_the_binary,
        ));
    let door = Door::with_tokens(&config("127.0.0.1:9464"), None, None).unwrap();
    let s = start(door, router).await;
    let r = request(s.addr, "GET", "/conflict", &[], "").await;
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(
        r.body,
        "a run is active: wait for it or cancel it with `bankctl runs cancel 3`\n"
    );
    let r = request(s.addr, "GET", "/page", &[], "").await;
    assert_eq!((r.status, r.body.as_str()), (200, "run `outbox report`"));
}
