//! The JetStream sink.

use std::time::Duration;

use std::sync::Arc;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, Context};
use outbox_core::{Error, Event, EventTypeFilter, Published, Result, Sink, SinkName, message_id};
use tokio::sync::OnceCell;
use tracing::debug;

use crate::Subjects;

/// How a [`NatsSink`] publishes.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NatsSinkOptions {
    /// Which subject each event goes to. Default: `outbox.<event type>`.
    pub subjects: Subjects,
    /// The publication policy. Default: every event.
    pub policy: EventTypeFilter,
    /// How long one publish waits for JetStream's acknowledgement before it
    /// counts as failed (and is retried, with the same message id). Default 5 s.
    pub ack_timeout: Duration,
}

impl Default for NatsSinkOptions {
    fn default() -> Self {
        NatsSinkOptions {
            subjects: Subjects::ByEventType("outbox".into()),
            policy: EventTypeFilter::all(),
            ack_timeout: Duration::from_secs(5),
        }
    }
}

impl NatsSinkOptions {
    /// Sets [`NatsSinkOptions::subjects`].
    pub fn with_subjects(mut self, subjects: Subjects) -> Self {
        self.subjects = subjects;
        self
    }

    /// Sets [`NatsSinkOptions::policy`].
    pub fn with_policy(mut self, policy: EventTypeFilter) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`NatsSinkOptions::ack_timeout`].
    pub fn with_ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = timeout;
        self
    }
}

/// A [`Sink`] publishing to NATS JetStream: one message per event, in seq
/// order, each acknowledged by JetStream before the next is sent, with the
/// `Nats-Msg-Id` header set to `stream:seq`, so the stream's duplicate
/// window drops a redelivery. The other headers carry the event's identity
/// and metadata (`Outbox-Stream`, `Outbox-Seq`, `Outbox-Event-Type`,
/// `Outbox-Global-Position`, `Outbox-Recorded-At`, and
/// `Outbox-Correlation-Id` / `Outbox-Causation-Id` when set); the payload is
/// the event's payload, unchanged.
///
/// A JetStream stream must capture the subjects (see
/// [`NatsSink::ensure_stream`]); a publish to a subject no stream captures
/// fails, and the stream is retried with backoff like any failure.
#[derive(Clone, Debug)]
pub struct NatsSink {
    name: SinkName,
    js: Arc<OnceCell<Context>>,
    /// Where a lazy sink connects on first use (`None`: connected already).
    url: Option<Arc<str>>,
    options: NatsSinkOptions,
}

impl NatsSink {
    /// A sink called `name` publishing through `client`.
    /// `InvalidInput` for a subject that NATS cannot take.
    pub fn new(name: SinkName, client: async_nats::Client, options: NatsSinkOptions) -> Result<Self> {
        options.subjects.validate()?;
        let js = context(client, &options);
        Ok(NatsSink {
            name,
            js: Arc::new(OnceCell::new_with(Some(js))),
            url: None,
            options,
        })
    }

    /// A sink called `name` that connects to `url` on its first publish
    /// (and keeps trying at each publish until it has), for programs that
    /// register their sinks before any async runtime runs, such as an
    /// `outbox_cli::App`. A publish while it cannot connect fails and is
    /// retried with the runtime's backoff.
    pub fn lazy(name: SinkName, url: &str, options: NatsSinkOptions) -> Result<Self> {
        options.subjects.validate()?;
        Ok(NatsSink {
            name,
            js: Arc::new(OnceCell::new()),
            url: Some(url.into()),
            options,
        })
    }

    /// Connects to `url` (`nats://host:port`) now and makes a sink called
    /// `name`: a temporary error when the server cannot be reached (see
    /// [`NatsSink::lazy`] to connect on first use instead). Once connected,
    /// the client reconnects on its own. The URL is not shown in errors (it
    /// may carry credentials).
    pub async fn connect(name: SinkName, url: &str, options: NatsSinkOptions) -> Result<Self> {
        let sink = Self::lazy(name, url, options)?;
        sink.context().await?;
        Ok(sink)
    }

    /// The JetStream context, connecting a lazy sink first.
    async fn context(&self) -> Result<&Context> {
        self.js
            .get_or_try_init(|| async {
                let url = self.url.as_deref().unwrap_or_default();
                let client = async_nats::ConnectOptions::new()
                    .connect(url)
                    .await
                    .map_err(|e| Error::temporary("connecting to NATS (url not shown)", e))?;
                Ok(context(client, &self.options))
            })
            .await
    }

    /// Creates the JetStream stream `stream` capturing `subjects` with a
    /// duplicate window of `window` (the time within which a redelivered
    /// message id is dropped), unless a stream of that name exists.
    pub async fn ensure_stream(&self, stream: &str, subjects: Vec<String>, window: Duration) -> Result<()> {
        self.context()
            .await?
            .get_or_create_stream(jetstream::stream::Config {
                name: stream.to_owned(),
                subjects,
                duplicate_window: window,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::temporary(format!("creating JetStream stream {stream}"), e))?;
        Ok(())
    }

    /// The JetStream context it publishes through (connecting a lazy sink).
    pub async fn jetstream(&self) -> Result<&Context> {
        self.context().await
    }

    async fn publish_one(&self, event: &Event) -> std::result::Result<(), outbox_core::BoxError> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", message_id(event).as_str());
        headers.insert("Outbox-Stream", event.stream.as_str());
        headers.insert("Outbox-Seq", event.seq.to_string().as_str());
        headers.insert("Outbox-Event-Type", event.event_type.as_str());
        headers.insert(
            "Outbox-Global-Position",
            event.global_position.to_string().as_str(),
        );
        headers.insert(
            "Outbox-Recorded-At",
            event.metadata.recorded_at.as_millis().to_string().as_str(),
        );
        if let Some(c) = &event.metadata.correlation_id {
            headers.insert("Outbox-Correlation-Id", c.as_str());
        }
        if let Some(c) = &event.metadata.causation_id {
            headers.insert("Outbox-Causation-Id", c.as_str());
        }
        let ack = self
            .context()
            .await?
            .publish_with_headers(
                self.options.subjects.of(event),
                headers,
                bytes::Bytes::copy_from_slice(&event.payload),
            )
            .await?
            .await?;
        if ack.duplicate {
            debug!(sink = %self.name, id = %message_id(event), "JetStream dropped a redelivery");
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &SinkName {
        &self.name
    }

    fn accepts(&self, event: &Event) -> bool {
        self.options.policy.accepts(event)
    }

    async fn publish(&self, events: &[Event]) -> Published {
        for (i, event) in events.iter().enumerate() {
            if let Err(e) = self.publish_one(event).await {
                return Published::failed(i, e);
            }
        }
        Published::all(events.len())
    }
}

/// A JetStream context whose acknowledgement wait is the sink's.
fn context(client: async_nats::Client, options: &NatsSinkOptions) -> Context {
    let mut js = jetstream::new(client);
    js.set_timeout(options.ack_timeout);
    js
}
