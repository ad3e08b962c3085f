//! The fallback wait when no event will say that a volume became ready: virtplug's one backoff
//! ([`client::backoff`]: capped exponential, ±20 % jitter here), and a deadline after which the
//! volume is reported `HotplugFailed` (it keeps retrying at the cap). Watch events and
//! mount-table changes wake the agent earlier.
//!
//! Defaults: first retry after 250 ms, doubling, capped at 30 s; `HotplugFailed` after 60 s.
//! KubeVirt's virt-handler instead re-queues every second, forever, spawning `findmnt` each
//! time.

use std::time::Duration;

use client::backoff::Jitter;

/// The node agent's backoff settings.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    /// After this long without success the volume reports `HotplugFailed`.
    pub deadline: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: Duration::from_millis(250), cap: Duration::from_secs(30), deadline: Duration::from_secs(60) }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (1 = the first retry), jittered ±20 %.
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        client::backoff::Backoff { base: self.base, cap: self.cap, jitter: Jitter::Proportional(0.2) }.delay(attempt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_stays_at_the_cap_within_jitter() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1), deadline: Duration::from_secs(5) };
        for (attempt, nominal) in [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (40, 1000)] {
            let d = b.delay(attempt).as_secs_f64() * 1000.0;
            let n = f64::from(nominal);
            assert!(d >= n * 0.8 - 1e-6 && d <= n * 1.2 + 1e-6, "attempt {attempt}: {d} ms, nominal {nominal}");
        }
    }
}
