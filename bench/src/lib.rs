//! What the benchmark harnesses share (their results go to BENCHMARKS.md): a percentile, CPU
//! time of a process, deadlines for every wait, `virtplug apiserver` as a peer, and the end-to-end
//! harness's `virtplug up`.

pub mod apiserver;
pub mod cputime;
pub mod up;
pub mod waits;

/// The test guest's kernel command line, as every harness boots it (`--kernel-args` overrides).
///
/// Two parameters keep a guest booting on a loaded host under TCG (32 guests on 2 cores):
/// `no_timer_check` skips the IO-APIC timer check, which misses its ticks there and panics
/// ("IO-APIC + timer doesn't work!": a reboot with `panic=-1`, 21 of 96 boots), and
/// `tsc=unstable` keeps time by the HPET, as the calibration of the TSC can come out 10-80×
/// too slow there and make the guest's clock run that much fast (tests/guest/init).
pub const GUEST_KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check tsc=unstable";

/// The memory (MiB) of P2's and P3's guests and of P2's floor fleet: 32 guests fit in this
/// machine's memory beside `up`.
pub const FLEET_MEMORY_MIB: u64 = 160;

/// The `q` quantile (0..=1, nearest rank) of `v`; NaN for no samples.
#[must_use]
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len().max(1) as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
}
