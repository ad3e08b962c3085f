//! Free space under the store: a batch is refused before it could fill the data dir's filesystem.
//!
//! # Why
//! SQLite on a full filesystem answers `SQLITE_FULL` and rolls the transaction back, so nothing
//! is lost; but by then the filesystem is full for everything else too (the WAL cannot be
//! checkpointed, the node's VM disks and logs on the same filesystem fail). Refusing writes while
//! a reserve is still free keeps the store and its neighbours working, and it recovers by itself:
//! the check runs before every batch, so the first write after space returns goes through.
//!
//! # Guarantees
//! - A batch is committed only if the filesystem has at least its estimated size plus the
//!   reserve free ([`Space::check`]); otherwise every write of it gets
//!   [`StoreError::NoSpace`](super::StoreError::NoSpace) and nothing of it is stored.
//! - The estimate is generous (each object is written twice, to `objects` and `log`, plus
//!   page overhead per row), never smaller than what SQLite appends to the WAL for it.
//!
//! # Caveats
//! The free space is `f_bavail` (what an unprivileged user may still use), so root's reserved
//! blocks on ext4 count as used: the check errs on the safe side. When `statvfs` itself fails
//! the batch goes ahead and SQLite's own `SQLITE_FULL` is the guard.

use std::path::{Path, PathBuf};

use super::StoreError;

/// Default reserve floor: 64 MiB.
pub const MIN_RESERVE: u64 = 64 << 20;
/// Per written row, what B-tree pages and WAL frame headers may add beyond the row's bytes.
const ROW_OVERHEAD: u64 = 16 << 10;

/// Where the store lives and what to keep free there.
pub(super) struct Space {
    dir: PathBuf,
    /// `None`: the larger of [`MIN_RESERVE`] and 1 % of the filesystem; `Some(0)`: no check.
    reserve: Option<u64>,
}

impl Space {
    pub(super) fn new(db: &Path, reserve: Option<u64>) -> Space {
        let dir = db.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or_else(|| Path::new(".")).to_owned();
        Space { dir, reserve }
    }

    /// Checks that a batch of `rows` rows of `bytes` serialized bytes fits with the reserve left.
    ///
    /// # Errors
    /// `NoSpace` with what is free, what the batch needs and the reserve.
    pub(super) fn check(&self, bytes: u64, rows: u64) -> Result<(), StoreError> {
        if self.reserve == Some(0) {
            return Ok(());
        }
        let st = match rustix::fs::statvfs(&self.dir) {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!("cannot read the free space of {} (committing anyway): {e}", self.dir.display());
                return Ok(());
            }
        };
        let free = st.f_bavail.saturating_mul(st.f_frsize);
        let total = st.f_blocks.saturating_mul(st.f_frsize);
        let reserve = self.reserve.unwrap_or_else(|| default_reserve(total));
        let needed = estimate(bytes, rows);
        if free < needed.saturating_add(reserve) {
            return Err(StoreError::NoSpace { dir: self.dir.clone(), free, needed, reserve });
        }
        Ok(())
    }
}

/// The default reserve of a filesystem of `total` bytes: max(64 MiB, 1 %).
#[must_use]
pub fn default_reserve(total: u64) -> u64 {
    MIN_RESERVE.max(total / 100)
}

/// What a batch may take on disk: every object twice (current state and changelog) plus the
/// per-row overhead.
fn estimate(bytes: u64, rows: u64) -> u64 {
    bytes.saturating_mul(2).saturating_add(rows.saturating_mul(2).saturating_mul(ROW_OVERHEAD))
}

/// `12.3 MiB`, for messages.
#[must_use]
pub fn human(bytes: &u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    #[allow(clippy::cast_precision_loss)] // a size for a message: three digits are enough
    let mut v = *bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Op, Store, StoreConfig};
    use serde_json::json;

    fn obj(name: &str) -> serde_json::Value {
        json!({"metadata": {"name": name}})
    }

    #[test]
    fn a_reserve_larger_than_the_filesystem_refuses_and_says_why() {
        let dir = tempfile::tempdir().expect("temp dir");
        let space = Space::new(&dir.path().join("s.db"), Some(u64::MAX / 4));
        let err = space.check(100, 1).expect_err("refused");
        assert!(matches!(err, StoreError::NoSpace { needed, .. } if needed >= 200), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("nearly full") && msg.contains(&dir.path().display().to_string()) && msg.contains("--store-reserve"), "{msg}");
        // Reserve 0 turns the check off; a small reserve on a real filesystem lets a small batch through.
        assert!(Space::new(&dir.path().join("s.db"), Some(0)).check(u64::MAX, u64::MAX).is_ok());
        assert!(Space::new(&dir.path().join("s.db"), Some(1)).check(100, 1).is_ok());
    }

    #[test]
    fn estimates_and_sizes_never_overflow() {
        assert_eq!(estimate(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(estimate(1000, 1), 2000 + 2 * ROW_OVERHEAD);
        assert_eq!(default_reserve(1 << 40), (1 << 40) / 100);
        assert_eq!(default_reserve(1 << 20), MIN_RESERVE);
        assert_eq!(human(&512), "512 B");
        assert_eq!(human(&(3 << 20)), "3.0 MiB");
        assert_eq!(human(&u64::MAX), "16777216.0 TiB");
    }

    /// `SQLITE_FULL` in the middle of a batch: the batch is refused whole (507's `Full`), memory
    /// and database agree on exactly the acknowledged writes, and the writer takes the next batch.
    #[tokio::test]
    async fn a_full_database_refuses_the_batch_whole_and_keeps_serving() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.db");
        let cfg = StoreConfig { max_size: Some(512 << 10), reserve: Some(0), ..StoreConfig::default() };
        let s = Store::open(&path, &cfg).unwrap();
        let big = json!({"metadata": {"name": "big"}, "data": "x".repeat(1 << 20)});
        let mut refused = 0;
        for round in 0..3 {
            // Queued together, these usually land in one batch with the write that cannot fit.
            let small = |i: usize| s.write(Op::Create { key: format!("r{round}-{i}"), object: obj("small") });
            let (a, b, c) = tokio::join!(small(0), s.write(Op::Create { key: format!("big{round}"), object: big.clone() }), small(1));
            let e = b.expect_err("a 1 MiB object cannot fit in a 512 KiB database");
            assert!(matches!(e, StoreError::Full { .. }) && e.is_no_space(), "{e}");
            assert!(e.to_string().contains("nothing of the write was stored"), "{e}");
            refused += 1;
            for r in [a, c] {
                if let Err(e) = r {
                    assert!(matches!(e, StoreError::Full { .. }), "a write batched with the failing one fails the same way: {e}");
                }
            }
        }
        assert_eq!(refused, 3);
        // The writer still serves: a write that fits goes through.
        let ok = s.write(Op::Create { key: "after".into(), object: obj("after") }).await.expect("the writer survived");
        assert_eq!(ok.rv, s.revision());
        let memory: Vec<(String, u64)> = s.all().into_iter().map(|(k, v)| (k, v.rv)).collect();
        assert!(!memory.iter().any(|(k, _)| k.starts_with("big")));
        drop(s);
        let reopened = Store::open(&path, &cfg).unwrap();
        let disk: Vec<(String, u64)> = reopened.all().into_iter().map(|(k, v)| (k, v.rv)).collect();
        assert_eq!(disk, memory, "the database holds exactly what memory held");
        assert_eq!(reopened.revision(), ok.rv, "no revision was used by the refused batches");
    }
}
