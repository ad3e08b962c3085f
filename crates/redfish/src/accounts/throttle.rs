//! Failed logins are slowed per account, not per client address: guessing one account's
//! password from many addresses is slowed all the same, and one account's failures never slow
//! (nor lock out) another account.
//!
//! # Flow
//! Every password check of a user name (one that the verified-credentials digest did not
//! already answer) takes that name's turn: checks of one name run one at a time. After
//! [`FREE_FAILURES`] consecutive failures, each further check first waits
//! `BASE_DELAY × 2^(failures − FREE_FAILURES)`, at most [`MAX_DELAY`]. A success resets the
//! count. Names unknown to the service are throttled the same way (a guess at a user name is a
//! guess too).
//!
//! Credentials the verified digest answers never take a turn: the client that knows the
//! password is not slowed by someone guessing it, and its requests do not reset the guesser's
//! count either (only a password check that succeeds does).
//!
//! # Bounds
//! At most [`MAX_TRACKED`] names are tracked; a name idle for [`FORGET_AFTER`] is forgotten
//! first (its count starts again at zero).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

/// Failures before checks are slowed.
pub const FREE_FAILURES: u32 = 3;
pub const BASE_DELAY: Duration = Duration::from_millis(250);
pub const MAX_DELAY: Duration = Duration::from_secs(8);
pub const MAX_TRACKED: usize = 4096;
pub const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

#[derive(Default)]
struct State {
    failures: u32,
}

struct Entry {
    state: Arc<AsyncMutex<State>>,
    last: Instant,
}

/// The per-name failure counts.
#[derive(Default)]
pub struct Throttle {
    names: Mutex<HashMap<String, Entry>>,
}

/// A name's turn: held while its password is checked.
pub struct Turn {
    guard: tokio::sync::OwnedMutexGuard<State>,
}

impl Turn {
    /// Records the outcome of the check.
    pub fn record(mut self, ok: bool) -> u32 {
        if ok {
            self.guard.failures = 0;
        } else {
            self.guard.failures = self.guard.failures.saturating_add(1);
        }
        self.guard.failures
    }
}

/// The wait before a check after `failures` consecutive failures.
#[must_use]
pub fn delay(failures: u32) -> Duration {
    match failures.checked_sub(FREE_FAILURES) {
        None => Duration::ZERO,
        Some(n) => BASE_DELAY.saturating_mul(1u32.checked_shl(n.min(16)).unwrap_or(u32::MAX)).min(MAX_DELAY),
    }
}

impl Throttle {
    /// Waits for `name`'s turn and its delay.
    pub async fn turn(&self, name: &str) -> Turn {
        let state = {
            let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if names.len() >= MAX_TRACKED && !names.contains_key(name) {
                names.retain(|_, e| now.duration_since(e.last) < FORGET_AFTER);
                if names.len() >= MAX_TRACKED {
                    // Still full of recent names: drop the oldest.
                    if let Some(oldest) = names.iter().min_by_key(|(_, e)| e.last).map(|(k, _)| k.clone()) {
                        names.remove(&oldest);
                    }
                }
            }
            let e = names.entry(name.to_owned()).or_insert_with(|| Entry { state: Arc::default(), last: now });
            e.last = now;
            Arc::clone(&e.state)
        };
        let guard = state.lock_owned().await;
        let wait = delay(guard.failures);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        Turn { guard }
    }

    /// Consecutive failures recorded for `name` (tests, metrics).
    pub async fn failures(&self, name: &str) -> u32 {
        let state = self.names.lock().unwrap_or_else(PoisonError::into_inner).get(name).map(|e| Arc::clone(&e.state));
        match state {
            Some(s) => s.lock().await.failures,
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_grows_after_the_free_failures_and_stops_at_the_cap() {
        assert_eq!(delay(0), Duration::ZERO);
        assert_eq!(delay(FREE_FAILURES - 1), Duration::ZERO);
        assert_eq!(delay(FREE_FAILURES), BASE_DELAY);
        assert_eq!(delay(FREE_FAILURES + 1), BASE_DELAY * 2);
        assert_eq!(delay(1000), MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_slow_only_their_own_account() {
        let t = Throttle::default();
        for _ in 0..FREE_FAILURES + 2 {
            t.turn("victim").await.record(false);
        }
        // Another account is not slowed at all.
        let start = Instant::now();
        t.turn("other").await.record(true);
        assert_eq!(start.elapsed(), Duration::ZERO);
        // The victim's next check waits.
        let start = Instant::now();
        let turn = t.turn("victim").await;
        assert_eq!(start.elapsed(), delay(FREE_FAILURES + 2));
        // A success resets it.
        turn.record(true);
        assert_eq!(t.failures("victim").await, 0);
    }
}
