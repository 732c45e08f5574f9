//! OpenTelemetry trace export (outbox-cli's `otel` feature, which the demo
//! enables): the real binary drains a backlog with `work --once` while a
//! collector of this test listens on loopback for OTLP/HTTP (protobuf) at
//! `/v1/traces`. The binary flushes its spans before it exits, so by the
//! time the command returns every request has been answered: the test reads
//! what arrived, with a timeout only as a failure guard.

mod support;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use support::{PATIENCE, Server, Site};

/// What one export request carried.
struct Export {
    authorization: Option<String>,
    request: ExportTraceServiceRequest,
}

/// A loopback OTLP/HTTP collector on its own thread: every request to
/// `/v1/traces` is decoded and sent on the channel, then answered 200.
struct Collector {
    endpoint: String,
    received: mpsc::Receiver<Export>,
}

impl Collector {
    fn start() -> Collector {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the collector");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let endpoint = format!("http://{}", listener.local_addr().expect("collector address"));
        let (tx, received) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("collector runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                let app = Router::new().route("/v1/traces", post(traces)).with_state(tx);
                axum::serve(listener, app).await.expect("collector serves");
            });
        });
        Collector { endpoint, received }
    }

    /// The next request; fails when none arrives within [`PATIENCE`].
    fn next(&self) -> Export {
        self.received
            .recv_timeout(PATIENCE)
            .expect("the collector received no trace export")
    }

    /// Every request that has arrived; fails when none arrived within
    /// [`PATIENCE`].
    fn exports(&self) -> Vec<Export> {
        let mut all = vec![self.next()];
        all.extend(self.received.try_iter());
        all
    }
}

async fn traces(State(tx): State<mpsc::Sender<Export>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let _ = tx.send(Export {
        authorization,
        request,
    });
    StatusCode::OK
}

/// `outbox-demo ARGS` on the site with no inherited `OTEL_*` variable, then
/// `env`: (exit code, stdout, stderr).
fn run(site: &Site, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = site.command(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("OTEL_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.envs(env.iter().copied()).output().expect("run outbox-demo");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One exported span, flattened: its resource's service name, its name,
/// kind and attributes (values as text).
#[derive(Debug)]
struct Span {
    service: String,
    name: String,
    kind: i32,
    attrs: BTreeMap<String, String>,
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), text(&kv.value))).collect()
}

fn spans(exports: &[Export]) -> Vec<Span> {
    let mut out = Vec::new();
    for e in exports {
        for rs in &e.request.resource_spans {
            let resource = attrs(rs.resource.as_ref().map_or(&[][..], |r| &r.attributes));
            let service = resource.get("service.name").cloned().unwrap_or_default();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out.push(Span {
                        service: service.clone(),
                        name: s.name.clone(),
                        kind: s.kind,
                        attrs: attrs(&s.attributes),
                    });
                }
            }
        }
    }
    out
}

const CAMPAIGNS: [&str; 3] = ["otel-a", "otel-b", "otel-c"];
/// Events per campaign of the demo's fixture (`support::campaign`).
const PER_CAMPAIGN: i64 = 7;
const SECRET: &str = "Bearer otel-test-secret-7f3a";

/// Drains the backlog with `work --once` and the export on; the spans the
/// collector received, after checking the command's output and that the
/// headers variable reached the collector and never stderr.
fn drain_with_export(extra_env: &[(&str, &str)]) -> Vec<Span> {
    let site = Site::migrated();
    site.seed_backlog(&CAMPAIGNS.map(|c| (c, false)));
    let collector = Collector::start();
    let headers = format!("authorization={SECRET}");
    let mut env = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_HEADERS", headers.as_str()),
        ("NO_PROXY", "127.0.0.1"),
        ("no_proxy", "127.0.0.1"),
    ];
    env.extend_from_slice(extra_env);
    let (code, out, err) = run(&site, &["work", "--once", "--log", "debug"], &env);
    assert_eq!(code, Some(0), "work --once failed:\n{out}\n{err}");
    assert!(out.contains("3 due stream(s), 21 claimed, 21 completed"), "{out}");
    assert!(
        !err.contains("otel-test-secret"),
        "stderr shows the headers:\n{err}"
    );
    assert!(
        !err.contains("messaging."),
        "stderr shows export-only fields:\n{err}"
    );
    let exports = collector.exports();
    assert!(
        exports.iter().all(|e| e.authorization.as_deref() == Some(SECRET)),
        "every export carries OTEL_EXPORTER_OTLP_HEADERS"
    );
    spans(&exports)
}

#[test]
fn sweeps_export_one_internal_span_per_batch() {
    // Sweeps on (the default): one `sweep` span for the 3 streams' 21 rows.
    let spans = drain_with_export(&[("OTEL_SERVICE_NAME", "otel-test-service")]);
    let sweeps: Vec<&Span> = spans.iter().filter(|s| s.name == "sweep").collect();
    assert!(!sweeps.is_empty(), "no sweep span: {spans:#?}");
    let mut rows = 0;
    for s in &sweeps {
        assert_eq!(
            s.service, "otel-test-service",
            "OTEL_SERVICE_NAME names the service"
        );
        assert_eq!(s.kind, SpanKind::Internal as i32, "{s:?}");
        assert_eq!(s.attrs["messaging.system"], "outbox", "{s:?}");
        assert_eq!(s.attrs["messaging.operation.type"], "process", "{s:?}");
        assert!(
            !s.attrs.contains_key("otel.kind"),
            "otel.kind is the span's kind: {s:?}"
        );
        rows += s.attrs["messaging.batch.message_count"]
            .parse::<i64>()
            .expect("a count");
    }
    assert_eq!(rows, 3 * PER_CAMPAIGN, "{sweeps:#?}");
}

#[test]
fn streams_export_consumer_spans_named_by_their_stream() {
    // Sweeps off: a `stream` span per stream, an `apply` span per batch.
    let spans = drain_with_export(&[("OUTBOX_SWEEP_ROWS", "0")]);
    let mut applied: BTreeMap<String, i64> = BTreeMap::new();
    let mut streamed = Vec::new();
    for s in &spans {
        assert_eq!(
            s.service, "outbox-demo",
            "the service name defaults to the binary's"
        );
        match s.name.as_str() {
            "stream" | "apply" => {
                assert_eq!(s.kind, SpanKind::Consumer as i32, "{s:?}");
                assert_eq!(s.attrs["messaging.system"], "outbox", "{s:?}");
                assert_eq!(s.attrs["messaging.operation.type"], "process", "{s:?}");
                let stream = s.attrs["messaging.destination.name"].clone();
                assert_eq!(s.attrs["stream"], stream, "the span's own field stays: {s:?}");
                if s.name == "apply" {
                    let n: i64 = s.attrs["messaging.batch.message_count"].parse().expect("a count");
                    *applied.entry(stream).or_default() += n;
                } else {
                    streamed.push(stream);
                }
            }
            _ => {}
        }
    }
    streamed.sort();
    assert_eq!(
        streamed, CAMPAIGNS,
        "one stream span per appended stream: {spans:#?}"
    );
    let want: BTreeMap<String, i64> = CAMPAIGNS.iter().map(|c| (c.to_string(), PER_CAMPAIGN)).collect();
    assert_eq!(applied, want, "apply spans count every row: {spans:#?}");
}

#[test]
fn the_sdk_switch_turns_the_export_off() {
    let site = Site::migrated();
    site.seed_backlog(&[("otel-quiet", false)]);
    let collector = Collector::start();
    let (code, out, err) = run(
        &site,
        &["work", "--once"],
        &[
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
        ],
    );
    assert_eq!(code, Some(0), "work --once failed:\n{out}\n{err}");
    // The binary has exited: an export would have been answered by now.
    assert!(
        collector.received.recv_timeout(Duration::from_millis(0)).is_err(),
        "OTEL_SDK_DISABLED=true still exported"
    );
}

#[test]
fn sigterm_flushes_the_worker_span() {
    // `work` runs until SIGTERM; its `worker` span ends only then, so it
    // reaches the collector only if the graceful shutdown flushes the batch.
    let site = Site::migrated();
    let collector = Collector::start();
    let server = Server::start(
        &site,
        &["work", "--metrics-addr", "127.0.0.1:0"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint),
            ("NO_PROXY", "127.0.0.1"),
            ("no_proxy", "127.0.0.1"),
        ],
        "metrics on http://",
    );
    let mut exports: Vec<Export> = collector.received.try_iter().collect();
    assert!(
        !spans(&exports).iter().any(|s| s.name == "worker"),
        "the worker span ended while the worker runs"
    );
    let status = server.stop();
    assert!(status.success(), "work stopped on SIGTERM with {status}");
    exports.extend(collector.received.try_iter());
    let spans = spans(&exports);
    let worker = spans
        .iter()
        .find(|s| s.name == "worker")
        .unwrap_or_else(|| panic!("no worker span after SIGTERM: {spans:#?}"));
    assert_eq!(worker.service, "outbox-demo", "{worker:?}");
    assert_eq!(worker.kind, SpanKind::Internal as i32, "{worker:?}");
    assert_eq!(worker.attrs["messaging.system"], "outbox", "{worker:?}");
    assert_eq!(
        worker.attrs["kind"], "Apply",
        "the span's own fields stay: {worker:?}"
    );
}
