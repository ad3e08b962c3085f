//! The in-memory side of Event aggregation, after client-go's `EventCorrelator`
//! (`tools/record/events_cache.go`): an aggregator that folds Events differing only in their
//! message into one once they come too many too fast, and a logger that remembers the Event
//! written for each key so a repeat bumps it. Both are bounded LRU caches.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// Entries each cache keeps (client-go's `maxLruCacheEntries`).
pub const MAX_ENTRIES: usize = 4096;
/// Distinct messages for one object and reason within [`AGGREGATE_WINDOW`] before they are
/// combined into one Event (client-go's `defaultAggregateMaxEvents`).
pub const AGGREGATE_MAX_MESSAGES: usize = 10;
/// client-go's `defaultAggregateIntervalInSeconds`.
pub const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// The prefix of a combined Event's message (client-go's `EventAggregatorByReasonMessageFunc`).
pub const COMBINED: &str = "(combined from similar events): ";

/// What makes two Events the same one (client-go's `getEventKey`): the source, the involved
/// object (uid included: a new object of the same name is another object), type, reason and
/// message. The aggregate key is the same with an empty message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub component: String,
    pub namespace: String,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub type_: String,
    pub reason: String,
    pub message: String,
}

impl Key {
    fn aggregate(&self) -> Key {
        Key { message: String::new(), ..self.clone() }
    }

    /// A short stable name for the per-key lock.
    pub fn lock_name(&self) -> String {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        format!("events/{}/{}/{:016x}", self.namespace, self.name, h.finish())
    }
}

/// The Event last written for a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub name: String,
    pub resource_version: String,
    pub count: i32,
}

/// A bounded map that forgets the least recently used entry first.
pub struct Lru<K, V> {
    cap: usize,
    tick: u64,
    map: HashMap<K, (u64, V)>,
    order: BTreeMap<u64, K>,
}

impl<K: Clone + Eq + Hash, V> Lru<K, V> {
    #[must_use]
    pub fn new(cap: usize) -> Self {
        Lru { cap: cap.max(1), tick: 0, map: HashMap::new(), order: BTreeMap::new() }
    }

    fn touch(&mut self, key: &K) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        let (t, v) = self.map.get_mut(key)?;
        self.order.remove(t);
        *t = tick;
        self.order.insert(tick, key.clone());
        Some(v)
    }

    /// The entry of `key`, now the most recently used.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.touch(key)
    }

    /// Sets `key`, evicting the least recently used entry beyond the capacity.
    pub fn insert(&mut self, key: K, value: V) {
        if let Some(v) = self.touch(&key) {
            *v = value;
            return;
        }
        self.tick += 1;
        self.order.insert(self.tick, key.clone());
        self.map.insert(key, (self.tick, value));
        while self.map.len() > self.cap {
            let Some((_, oldest)) = self.order.pop_first() else { break };
            self.map.remove(&oldest);
        }
    }

    pub fn remove(&mut self, key: &K) {
        if let Some((t, _)) = self.map.remove(key) {
            self.order.remove(&t);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// Messages seen lately for one aggregate key.
struct Recent {
    /// Hashes of the distinct messages, at most [`AGGREGATE_MAX_MESSAGES`].
    messages: HashSet<u64>,
    /// Reached the limit: every message goes to the combined Event until the window lapses.
    combining: bool,
    last: Instant,
}

/// Both caches; one per process.
pub struct Correlator {
    recent: Lru<Key, Recent>,
    pub observed: Lru<Key, Observed>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator { recent: Lru::new(MAX_ENTRIES), observed: Lru::new(MAX_ENTRIES) }
    }
}

impl Correlator {
    /// client-go's `EventAggregate`: the key (and message) to record `key` under. Up to
    /// [`AGGREGATE_MAX_MESSAGES`] - 1 distinct messages within [`AGGREGATE_WINDOW`] keep their own
    /// Events; from then on they all go to one Event under the aggregate key, whose message is
    /// the latest one prefixed with [`COMBINED`]. Unlike client-go (whose bounded set can let a
    /// message fall back to its own Event), combining lasts until the window passes in silence.
    pub fn aggregate(&mut self, key: Key, now: Instant) -> (Key, String) {
        let agg = key.aggregate();
        let mut h = DefaultHasher::new();
        key.message.hash(&mut h);
        let message_hash = h.finish();
        let fresh = || Recent { messages: HashSet::new(), combining: false, last: now };
        if self.recent.get_mut(&agg).is_none_or(|r| now.saturating_duration_since(r.last) > AGGREGATE_WINDOW) {
            self.recent.insert(agg.clone(), fresh());
        }
        let Some(rec) = self.recent.get_mut(&agg) else { return (key.clone(), key.message) };
        rec.last = now;
        if !rec.combining {
            rec.messages.insert(message_hash);
            rec.combining = rec.messages.len() >= AGGREGATE_MAX_MESSAGES;
        }
        if !rec.combining {
            let message = key.message.clone();
            return (key, message);
        }
        (agg, format!("{COMBINED}{}", key.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str, message: &str) -> Key {
        Key {
            component: "c".into(),
            namespace: "default".into(),
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: "p".into(),
            uid: "u".into(),
            type_: "Normal".into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn the_lru_forgets_the_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert("a", 1);
        l.insert("b", 2);
        assert_eq!(l.get_mut(&"a").copied(), Some(1)); // a is now newer than b
        l.insert("c", 3);
        assert_eq!((l.len(), l.get_mut(&"b").is_none(), l.get_mut(&"a").is_some()), (2, true, true));
        l.remove(&"a");
        assert_eq!(l.len(), 1);
        for i in 0..10_000 {
            l.insert("x", i);
        }
        assert_eq!(l.len(), 2, "re-inserting one key never grows the map");
    }

    #[test]
    fn many_distinct_messages_are_combined_into_one_key() {
        let mut c = Correlator::default();
        let now = Instant::now();
        let mut keys = HashSet::new();
        for i in 0..100 {
            let (k, m) = c.aggregate(key("Failed", &format!("attempt {i}")), now);
            if i < AGGREGATE_MAX_MESSAGES - 1 {
                assert_eq!(m, format!("attempt {i}"));
            } else {
                assert_eq!(m, format!("{COMBINED}attempt {i}"));
            }
            keys.insert(k);
        }
        assert_eq!(keys.len(), AGGREGATE_MAX_MESSAGES, "9 own Events, then one combined");
        // The same message again and again is one key without combining.
        let (k1, _) = c.aggregate(key("Other", "same"), now);
        for _ in 0..100 {
            assert_eq!(c.aggregate(key("Other", "same"), now), (k1.clone(), "same".to_owned()));
        }
        // After the window the count of distinct messages starts over.
        let later = now + AGGREGATE_WINDOW + Duration::from_secs(1);
        assert_eq!(c.aggregate(key("Failed", "new"), later).1, "new");
    }
}
