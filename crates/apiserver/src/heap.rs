//! Gives freed heap back to the system after bursts of writes.
//!
//! glibc's allocator keeps what a thread frees in that thread's arena; after a burst of writes
//! (each request parses, validates and encodes its object on some worker thread) the freed
//! pages stay resident although the store now holds only the objects' bytes. Measured with the
//! `scale` bench at 10,000 VMs: the server's resident memory after the creates varied between
//! 2.1 and 4.3 KiB per KiB of stored JSON from run to run, depending on how the work fell on
//! the threads. `malloc_trim(0)` returns every arena's free pages. It runs off the async workers,
//! once a burst of at least [`BURST`] writes has ended (a [`TICK`] without writes after them),
//! and otherwise, while anything at all was written, at most every [`BUSY_EVERY`]: a trickle of
//! writes (a controller renewing its Lease every 2 s) does not trim every other second (trimming
//! locks each arena in turn and walks its free chunks).
//!
//! The `virtplug` binary allocates Rust's memory with mimalloc (its `allocator` module), which
//! purges freed pages itself; what this trims there is the C side's heap (SQLite's, liblzma's). A library
//! user on glibc's allocator gets the whole effect described above.

use std::time::{Duration, Instant};

use crate::store::Store;

/// How often the store's revision is looked at.
pub const TICK: Duration = Duration::from_secs(1);
/// The longest the heap goes untrimmed while anything is written.
pub const BUSY_EVERY: Duration = Duration::from_secs(30);
/// Writes that make a burst, trimmed after as soon as it ends.
pub const BURST: u64 = 64;

/// Whether to trim now: `written` revisions since the last trim `since` ago, `writing` when the
/// last tick saw writes.
fn due(written: u64, writing: bool, since: Duration) -> bool {
    written > 0 && (since >= BUSY_EVERY || (!writing && written >= BURST))
}

/// Trims while the runtime runs.
pub async fn run(store: Store) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut seen, mut trimmed) = (store.revision(), store.revision());
    let mut last_trim = Instant::now();
    loop {
        tick.tick().await;
        let now = store.revision();
        let writing = now != seen;
        seen = now;
        if !due(now.saturating_sub(trimmed), writing, last_trim.elapsed()) {
            continue;
        }
        trimmed = now;
        last_trim = Instant::now();
        let took = tokio::task::spawn_blocking(|| {
            let start = Instant::now();
            trim();
            start.elapsed()
        })
        .await;
        if let Ok(took) = took {
            tracing::debug!("returned freed heap to the system in {took:?}");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() {
    // SAFETY: `malloc_trim` takes a plain integer, reads and writes only the allocator's own
    // state under the allocator's locks (callable from any thread at any time, as malloc is),
    // and leaves every live allocation where it is: it only releases pages of free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_are_trimmed_when_they_end_and_trickles_at_most_every_busy_period() {
        let soon = Duration::from_secs(2);
        assert!(due(BURST, false, soon), "a burst that ended");
        assert!(!due(BURST * 10, true, soon), "a burst still going");
        assert!(due(BURST * 10, true, BUSY_EVERY), "writes that never pause");
        assert!(!due(1, false, soon), "a Lease renewal");
        assert!(due(1, false, BUSY_EVERY), "a trickle, once a period");
        assert!(!due(0, false, BUSY_EVERY * 10), "nothing written");
    }
}
