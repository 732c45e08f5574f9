//! Trace export over OTLP/HTTP (feature `otel`).
//!
//! When `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set and `OTEL_SDK_DISABLED` is not `true`, [`crate::drive`] adds a
//! `tracing-opentelemetry` layer to the subscriber it installs: every span at
//! `info` or above (the runtime's `worker`, `sweep`, `stream` and `apply`)
//! becomes an OpenTelemetry span, batched and sent as protobuf to
//! `<endpoint>/v1/traces` by a background thread. The exporter reads the
//! standard variables itself (endpoint, `OTEL_EXPORTER_OTLP_HEADERS`,
//! timeout, compression); the resource reads `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES`, and the service name defaults to the binary's
//! name. [`Export::shutdown`] flushes what is queued before the process
//! exits. Nothing here prints a variable's value: the headers can carry a
//! token, the endpoint credentials.

use opentelemetry::Key;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{ExporterBuildError, SpanExporter};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::registry::LookupSpan;

/// The variables that turn the export on: the exporter's endpoint, general
/// or for traces only.
const ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
];

/// A running trace export: the tracer provider and its batch thread.
pub(crate) struct Export {
    provider: SdkTracerProvider,
}

/// `true` when the environment asks for trace export.
fn wanted(var: impl Fn(&str) -> Option<String>) -> bool {
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && ENDPOINTS
            .iter()
            .any(|name| var(name).is_some_and(|v| !v.trim().is_empty()))
}

/// A build error without the values it may quote: a configuration error
/// whose reason quotes a value (`invalid endpoint '...'`: an endpoint can
/// carry credentials) shows only the setting's name.
fn describe(e: &ExporterBuildError) -> String {
    match e {
        ExporterBuildError::InvalidConfiguration(what) if what.contains('\'') => {
            let setting = what.split(':').next().unwrap_or_default();
            format!("invalid exporter configuration: {setting}")
        }
        other => other.to_string(),
    }
}

/// The resource of the exported spans: what `OTEL_SERVICE_NAME` and
/// `OTEL_RESOURCE_ATTRIBUTES` say, with `service.name` = `bin` unless one of
/// them names the service (the SDK would say `unknown_service`).
fn resource(bin: &str) -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder().with_service_name(bin.to_owned()).build()
    }
}

impl Export {
    /// Starts the export when the environment asks for it; `None` when it
    /// does not, or (after a one-line warning on stderr) when the exporter
    /// cannot be built from its variables.
    pub(crate) fn from_env(bin: &str) -> Option<Export> {
        if !wanted(|name| std::env::var(name).ok()) {
            return None;
        }
        let exporter = match SpanExporter::builder().with_http().build() {
            Ok(exporter) => exporter,
            Err(e) => {
                eprintln!(
                    "{bin}: warning: traces are not exported: {}",
                    crate::output::safe(&describe(&e))
                );
                return None;
            }
        };
        let provider = SdkTracerProvider::builder()
            .with_resource(resource(bin))
            .with_batch_exporter(exporter)
            .build();
        Some(Export { provider })
    }

    /// The layer that turns `tracing` spans at `info` and above into
    /// OpenTelemetry spans, whatever `--log` prints on stderr.
    pub(crate) fn layer<S>(&self) -> impl Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer("outbox");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(LevelFilter::INFO)
    }

    /// Exports what is queued and stops the batch thread; waits for the
    /// collector's answers (bounded by the exporter's timeout,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default).
    pub(crate) fn shutdown(self, bin: &str) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!(
                "{bin}: warning: exporting the last traces failed: {}",
                crate::output::safe(&e.to_string())
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn an_endpoint_turns_the_export_on_and_the_sdk_switch_off() {
        assert!(!wanted(env(&[])));
        assert!(!wanted(env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4318"
        )])));
        assert!(wanted(env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://c/v1/traces"
        )])));
        for off in ["true", "TRUE", " True "] {
            let vars = [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_SDK_DISABLED", off),
            ];
            assert!(!wanted(env(&vars)), "{off:?}");
        }
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_SDK_DISABLED", "false"),
        ];
        assert!(wanted(env(&vars)));
    }

    #[test]
    fn a_build_error_names_the_setting_not_its_value() {
        let e = ExporterBuildError::InvalidConfiguration(
            "OTEL_EXPORTER_OTLP_ENDPOINT: invalid endpoint 'http://user:secret@[x': bad".to_owned(),
        );
        let line = describe(&e);
        assert_eq!(
            line,
            "invalid exporter configuration: OTEL_EXPORTER_OTLP_ENDPOINT"
        );
        assert!(!line.contains("secret"));
        let e = ExporterBuildError::InvalidConfiguration(
            "compression: gzip compression requested but gzip-http feature not enabled".to_owned(),
        );
        assert_eq!(
            describe(&e),
            "invalid exporter configuration: compression: gzip compression requested but gzip-http feature not enabled"
        );
    }
}
