//! A VMI's worker, restarted when it panics.
//!
//! Each VMI has its own worker task, so a panic on one VMI's data never stops the agent or the
//! other VMIs' workers. Left alone, though, the VMI would have no worker until its next watch
//! event (which may never come for a running VM), and the panic would go unreported but for
//! stderr. [`run`] catches it, logs an error naming the VMI, and starts the worker again after a
//! capped exponential backoff ([`RESTART`]); the new worker adopts the VMI's QEMU from its run
//! dir, as after an agent restart (QEMU is never stopped by a worker's death).
//!
//! # Guarantees
//! A worker that returns (the VMI is gone, or the agent stops) is not restarted; one that
//! panics is, forever, at most once per [`RESTART`]'s cap.

use std::future::Future;
use std::time::Duration;

use client::backoff::{Backoff, Jitter};

/// The delay before restarting a worker that panicked: 1 s, doubling, at most 5 minutes.
pub const RESTART: Backoff = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(300), jitter: Jitter::Full };

/// Runs the worker `start` makes for `object` (`namespace/name`), starting it again after a
/// backoff each time it panics; returns when a worker returns.
pub async fn run<F, Fut>(object: String, mut start: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut restarts: u32 = 0;
    while client::panics::catch(format!("VMI {object}"), "worker", start()).await.is_err() {
        restarts = restarts.saturating_add(1);
        let delay = RESTART.delay(restarts);
        tracing::error!("VMI {object}: its worker panicked ({restarts} time(s)); starting it again in {delay:?}");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_worker_is_started_again_with_backoff_and_one_that_returns_is_not() {
        let starts = Arc::new(AtomicU32::new(0));
        let t0 = tokio::time::Instant::now();
        let counter = Arc::clone(&starts);
        run("default/vm".into(), move || {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(n >= 2, "worker {n} meets bad data");
            }
        })
        .await;
        assert_eq!(starts.load(Ordering::SeqCst), 3, "two panics, then a worker that returns");
        // Full jitter: each wait is between the base and the nominal delay (1 s, then 2 s).
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_secs(2) && waited <= Duration::from_secs(3), "{waited:?}");
    }
}
