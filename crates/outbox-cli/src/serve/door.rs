//! The front door of `outbox serve` and `outbox work --metrics-addr`: what
//! every connection and request passes before a page or an action sees it.
//!
//! - **Connections.** At most `--max-connections` at once (see the end of
//!   this point for who gives way); one request per connection; the request
//!   head must arrive within `--head-timeout-ms` (else 408), and is read
//!   here before hyper sees it ([`read_head`]): a head too large, a target
//!   too long or a malformed request line gets its one-line answer from
//!   here, where hyper would answer with an empty body; a body larger than the
//!   limit is refused from its `Content-Length` before it is read, a request
//!   is answered within `--request-timeout-ms`, and the whole connection ends
//!   within both and 5 s more. A client that opens sockets and sends
//!   nothing, or sends a head or a body byte by byte, holds a slot for
//!   seconds, not forever; and when every slot is taken, a new connection
//!   closes the oldest one still sending its request ([`Waiting`]), so
//!   such clients cannot keep a real request out even for those seconds.
//! - **Host allow-list.** The `Host` of every request must be one the
//!   monitor answers to (`--allowed-hosts`; by default the loopback names
//!   and the bound address, or any IP address on a `0.0.0.0` or `::`
//!   bind): a web page whose DNS name was rebound to the monitor's address
//!   gets 421, not the monitor.
//! - **Credentials for reads off loopback.** On a non-loopback bind every
//!   page and `/metrics` needs the read token (`OUTBOX_SERVE_READ_TOKEN`)
//!   or the operator token, as `Authorization: Bearer` or Basic (any user
//!   name; what a browser asks for after the `WWW-Authenticate` challenge;
//!   every 401 challenges Bearer, reads Basic too).
//!   Actions always need the operator token itself, in the form or as
//!   Bearer, never Basic: a browser resends Basic credentials on its own.
//! - **Guessing.** [`MAX_FAILURES`] refused credentials from one address
//!   within [`LOCKOUT`] lock that address out (429) until [`LOCKOUT`] after
//!   its last failure.
//! - **Expensive pages** (every page but `/row` and `/style.css`) run at most
//!   `--max-busy-pages` at a time; more get 503 with `Retry-After`.
//! - **Audit.** Every action and every refusal is one log line on the
//!   `outbox::audit` target: who (address, token id), what, result; the
//!   last 200 are also kept for the monitor's audit page.
//! - **One-line bodies** on every error answer the router makes itself
//!   (405, 413, 414, 431...).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use outbox_core::Error;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::cli::{OUTBOX_SERVE_READ_TOKEN, OUTBOX_SERVE_TOKEN};

/// The longest request target accepted.
const MAX_TARGET: usize = 4 * 1024;
/// The largest request head accepted (the sum of its header lines).
const MAX_HEADERS: usize = 16 * 1024;
/// Refused credentials from one address before it is locked out.
pub(crate) const MAX_FAILURES: usize = 10;
/// How long refused credentials are remembered, and a lockout lasts.
pub(crate) const LOCKOUT: Duration = Duration::from_secs(300);
/// The refusal of every action on databases open read-only.
pub(crate) const STORE_READ_ONLY: &str = "actions are disabled: the journal is open read-only (?mode=ro, or files \
     this user cannot write); the monitor only shows";

/// Audit entries the monitor keeps to show (`/audit`).
const AUDIT_KEPT: usize = 200;
/// The fewest bits a token must look like it carries (see [`check_strength`]).
const MIN_TOKEN_BITS: f64 = 64.0;
/// The fewest bits a token must carry with its runs collapsed (see
/// [`check_strength`]).
const MIN_UNRUN_BITS: f64 = 40.0;
/// The shortest token accepted.
const MIN_TOKEN_LEN: usize = 16;

/// A token from the environment, with the id the audit log names it by
/// (never the token itself).
pub(crate) struct Token {
    /// The SHA-256 of the token: what a given token is compared with.
    digest: [u8; 32],
    /// The first 8 hex digits of the token's SHA-256.
    pub(crate) id: String,
}

impl Token {
    pub(crate) fn new(secret: &str) -> Token {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        Token { digest, id }
    }

    /// Compares the digests in constant time: the time taken tells neither
    /// how much of the token a guess got right nor how long the token is
    /// (comparing the bytes themselves stops at once on a length mismatch).
    fn matches(&self, given: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        bool::from(given.ct_eq(&self.digest))
    }
}

/// Refuses a token that is short or looks guessable: fewer than
/// [`MIN_TOKEN_LEN`] characters; fewer than [`MIN_TOKEN_BITS`] by the
/// character frequencies (`xxxxxxxxxxxxxxxx` carries none,
/// `passwordpassword` 44, `openssl rand -hex 32` about 240); or fewer than
/// [`MIN_UNRUN_BITS`] once runs are collapsed, every character that only
/// continues a run of equal steps (`abcd…`, `0123…`, `aaaa…`) dropped:
/// `abcdefghijklmnop` has 64 bits by its frequencies but is `ab`.
pub(crate) fn check_strength(token: &str) -> Result<(), String> {
    let chars: Vec<char> = token.chars().collect();
    if chars.len() < MIN_TOKEN_LEN {
        return Err(format!("must be at least {MIN_TOKEN_LEN} characters"));
    }
    let guessable = |why: &str| format!("looks guessable ({why}); generate one, e.g. `openssl rand -hex 32`");
    if frequency_bits(&chars) < MIN_TOKEN_BITS {
        return Err(guessable("too few different characters"));
    }
    let step = |a: char, b: char| i64::from(u32::from(b)) - i64::from(u32::from(a));
    let unrun: Vec<char> = chars
        .iter()
        .enumerate()
        .filter(|&(i, &c)| {
            i < 2 || {
                let d = step(chars[i - 1], c);
                d.abs() > 1 || d != step(chars[i - 2], chars[i - 1])
            }
        })
        .map(|(_, &c)| c)
        .collect();
    if frequency_bits(&unrun) < MIN_UNRUN_BITS {
        return Err(guessable("runs such as abcd or 1234"));
    }
    Ok(())
}

/// The bits `chars` carry by their frequencies: the Shannon entropy of one
/// character times their number.
fn frequency_bits(chars: &[char]) -> f64 {
    let n = chars.len() as f64;
    let mut counts: HashMap<char, usize> = HashMap::new();
    for &c in chars {
        *counts.entry(c).or_default() += 1;
    }
    let per_char: f64 = counts
        .values()
        .map(|&k| {
            let p = k as f64 / n;
            -p * p.log2()
        })
        .sum();
    per_char * n
}

/// A token variable: `None` when unset; a short, guessable or non-UTF-8
/// one is a configuration error (the value is never echoed).
fn token_var(name: &str) -> Result<Option<Token>, Error> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config(format!("{name} is not valid UTF-8"))),
        Ok(t) => {
            let t = t.trim().to_owned();
            check_strength(&t).map_err(|why| Error::Config(format!("{name} {why} (value not shown)")))?;
            Ok(Some(Token::new(&t)))
        }
    }
}

/// The operator token from `OUTBOX_SERVE_TOKEN` (actions).
pub(crate) fn action_token() -> Result<Option<Token>, Error> {
    token_var(OUTBOX_SERVE_TOKEN)
}

/// The hosts a monitor answers to.
#[derive(Debug)]
enum Hosts {
    /// Any name (`--allowed-hosts '*'`).
    Any,
    /// These names; with `any_address`, also any IP address literal.
    Only { names: Vec<String>, any_address: bool },
}

/// The `Host` header's name without its port, lower case.
fn host_name(h: &str) -> String {
    let h = h.trim();
    let name = if let Some(rest) = h.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match h.rsplit_once(':') {
            // More than one colon without brackets: a bare IPv6 address.
            Some((name, _)) if name.contains(':') => h,
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => h,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl Hosts {
    /// `list` (comma-separated names, `*` for any), or by default the
    /// loopback names and `bound`'s address; on an unspecified bind
    /// (`0.0.0.0`, `::`), any IP address literal instead of the bound one.
    /// A rebinding attack always arrives under the attacker's DNS name; an
    /// address in `Host` is one the browser itself went to (ADR 0036).
    fn parse(list: Option<&str>, bound: SocketAddr) -> Result<Hosts, Error> {
        let Some(list) = list.map(str::trim).filter(|l| !l.is_empty()) else {
            let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).into();
            let any_address = bound.ip().is_unspecified();
            if !any_address {
                names.push(bound.ip().to_string());
            }
            return Ok(Hosts::Only { names, any_address });
        };
        if list == "*" {
            return Ok(Hosts::Any);
        }
        let mut names = Vec::new();
        for item in list.split(',') {
            let name = host_name(item);
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
            {
                return Err(Error::Config(format!(
                    "--allowed-hosts: {:?} is not a host name or address",
                    crate::output::visible(item.trim())
                )));
            }
            names.push(name);
        }
        Ok(Hosts::Only {
            names,
            any_address: false,
        })
    }

    fn allows(&self, host: &str) -> bool {
        match self {
            Hosts::Any => true,
            Hosts::Only { names, any_address } => {
                let name = host_name(host);
                names.contains(&name) || (*any_address && name.parse::<IpAddr>().is_ok())
            }
        }
    }
}

/// One audited action or refusal, as the audit page shows it.
#[derive(Clone, Debug)]
pub(crate) struct AuditEntry {
    /// When, by this process's clock.
    pub(crate) at: outbox_core::Timestamp,
    pub(crate) peer: SocketAddr,
    /// The token's id, when one was accepted.
    pub(crate) token: Option<String>,
    pub(crate) action: String,
    /// What it was on (a row, a group, a run), when known.
    pub(crate) on: String,
    /// "done: ...", "failed: ..." or "refused: ...".
    pub(crate) result: String,
}

/// How the front door is set up: from the command line and environment.
pub(crate) struct DoorConfig<'a> {
    pub(crate) bound: SocketAddr,
    pub(crate) allowed_hosts: Option<&'a str>,
    pub(crate) max_connections: usize,
    pub(crate) head_timeout: Duration,
    /// How long a request may take once its head is in: its body, the page
    /// or action and the answer.
    pub(crate) request_timeout: Duration,
    /// Expensive pages served at once.
    pub(crate) busy_pages: usize,
    /// The largest request body read.
    pub(crate) body_limit: usize,
    /// What the door guards, for messages: "the monitor", "metrics".
    pub(crate) what: &'a str,
}

/// The front door's state, shared by every connection.
pub(crate) struct Door {
    hosts: Hosts,
    /// The operator token (actions; reads too).
    pub(crate) action: Option<Token>,
    /// Whether the databases are open read-only (`?mode=ro`, or files this
    /// user cannot write): every action is refused, token or not.
    pub(crate) store_read_only: bool,
    /// Whether reads need credentials (a non-loopback bind).
    reads_need_credentials: bool,
    read: Option<Token>,
    failures: Mutex<HashMap<IpAddr, Vec<Instant>>>,
    pages: Semaphore,
    busy_pages: usize,
    pub(crate) max_connections: usize,
    pub(crate) head_timeout: Duration,
    request_timeout: Duration,
    body_limit: usize,
    /// When the last "connections full" line was logged (one per minute).
    full_logged: Mutex<Option<Instant>>,
    /// The last [`AUDIT_KEPT`] audit entries, newest last.
    audit: Mutex<VecDeque<AuditEntry>>,
    /// The connections still sending their request.
    pub(crate) waiting: Waiting,
}

/// The connections that have not sent their whole request yet (its head,
/// and the body its `Content-Length` declares), by accept order. When every
/// connection slot is taken, a new connection closes the oldest of them
/// instead of being turned away: a client that opens sockets and sends
/// nothing, or trickles its request, holds slots only until real requests
/// need them. A connection whose request is in (a page being rendered, an
/// action running) is never closed for another.
#[derive(Default)]
pub(crate) struct Waiting {
    next: std::sync::atomic::AtomicU64,
    open: Mutex<std::collections::BTreeMap<u64, (SocketAddr, Instant, CancellationToken)>>,
    /// Connections closed for a newer one, since the last log line.
    shed_unlogged: Mutex<(u64, Option<Instant>)>,
    /// Connections closed for a newer one, in all.
    pub(crate) shed_total: std::sync::atomic::AtomicU64,
}

/// A connection's place among the [`Waiting`] ones: left when dropped
/// (its request is in, or it closed). `closed` fires when a newer
/// connection took its slot.
pub(crate) struct WaitingPlace {
    door: Arc<Door>,
    id: u64,
    pub(crate) closed: CancellationToken,
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        self.door.waiting.lock().remove(&self.id);
    }
}

impl Waiting {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, (SocketAddr, Instant, CancellationToken)>>
    {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many connections are still sending their request.
    #[cfg(all(test, feature = "sqlite"))]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Door {
    /// Enters a connection just accepted from `peer` among the waiting
    /// ones (called in accept order: the order is the accept loop's).
    pub(crate) fn wait_for_request(self: &Arc<Self>, peer: SocketAddr) -> WaitingPlace {
        let id = self
            .waiting
            .next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let closed = CancellationToken::new();
        self.waiting
            .lock()
            .insert(id, (peer, Instant::now(), closed.clone()));
        WaitingPlace {
            door: self.clone(),
            id,
            closed,
        }
    }

    /// Closes the oldest connection still sending its request, for a new
    /// one from `newcomer`; `false` when there is none (every open
    /// connection is being answered). Logged at most once a minute, with
    /// the count since the last line.
    pub(crate) fn shed_oldest(&self, newcomer: SocketAddr) -> bool {
        let Some((_, (peer, since, closed))) = self.waiting.lock().pop_first() else {
            return false;
        };
        closed.cancel();
        self.waiting
            .shed_total
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut unlogged = self
            .waiting
            .shed_unlogged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        unlogged.0 += 1;
        if unlogged.1.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            tracing::warn!(
                target: "outbox::audit",
                %peer,
                %newcomer,
                max = self.max_connections,
                closed = unlogged.0,
                "connection closed for a newer one: --max-connections are open and this one had not \
                 sent its whole request in {:?} (the oldest such; logged once a minute, `closed` counts \
                 them since the last line)",
                since.elapsed()
            );
            *unlogged = (0, Some(Instant::now()));
        }
        true
    }
}

impl Door {
    /// Reads the tokens and checks the bind: a non-loopback one needs a
    /// token (every read then needs credentials).
    pub(crate) fn new(c: &DoorConfig<'_>) -> Result<Door, Error> {
        Door::with_tokens(c, action_token()?, token_var(OUTBOX_SERVE_READ_TOKEN)?)
    }

    /// [`Door::new`] with the tokens given (checked for strength already).
    pub(crate) fn with_tokens(
        c: &DoorConfig<'_>,
        action: Option<Token>,
        read: Option<Token>,
    ) -> Result<Door, Error> {
        let public = !c.bound.ip().is_loopback();
        if public && action.is_none() && read.is_none() {
            return Err(Error::Config(format!(
                "refusing to serve {} on non-loopback address {} without {OUTBOX_SERVE_TOKEN} or \
                 {OUTBOX_SERVE_READ_TOKEN} (set one, or bind 127.0.0.1)",
                c.what, c.bound
            )));
        }
        if c.max_connections == 0 {
            return Err(Error::Config("--max-connections must be at least 1".into()));
        }
        if c.busy_pages == 0 {
            return Err(Error::Config("--max-busy-pages must be at least 1".into()));
        }
        Ok(Door {
            hosts: Hosts::parse(c.allowed_hosts, c.bound)?,
            action,
            store_read_only: false,
            reads_need_credentials: public,
            read,
            failures: Mutex::default(),
            pages: Semaphore::new(c.busy_pages),
            busy_pages: c.busy_pages,
            max_connections: c.max_connections,
            head_timeout: c.head_timeout,
            request_timeout: c.request_timeout,
            body_limit: c.body_limit,
            full_logged: Mutex::default(),
            audit: Mutex::default(),
            waiting: Waiting::default(),
        })
    }

    /// How long one connection (one request) may stay open at most.
    pub(crate) fn connection_deadline(&self) -> Duration {
        self.head_timeout + self.request_timeout + Duration::from_secs(5)
    }

    /// Logs that a connection was closed because every slot was taken (at
    /// most once a minute).
    pub(crate) fn note_full(&self, peer: SocketAddr) {
        let mut last = self.full_logged.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *last = Some(Instant::now());
            tracing::warn!(
                target: "outbox::audit",
                %peer,
                max = self.max_connections,
                "connection refused: --max-connections are open, each with its request in (logged once a minute)"
            );
        }
    }

    /// Whether `ip` is locked out for refused credentials.
    pub(crate) fn locked_out(&self, ip: IpAddr) -> bool {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let Some(times) = f.get_mut(&ip) else {
            return false;
        };
        times.retain(|t| t.elapsed() < LOCKOUT);
        if times.is_empty() {
            f.remove(&ip);
            return false;
        }
        times.len() >= MAX_FAILURES
    }

    /// Counts refused credentials from `ip`.
    pub(crate) fn failed(&self, ip: IpAddr) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: an address past the limit is locked out, and stays so
        // while its newest failures are recent.
        if f.len() > 100_000 {
            f.retain(|_, t| t.last().is_some_and(|t| t.elapsed() < LOCKOUT));
        }
        let times = f.entry(ip).or_default();
        times.push(Instant::now());
        if times.len() > MAX_FAILURES {
            times.remove(0);
        }
    }

    /// Checks the operator token given for an action: the token id, or the
    /// refusal (logged, and counted against `peer`).
    pub(crate) fn check_action(
        &self,
        peer: SocketAddr,
        action: &str,
        given: Option<&str>,
    ) -> Result<String, (StatusCode, String)> {
        if self.store_read_only {
            return Err(self.refused(peer, action, StatusCode::FORBIDDEN, STORE_READ_ONLY));
        }
        let Some(expected) = &self.action else {
            return Err(self.refused(
                peer,
                action,
                StatusCode::FORBIDDEN,
                "actions are disabled: OUTBOX_SERVE_TOKEN is not set (the monitor is read-only)",
            ));
        };
        if self.locked_out(peer.ip()) {
            return Err(self.refused(peer, action, StatusCode::TOO_MANY_REQUESTS, LOCKED_OUT));
        }
        match given {
            None => Err(self.refused(
                peer,
                action,
                StatusCode::UNAUTHORIZED,
                "this action needs the operator token (form field `token` or `Authorization: Bearer`)",
            )),
            Some(t) if expected.matches(t) => Ok(expected.id.clone()),
            Some(_) => {
                self.failed(peer.ip());
                Err(self.refused(peer, action, StatusCode::FORBIDDEN, "wrong operator token"))
            }
        }
    }

    /// Whether the monitor offers actions: a token is set and the
    /// databases are not open read-only.
    pub(crate) fn acts(&self) -> bool {
        self.action.is_some() && !self.store_read_only
    }

    /// Logs a refusal on the audit target and returns it.
    pub(crate) fn refused(
        &self,
        peer: SocketAddr,
        what: &str,
        status: StatusCode,
        why: &str,
    ) -> (StatusCode, String) {
        tracing::warn!(target: "outbox::audit", %peer, what, status = status.as_u16(), "refused: {why}");
        self.record(AuditEntry {
            at: now(),
            peer,
            token: None,
            action: what.to_owned(),
            on: String::new(),
            result: format!("refused ({}): {why}", status.as_u16()),
        });
        (status, why.to_owned())
    }

    /// Keeps `entry` for the audit page (the log line is the durable record).
    pub(crate) fn record(&self, entry: AuditEntry) {
        let mut audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        if audit.len() == AUDIT_KEPT {
            audit.pop_front();
        }
        audit.push_back(entry);
    }

    /// The kept audit entries, newest first.
    pub(crate) fn audit_entries(&self) -> Vec<AuditEntry> {
        let audit = self.audit.lock().unwrap_or_else(|e| e.into_inner());
        audit.iter().rev().cloned().collect()
    }

    /// The refusal of a read without valid credentials (only asked for
    /// off loopback), if it is one.
    fn refuse_read(&self, peer: SocketAddr, headers: &HeaderMap) -> Option<Response> {
        if !self.reads_need_credentials {
            return None;
        }
        if self.locked_out(peer.ip()) {
            let (s, why) = self.refused(peer, "read", StatusCode::TOO_MANY_REQUESTS, LOCKED_OUT);
            return Some(line(s, &why));
        }
        let given = credentials(headers);
        let ok = given.as_deref().is_some_and(|g| {
            self.read.as_ref().is_some_and(|t| t.matches(g))
                || self.action.as_ref().is_some_and(|t| t.matches(g))
        });
        if ok {
            return None;
        }
        if given.is_some() {
            self.failed(peer.ip());
        }
        let (s, why) = self.refused(
            peer,
            "read",
            StatusCode::UNAUTHORIZED,
            "this monitor needs credentials: the read token or the operator token, as Bearer or Basic",
        );
        let mut r = line(s, &why);
        challenge(&mut r, true);
        Some(r)
    }
}

/// This process's clock as a timestamp (the audit page's times).
pub(crate) fn now() -> outbox_core::Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    outbox_core::Timestamp::from_millis(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Adds the `WWW-Authenticate` challenges of a 401: Bearer (what scripts
/// and Prometheus send), then Basic where it is taken (reads: what a browser
/// asks its user for; a browser skips the Bearer scheme it does not know).
pub(crate) fn challenge(res: &mut Response, basic: bool) {
    let h = res.headers_mut();
    h.append(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"outbox monitor\""),
    );
    if basic {
        h.append(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"outbox monitor\", charset=\"UTF-8\""),
        );
    }
}

const LOCKED_OUT: &str = "too many refused credentials from this address: try again later";

/// The token of an `Authorization` header: Bearer, or the password of
/// Basic (schemes in any case).
fn credentials(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.trim().to_owned());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = String::from_utf8(base64_decode(rest.trim())?).ok()?;
        return decoded.split_once(':').map(|(_, password)| password.to_owned());
    }
    None
}

/// The operator token of an `Authorization: Bearer` header (any case);
/// Basic is never taken for an action.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Standard base64 (padding optional); `None` when malformed.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// A one-line plain-text answer.
pub(crate) fn line(status: StatusCode, msg: &str) -> Response {
    let mut text = msg.replace('\n', " ");
    text.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

/// The pages that read much (the lag scan, digests): limited in number.
fn expensive(path: &str) -> bool {
    matches!(
        path,
        "/" | "/blocked" | "/dead" | "/partitions" | "/sinks" | "/runs" | "/metrics"
    )
}

/// The middleware every request passes (see the module documentation).
pub(crate) async fn front_door(
    State(door): State<Arc<Door>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
    next: Next,
) -> Response {
    if req.uri().to_string().len() > MAX_TARGET {
        return line(StatusCode::URI_TOO_LONG, "request target too long");
    }
    let head: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if head > MAX_HEADERS {
        return line(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request headers too large",
        );
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > door.body_limit as u64) {
        return line(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body too large (limit {} bytes)", door.body_limit),
        );
    }
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !door.hosts.allows(host) {
        let shown = crate::output::visible(host).into_owned();
        let (s, why) = door.refused(
            peer,
            "host",
            StatusCode::MISDIRECTED_REQUEST,
            &format!("host {shown:?} is not one this monitor answers to (--allowed-hosts)"),
        );
        return line(s, &why);
    }
    let action = req.method() == Method::POST && req.uri().path().starts_with("/actions/");
    if !action && let Some(refused) = door.refuse_read(peer, req.headers()) {
        return refused;
    }
    let _slot = if expensive(req.uri().path()) {
        match door.pages.try_acquire() {
            Ok(p) => Some(p),
            Err(_) => {
                tracing::warn!(target: "outbox::audit", %peer, path = req.uri().path(),
                    "busy: {} expensive pages are being served (--max-busy-pages); answered 503",
                    door.busy_pages);
                let mut r = line(StatusCode::SERVICE_UNAVAILABLE, "busy: try again in a second");
                r.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                return r;
            }
        }
    } else {
        None
    };
    let res = match tokio::time::timeout(door.request_timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!(target: "outbox::audit", %peer,
                "request timed out after {:?} (--request-timeout-ms)", door.request_timeout);
            return line(StatusCode::REQUEST_TIMEOUT, "request took too long");
        }
    };
    one_line_errors(res)
}

/// Gives an error answer that has no body one line saying what it is.
fn one_line_errors(res: Response) -> Response {
    use axum::body::HttpBody;
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) || res.body().size_hint().exact() != Some(0) {
        return res;
    }
    let reason = status.canonical_reason().unwrap_or("error").to_ascii_lowercase();
    let mut out = line(status, &reason);
    for (k, v) in res.headers() {
        if k != header::CONTENT_TYPE && k != header::CONTENT_LENGTH {
            out.headers_mut().insert(k, v.clone());
        }
    }
    out
}

/// The most header lines a request head may have (hyper's own limit is
/// 100, answered with an empty 431).
const MAX_HEADER_LINES: usize = 64;

/// A connection whose request head was read already: the head is read
/// again from the buffer, then the rest from the socket. It keeps its
/// place among the [`Waiting`] connections until the body its head
/// declares has been read (for ever with a chunked body, whose end this
/// does not look for: browsers and scrapers send none).
pub(crate) struct Prefixed {
    head: Vec<u8>,
    at: usize,
    stream: tokio::net::TcpStream,
    /// Bytes read from the socket so far, head included.
    received: u64,
    /// Where the request ends, when its length is known.
    request_end: Option<u64>,
    place: Option<WaitingPlace>,
}

impl Prefixed {
    fn received(&mut self, n: usize) {
        self.received += n as u64;
        if self.request_end.is_some_and(|end| self.received >= end) {
            self.place = None;
        }
    }
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.received(n);
        polled
    }
}

impl tokio::io::AsyncWrite for Prefixed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What a request head read so far looks like, fed as it arrives: each
/// byte is looked at once, so a client sending its head byte by byte costs
/// no more than one sending it whole.
#[derive(Default)]
struct HeadScan {
    /// Where the next look starts.
    scanned: usize,
    /// Where the header lines start, once the request line has ended.
    headers_from: Option<usize>,
    /// Where the current header line starts.
    line_from: usize,
    /// Header lines ended so far.
    lines: usize,
    /// Where the head ends (past its empty line), once it has.
    end: usize,
}

impl HeadScan {
    /// `buf` is the head so far (what was fed before, and more): `Ok(true)`
    /// when it is complete and fit for hyper, `Ok(false)` when more must
    /// come, `Err` with the answer when it is refused.
    fn feed(&mut self, buf: &[u8]) -> Result<bool, (StatusCode, &'static str)> {
        let Some(from) = self.headers_from else {
            let Some(end) = buf[self.scanned..].iter().position(|&b| b == b'\n') else {
                self.scanned = buf.len();
                if buf.len() > MAX_TARGET + 32 {
                    return Err((StatusCode::URI_TOO_LONG, "request target too long"));
                }
                return Ok(false);
            };
            let end = self.scanned + end;
            request_line(&buf[..end])?;
            self.headers_from = Some(end + 1);
            self.line_from = end + 1;
            self.scanned = end + 1;
            return self.feed(buf);
        };
        for i in self.scanned..buf.len() {
            if buf[i] != b'\n' {
                continue;
            }
            let line = &buf[self.line_from..i];
            if line.is_empty() || line == b"\r" {
                self.end = i + 1;
                return Ok(true);
            }
            self.lines += 1;
            self.line_from = i + 1;
            if self.lines > MAX_HEADER_LINES {
                return Err(HEADERS_TOO_LARGE);
            }
        }
        self.scanned = buf.len();
        if buf.len() - from > MAX_HEADERS {
            return Err(HEADERS_TOO_LARGE);
        }
        Ok(false)
    }
}

const HEADERS_TOO_LARGE: (StatusCode, &str) = (
    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
    "request headers too large",
);

/// Checks a request line's shape, "METHOD SP target SP HTTP/1.x", and its
/// target's length.
fn request_line(line: &[u8]) -> Result<(), (StatusCode, &'static str)> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    if parts.get(1).is_some_and(|t| t.len() > MAX_TARGET) {
        return Err((StatusCode::URI_TOO_LONG, "request target too long"));
    }
    let well_formed = parts.len() == 3
        && !parts[0].is_empty()
        && parts[0].iter().all(u8::is_ascii_uppercase)
        && !parts[1].is_empty()
        && parts[2].starts_with(b"HTTP/1.");
    if !well_formed {
        return Err((StatusCode::BAD_REQUEST, "malformed request line"));
    }
    Ok(())
}

/// The end of a request whose head is `head[..end]`: the head plus its
/// `Content-Length` (none: no body); `None` for a chunked body.
fn request_end(head: &[u8], end: usize) -> Option<u64> {
    let mut length = 0;
    for line in head[..end].split(|&b| b == b'\n').skip(1) {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return None;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            // Unparsable: hyper refuses the request; nothing to wait for.
            length = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(end as u64 + length)
}

/// Reads the request head of a new connection within `--head-timeout-ms`
/// and hands the connection on, head included, with its `place` among the
/// waiting ones; or answers it here with one line (408, 400, 414, 431;
/// logged) and closes it: `None`.
pub(crate) async fn read_head(
    door: &Door,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
    place: WaitingPlace,
) -> Option<Prefixed> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let mut scan = HeadScan::default();
    let read = tokio::time::timeout(door.head_timeout, async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => n,
            };
            head.extend_from_slice(&chunk[..n]);
            match scan.feed(&head) {
                Ok(true) => return Some(Ok(())),
                Ok(false) => {}
                Err(refused) => return Some(Err(refused)),
            }
        }
    })
    .await;
    let (status, why) = match read {
        // Closed before a whole head: nothing to answer.
        Ok(None) => return None,
        Ok(Some(Ok(()))) => {
            let request_end = request_end(&head, scan.end);
            let mut conn = Prefixed {
                head,
                at: 0,
                stream,
                received: 0,
                request_end,
                place: Some(place),
            };
            // The head's reads may hold the whole body already (or there
            // is none): then the request is in.
            conn.received(conn.head.len());
            return Some(conn);
        }
        Ok(Some(Err(refused))) => refused,
        Err(_) if head.is_empty() => {
            tracing::info!(target: "outbox::audit", %peer,
                "connection closed: no request within {:?} (--head-timeout-ms)", door.head_timeout);
            return None;
        }
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            "request head not received in time (--head-timeout-ms)",
        ),
    };
    tracing::warn!(target: "outbox::audit", %peer, status = status.as_u16(), "refused: {why}");
    let answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
         x-content-type-options: nosniff\r\nx-frame-options: DENY\r\n\
         content-security-policy: default-src 'none'; frame-ancestors 'none'\r\n\
         referrer-policy: same-origin\r\ncache-control: no-store\r\nconnection: close\r\n\r\n{why}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        why.len() + 1,
    );
    // Then what the client still sends is read and dropped (a socket
    // closed with unread input resets, and the client may lose the answer);
    // bounded in time and bytes, as the client may neither read nor stop.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(answer.as_bytes()).await;
        let _ = stream.shutdown().await;
        let mut sink = [0u8; 4096];
        let mut left = 1usize << 20;
        while let Ok(n @ 1..) = stream.read(&mut sink).await {
            left = left.saturating_sub(n);
            if left == 0 {
                break;
            }
        }
    })
    .await;
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_ends_after_the_body_its_head_declares() {
        let end_of = |head: &[u8]| {
            let mut scan = HeadScan::default();
            assert_eq!(scan.feed(head), Ok(true));
            assert_eq!(scan.end, head.len());
            request_end(head, scan.end)
        };
        let get = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
        assert_eq!(end_of(get), Some(get.len() as u64));
        let post = b"POST /a HTTP/1.1\r\ncontent-LENGTH: 12\r\n\r\n";
        assert_eq!(end_of(post), Some(post.len() as u64 + 12));
        let chunked = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(end_of(chunked), None);
    }

    #[test]
    fn guessable_tokens_are_refused() {
        assert!(check_strength("short").is_err());
        assert!(check_strength("xxxxxxxxxxxxxxxx").is_err());
        assert!(check_strength("passwordpassword").is_err());
        assert!(check_strength("abababababababababababab").is_err());
        for run in [
            "abcdefghijklmnop",
            "0123456789abcdef",
            "abcdefghijklmnopqrstuvwxyz012345",
            "zyxwvutsrqponmlkjihgfedcba",
            "aaaaaaaabbbbbbbbccccccccdddddddd",
        ] {
            let why = check_strength(run).unwrap_err();
            assert!(why.contains("guessable"), "{run}: {why}");
        }
        assert!(check_strength("read-token-9f8e7d6c5b4a3210").is_ok());
        assert!(check_strength("test-token-0123456789abcdef").is_ok());
        assert!(check_strength("3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e").is_ok());
    }

    #[test]
    fn tokens_match_exactly_whatever_their_length() {
        let t = Token::new("3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e");
        assert!(t.matches("3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e"));
        for wrong in [
            "",
            "3f9a",
            "3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2",
            "3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2ee",
        ] {
            assert!(!t.matches(wrong), "{wrong}");
        }
        assert_eq!(t.id.len(), 8);
        assert!(!"3f9a1c0e7b2d4f6a8c1e3b5d7f9a0c2e".contains(&t.id));
    }

    /// A head fed whole, and fed byte by byte: both must agree.
    fn judge_head(buf: &[u8]) -> Result<bool, (StatusCode, &'static str)> {
        let whole = HeadScan::default().feed(buf);
        let mut scan = HeadScan::default();
        let mut bytewise = Ok(false);
        for n in 1..=buf.len() {
            bytewise = scan.feed(&buf[..n]);
            if bytewise != Ok(false) {
                break;
            }
        }
        assert_eq!(whole, bytewise, "{:?}", String::from_utf8_lossy(buf));
        whole
    }

    #[test]
    fn heads_are_judged_before_hyper_reads_them() {
        assert_eq!(judge_head(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(true));
        assert_eq!(judge_head(b"GET / HTTP/1.1\r\nHost: x\r\n"), Ok(false));
        assert_eq!(judge_head(b"GET / HTTP/1.0\n\n"), Ok(true));
        assert_eq!(judge_head(b"GET / HT"), Ok(false));
        let status = |r: Result<bool, (StatusCode, &str)>| r.unwrap_err().0;
        assert_eq!(
            status(judge_head(b"get / HTTP/1.1\r\n\r\n")),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(judge_head(b"\x16\x03\x01\x02\x00\n")),
            StatusCode::BAD_REQUEST
        );
        let long = format!("GET /{}", "a".repeat(MAX_TARGET + 40));
        assert_eq!(status(judge_head(long.as_bytes())), StatusCode::URI_TOO_LONG);
        let line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_TARGET + 40));
        assert_eq!(status(judge_head(line.as_bytes())), StatusCode::URI_TOO_LONG);
        let lines = |n: usize| {
            let mut h = String::from("GET / HTTP/1.1\r\n");
            for i in 0..n {
                h.push_str(&format!("X-{i}: v\r\n"));
            }
            h + "\r\n"
        };
        assert_eq!(judge_head(lines(MAX_HEADER_LINES).as_bytes()), Ok(true));
        assert_eq!(
            status(judge_head(lines(MAX_HEADER_LINES + 1).as_bytes())),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let big = format!("GET / HTTP/1.1\r\nX: {}\r\n", "a".repeat(MAX_HEADERS));
        assert_eq!(
            status(judge_head(big.as_bytes())),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn hosts_are_matched_without_port_and_case() {
        let lo: SocketAddr = "127.0.0.1:9464".parse().unwrap();
        let h = Hosts::parse(None, lo).unwrap();
        for ok in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST",
            "[::1]:9464",
            "localhost.",
        ] {
            assert!(h.allows(ok), "{ok}");
        }
        for refused in [
            "rebind.attacker.example",
            "rebind.attacker.example:9464",
            "",
            "127.0.0.2",
        ] {
            assert!(!h.allows(refused), "{refused}");
        }
        // Off loopback, by default: the bound address, or any address on an
        // unspecified bind; never a name not configured.
        let one: SocketAddr = "10.0.0.5:9464".parse().unwrap();
        let h = Hosts::parse(None, one).unwrap();
        assert!(h.allows("10.0.0.5:9464") && h.allows("localhost"));
        assert!(!h.allows("10.0.0.6") && !h.allows("monitor.internal"));
        let any: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        let h = Hosts::parse(None, any).unwrap();
        assert!(h.allows("192.168.1.20:9464") && h.allows("[fe80::1]:9464") && h.allows("localhost"));
        assert!(!h.allows("monitor.internal") && !h.allows("rebind.attacker.example"));
        let v6: SocketAddr = "[2001:db8::5]:9464".parse().unwrap();
        assert!(Hosts::parse(None, v6).unwrap().allows("[2001:DB8::5]:9464"));
        // Bare IPv6 addresses in the list keep every colon.
        let h = Hosts::parse(Some("::1, 2001:db8::5"), any).unwrap();
        assert!(h.allows("[2001:db8::5]:9464") && h.allows("[::1]"), "{h:?}");
        let h = Hosts::parse(Some("monitor.internal, 10.0.0.5"), any).unwrap();
        assert!(h.allows("monitor.internal:9464") && h.allows("10.0.0.5"));
        assert!(!h.allows("localhost"));
        assert!(Hosts::parse(Some("*"), any).unwrap().allows("anything"));
        assert!(Hosts::parse(Some("bad host"), any).is_err());
    }

    #[test]
    fn credentials_take_bearer_and_basic_in_any_case() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer abc"));
        assert_eq!(credentials(&h).as_deref(), Some("abc"));
        assert_eq!(bearer(&h), Some("abc"));
        // "ops:s3cret-token"
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("BASIC b3BzOnMzY3JldC10b2tlbg=="),
        );
        assert_eq!(credentials(&h).as_deref(), Some("s3cret-token"));
        assert_eq!(bearer(&h), None, "Basic never carries an action's token");
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!!"));
        assert_eq!(credentials(&h), None);
    }

    #[test]
    fn an_address_is_locked_out_after_too_many_refusals() {
        let door = Door::new(&DoorConfig {
            bound: "127.0.0.1:0".parse().unwrap(),
            allowed_hosts: None,
            max_connections: 4,
            head_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            busy_pages: 1,
            body_limit: 1024,
            what: "test",
        })
        .unwrap();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        for _ in 0..MAX_FAILURES - 1 {
            door.failed(ip);
        }
        assert!(!door.locked_out(ip));
        door.failed(ip);
        assert!(door.locked_out(ip));
        assert!(!door.locked_out("10.1.2.4".parse().unwrap()));
    }
}
