//! The one retry backoff of virtplug: capped exponential, with jitter. Used by the
//! read-modify-write path ([`crate::update`], [`crate::patch_if`]), the DataVolume importer's
//! retries and the node agent's waiting volumes.
//!
//! # Why not `backon`
//! kube-runtime's `backon` is a stateful iterator whose jitter adds `U(0, d)` (delays in
//! `[d, 2d)`). The callers here compute the delay of the n-th retry from a counter they persist
//! (a DataVolume's `restartCount`, a volume's failed attempts), and each documents its own
//! jitter; so this is a pure function of the retry number.
//!
//! # Guarantees
//! - Retry 1 waits about `base`, each next one about twice as long, never more than `cap` before
//!   jitter ([`Jitter::Proportional`] may exceed it by its fraction, [`Jitter::Full`] never does).
//! - No overflow for any retry number: the exponent saturates.

use std::time::Duration;

/// How a delay is spread around its nominal value, so that retries of many writers do not
/// arrive together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Jitter {
    /// Exactly the nominal delay.
    None,
    /// Uniform in `nominal × [1 - f, 1 + f)`.
    Proportional(f64),
    /// Uniform in `[base, nominal]` ("full jitter", floored at `base`).
    Full,
}

/// Capped exponential backoff with jitter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// The nominal delay before the first retry.
    pub base: Duration,
    /// The largest nominal delay.
    pub cap: Duration,
    pub jitter: Jitter,
}

impl Backoff {
    /// The nominal delay before retry `retry` (1 = the first retry): `base × 2^(retry-1)`,
    /// at most `cap`.
    #[must_use]
    pub fn nominal(&self, retry: u32) -> Duration {
        self.base.saturating_mul(1u32 << retry.saturating_sub(1).min(20)).min(self.cap)
    }

    /// The delay before retry `retry` (1 = the first retry), jittered.
    #[must_use]
    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_at(retry, rand::random::<f64>())
    }

    /// [`Self::delay`] with the random draw `unit` (in `[0, 1)`) given, for tests.
    #[must_use]
    pub fn delay_at(&self, retry: u32, unit: f64) -> Duration {
        let nominal = self.nominal(retry);
        let unit = unit.clamp(0.0, 1.0);
        match self.jitter {
            Jitter::None => nominal,
            Jitter::Proportional(f) => nominal.mul_f64((1.0 - f + 2.0 * f * unit).max(0.0)),
            Jitter::Full if nominal <= self.base => self.base,
            Jitter::Full => self.base + (nominal - self.base).mul_f64(unit),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn doubles_from_base_and_stops_at_the_cap() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1), jitter: Jitter::None };
        let got: Vec<u128> = [1, 2, 3, 4, 5, 6, 40, u32::MAX].iter().map(|&r| ms(b.delay(r))).collect();
        assert_eq!(got, [100, 200, 400, 800, 1000, 1000, 1000, 1000]);
        assert_eq!(ms(b.delay(0)), 100, "retry 0 counts as the first");
    }

    #[test]
    fn proportional_jitter_spreads_around_the_nominal_delay() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1), jitter: Jitter::Proportional(0.2) };
        assert_eq!((ms(b.delay_at(2, 0.0)), ms(b.delay_at(2, 0.5)), ms(b.delay_at(2, 1.0))), (160, 200, 240));
        assert_eq!(ms(b.delay_at(9, 1.0)), 1200, "the jitter may exceed the cap by its fraction");
    }

    #[test]
    fn full_jitter_stays_between_base_and_the_nominal_delay() {
        let b = Backoff { base: Duration::from_millis(50), cap: Duration::from_millis(500), jitter: Jitter::Full };
        assert_eq!((ms(b.delay_at(1, 0.7)), ms(b.delay_at(3, 0.0)), ms(b.delay_at(3, 1.0))), (50, 50, 200));
        for retry in 1..12 {
            let d = b.delay(retry);
            assert!(d >= b.base && d <= b.cap, "retry {retry}: {d:?}");
        }
    }
}
