//! Panics in user code become errors: a small `catch_unwind` for futures and
//! a projection decorator that wraps every hook in it.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use outbox_core::{BoxError, DigestBuilder, Event, FailedEvent, Projection, ProjectionName, async_trait};

/// A boxed future whose polls catch panics: resolves to `Err(message)` when
/// a poll panicked. The inner future is dropped after the panic, as a
/// cancelled future would be.
pub(crate) struct CatchUnwind<'a, T> {
    inner: Pin<Box<dyn Future<Output = T> + Send + 'a>>,
}

impl<'a, T> CatchUnwind<'a, T> {
    pub(crate) fn new(future: impl Future<Output = T> + Send + 'a) -> Self {
        CatchUnwind {
            inner: Box::pin(future),
        }
    }
}

impl<T> Future for CatchUnwind<'_, T> {
    type Output = Result<T, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.inner;
        // Unwind safety: after a panic the inner future is never polled again,
        // and the runtime's shared state is either lock-free counters or
        // behind locks whose poisoning is tolerated.
        match catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(panic_message(payload.as_ref()))),
        }
    }
}

/// The text of a panic payload (`panic!("..")` carries a `&str` or a `String`).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// A projection whose hooks turn a panic into an error of that hook: an
/// applier's panic is then an [`outbox_core::Error::Apply`] of its row, which
/// the worker records as a failure and counts toward the dead-letter
/// threshold, like any returned error.
pub(crate) struct CatchPanic<Tx>(pub(crate) Arc<dyn Projection<Tx>>);

/// Wraps every projection in [`CatchPanic`].
pub(crate) fn catch_panics<Tx: Send + 'static>(
    projections: Vec<Arc<dyn Projection<Tx>>>,
) -> Vec<Arc<dyn Projection<Tx>>> {
    projections
        .into_iter()
        .map(|p| Arc::new(CatchPanic(p)) as Arc<dyn Projection<Tx>>)
        .collect()
}

fn hook_error(hook: &str, message: String) -> BoxError {
    format!("panicked in {hook}: {message}").into()
}

#[async_trait]
impl<Tx: Send + 'static> Projection<Tx> for CatchPanic<Tx> {
    fn name(&self) -> &ProjectionName {
        self.0.name()
    }

    fn documents_only(&self) -> bool {
        self.0.documents_only()
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        self.0.as_any()
    }

    async fn setup(&self, tx: &mut Tx) -> Result<(), BoxError> {
        CatchUnwind::new(self.0.setup(tx))
            .await
            .unwrap_or_else(|m| Err(hook_error("setup", m)))
    }

    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError> {
        CatchUnwind::new(self.0.apply(tx, event))
            .await
            .unwrap_or_else(|m| Err(hook_error("apply", m)))
    }

    fn applies_runs(&self) -> bool {
        self.0.applies_runs()
    }

    /// A panic cannot say which event it met: it is blamed on the run's
    /// first (the trait's documented rule for runs).
    async fn apply_run(&self, tx: &mut Tx, events: &[&Event]) -> Result<(), FailedEvent> {
        CatchUnwind::new(self.0.apply_run(tx, events))
            .await
            .unwrap_or_else(|m| Err(FailedEvent::at(0, hook_error("apply_run", m))))
    }

    async fn reset(&self, tx: &mut Tx) -> Result<(), BoxError> {
        CatchUnwind::new(self.0.reset(tx))
            .await
            .unwrap_or_else(|m| Err(hook_error("reset", m)))
    }

    async fn digest(&self, tx: &mut Tx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        CatchUnwind::new(self.0.digest(tx, out))
            .await
            .unwrap_or_else(|m| Err(hook_error("digest", m)))
    }
}
