//! Per-object async locks inside one process: writers of the same object queue, writers of
//! different objects never wait for each other, and an entry lives only while someone holds or
//! waits for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::OwnedMutexGuard;

type Entry = Arc<tokio::sync::Mutex<()>>;

fn table() -> &'static Mutex<HashMap<String, Entry>> {
    static TABLE: OnceLock<Mutex<HashMap<String, Entry>>> = OnceLock::new();
    TABLE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock_table() -> std::sync::MutexGuard<'static, HashMap<String, Entry>> {
    // The map is consistent after any panic: every operation is a single insert or remove.
    table().lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Holds the lock of one object; releasing it drops the table entry when nobody waits.
pub struct ObjectLock {
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
    entry: Option<Entry>,
}

/// Waits for and takes the lock of `key`.
pub async fn lock(key: &str) -> ObjectLock {
    let entry = Arc::clone(lock_table().entry(key.to_owned()).or_default());
    let guard = Arc::clone(&entry).lock_owned().await;
    ObjectLock { key: key.to_owned(), guard: Some(guard), entry: Some(entry) }
}

impl Drop for ObjectLock {
    fn drop(&mut self) {
        let mut map = lock_table();
        drop(self.guard.take());
        if let Some(entry) = self.entry.take() {
            // References: the table's and ours. Any other is a waiter (or a holder), which keeps
            // the entry alive; it is checked under the table lock, so no waiter can appear now.
            if Arc::strong_count(&entry) == 2 {
                map.remove(&self.key);
            }
        }
    }
}

/// How many objects have a lock entry (held or awaited) right now.
#[must_use]
pub fn entries() -> usize {
    lock_table().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn entries_go_away_when_released() {
        let a = lock("test/a").await;
        let b = lock("test/b").await;
        assert!(entries() >= 2);
        drop(a);
        drop(b);
        let mut waiters = Vec::new();
        let first = lock("test/c").await;
        for _ in 0..4 {
            waiters.push(tokio::spawn(async { drop(lock("test/c").await) }));
        }
        tokio::task::yield_now().await;
        drop(first);
        for w in waiters {
            w.await.unwrap();
        }
        assert!(!lock_table().contains_key("test/a") && !lock_table().contains_key("test/c"));
    }
}
