//! Per-object work that must not take its long-lived task down with it.
//!
//! A controller's reconcile or a node agent's worker runs for one object at a time; a bug that
//! panics on one object's data must not stop the work on every other object. [`catch`] runs
//! such work and turns a panic into an error naming the object, for the caller to log and
//! retry with backoff like any other error.
//!
//! # Caveats
//! The panic hook still runs (the panic is printed on stderr as usual); state the work shared
//! with others must be consistent at every await point, as it must for cancellation anyway.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Work on one object panicked.
#[derive(Debug, thiserror::Error)]
#[error("{object}: {what} panicked: {message}")]
pub struct Panicked {
    /// The object (`namespace/name`, or a key).
    pub object: String,
    /// What was being done (`reconcile`, `worker`).
    pub what: &'static str,
    /// The panic's message.
    pub message: String,
}

pub use api::diag::panic_message as message;

/// A future whose panics are caught (see [`catch`]).
struct CatchUnwind<F: Future> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.inner.as_mut();
        match catch_unwind(AssertUnwindSafe(move || inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// Runs `work` for `object`; a panic in it becomes [`Panicked`] (logged here as an error).
///
/// # Errors
/// [`Panicked`] when `work` panicked.
pub async fn catch<T>(object: String, what: &'static str, work: impl Future<Output = T>) -> Result<T, Panicked> {
    match (CatchUnwind { inner: Box::pin(work) }).await {
        Ok(v) => Ok(v),
        Err(payload) => {
            let p = Panicked { object, what, message: message(payload.as_ref()) };
            tracing::error!("{p}; the task goes on with the other objects and retries this one with backoff");
            Err(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_becomes_an_error_naming_the_object_and_a_value_passes_through() {
        assert_eq!(catch("ns/a".into(), "reconcile", async { 7 }).await.ok(), Some(7));
        let e = catch("ns/b".into(), "reconcile", async {
            tokio::task::yield_now().await;
            let v: Vec<u8> = Vec::new();
            v[usize::from(v.is_empty())]
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("the panic was caught"));
        assert_eq!((e.object.as_str(), e.what), ("ns/b", "reconcile"));
        assert!(e.message.contains("index out of bounds"), "{e}");
    }
}
