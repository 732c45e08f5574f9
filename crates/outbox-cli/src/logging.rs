//! The subscriber [`crate::drive`] installs: the library crates' events on
//! stderr, filtered by `--log`, and (feature `otel`) the spans exported over
//! OTLP.
//!
//! The runtime's spans carry OpenTelemetry semantic-convention fields
//! (`otel.kind`, `messaging.*`, `db.*`) for the exporter; they repeat what the
//! span's own fields say (`stream`), so stderr leaves them out: [`Fields`] is
//! the default field format without them.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// Field name prefixes meant for the OpenTelemetry export only.
const EXPORT_ONLY: [&str; 3] = ["otel.", "messaging.", "db."];

/// Whether stderr leaves a field out.
fn export_only(name: &str) -> bool {
    EXPORT_ONLY.iter().any(|p| name.starts_with(p))
}

/// tracing-subscriber's default field format (`message` first, then
/// `name=value` with values in `Debug` form, names in italics on a terminal)
/// without the export-only fields.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Fields;

impl<'writer> FormatFields<'writer> for Fields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = Visitor {
            ansi: writer.has_ansi_escapes(),
            writer,
            first: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'w> {
    writer: Writer<'w>,
    ansi: bool,
    first: bool,
    result: fmt::Result,
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record_debug(field, &format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if self.result.is_err() || export_only(name) {
            return;
        }
        if !self.first {
            self.result = self.writer.write_char(' ');
        }
        self.first = false;
        let name = name.strip_prefix("r#").unwrap_or(name);
        self.result = self.result.and_then(|()| match name {
            "message" => write!(self.writer, "{value:?}"),
            _ if self.ansi => write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m{value:?}"),
            _ => write!(self.writer, "{name}={value:?}"),
        });
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Buf {
            self.clone()
        }
    }

    #[test]
    fn stderr_leaves_the_export_only_fields_out() {
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(Fields)
            .with_writer(buf.clone())
            .with_ansi(false)
            .with_target(false)
            .without_time()
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(
                "stream",
                stream = %"s-1",
                otel.kind = "consumer",
                messaging.system = "outbox",
                messaging.destination.name = %"s-1",
                db.system.name = "sqlite",
                n = 3
            );
            let _entered = span.enter();
            tracing::warn!(error = %"boom", quoted = "q", "stream pass interrupted");
        });
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert_eq!(
            out.trim(),
            "WARN stream{stream=s-1 n=3}: stream pass interrupted error=boom quoted=\"q\""
        );
    }
}
