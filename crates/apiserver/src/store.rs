//! The embedded store: SQLite in WAL mode with `synchronous=FULL`, one global revision, a
//! changelog for watches, and an in-memory copy of the current objects for reads.
//!
//! # Flow
//! One write connection, behind a mutex, commits one batch at a time. A write that comes alone
//! and finds the connection free commits itself, in the caller's thread (the common case with
//! one writer: no hand-off to another thread and back, which on this machine's paravirtualised
//! CPUs is two wake-ups and most of an update's CPU; BENCHMARKS.md "a lone writer commits in its
//! own thread"). Otherwise it goes over a channel to the store's writer thread, which takes every
//! request already queued (group commit). Either way a batch is: check each compare-and-swap
//! against the current state plus the earlier requests of the same batch, apply all that pass in
//! one transaction, commit (fsync), then update the in-memory state, append to the changelog,
//! broadcast the events and answer each writer.
//!
//! An inline commit blocks the calling async task's worker for one commit (a few pwrites and an
//! fsync: ~0.2–2 ms here), so only a write that comes alone, after another that came alone,
//! commits inline ([`InFlight`]); with concurrent writers every write goes to the thread, the
//! runtime's workers are not held and writes share fsyncs as before.
//!
//! Each write touches as few pages as it can, since at one writer the fsync'd WAL bytes set the
//! rate on a slow disk: the `objects` row is updated in place (an upsert; `INSERT OR REPLACE`
//! would move it to a new rowid and rewrite its key's index page too) and one `log` row is
//! appended; the global revision is the newest log row's, not a `meta` row rewritten per commit
//! (which cost two more pages: its table and its key index). About 3 WAL pages per update of a
//! 2 KB object, from 6 (BENCHMARKS.md, "P4 with fewer pages per commit").
//!
//! # Guarantees
//! - An acknowledged write has been committed with `synchronous=FULL`: it survives `kill -9` and
//!   power loss (as far as the disk honours fsync).
//! - Revisions are strictly increasing and gapless across restarts; every object carries the
//!   revision of its last write as `metadata.resourceVersion`.
//! - Events reach subscribers in revision order, after the commit.
//! - A watch from a revision older than the changelog window gets [`StoreError::Compacted`].
//! - The filesystem running out of space never loses or half-applies a write: a batch that would
//!   leave less than the reserve free is refused before it starts ([`StoreError::NoSpace`], see
//!   [`space`]), and a batch SQLite cannot write (`SQLITE_FULL`) is rolled back whole and refused
//!   ([`StoreError::Full`]). Reads and watches are served from memory throughout, and the next
//!   write after space returns goes through, without a restart.
//! - The writer outlives every failed batch (an error answers that batch's writers with it; a
//!   panic answers those it had decided and the rest with `WriterGone`; the next batch goes
//!   on), inline or on the thread. Once the thread has stopped (a panic outside a batch) writes
//!   are refused with `WriterGone`, inline ones too (from the moment the stop is seen; the
//!   server exits on it).
//!
//! - One process at a time: the store is opened with SQLite's exclusive locking mode, so a
//!   second server on the same data dir is refused at start ([`StoreError::InUse`]) instead of
//!   serving its own stale copy and failing or reordering writes. The lock goes with the process
//!   (`kill -9` included). It also spares each commit SQLite's per-transaction file locks and
//!   shared-memory index.
//!
//! # Caveats
//! Lists are served from the current state: a list at an older revision is not possible
//! (`Exact` on an old revision answers 410, as a compacted etcd would).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock, RwLockReadGuard, TryLockError};
use std::thread;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use tokio::sync::{broadcast, oneshot};

pub mod doc;
pub mod space;

pub use doc::Doc;

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The watch wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
    fn code(self) -> i64 {
        match self {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
        }
    }
    fn from_code(c: i64) -> Self {
        match c {
            0 => EventType::Added,
            1 => EventType::Modified,
            _ => EventType::Deleted,
        }
    }
}

/// One committed change. For `Deleted` the object is its last state, stamped with the revision
/// of the deletion.
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub key: String,
    pub kind: EventType,
    pub object: Doc,
}

/// An object as stored.
#[derive(Clone, Debug)]
pub struct Stored {
    pub rv: u64,
    pub object: Doc,
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("object {key} already exists")]
    Exists { key: String },
    #[error("object {key} not found")]
    NotFound { key: String },
    #[error("object {key} is at revision {actual}, not {expected}")]
    Conflict { key: String, expected: u64, actual: u64 },
    #[error("revision {requested} is older than the oldest kept revision {oldest}")]
    Compacted { requested: u64, oldest: u64 },
    #[error("the store failed at {path}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the commit to {path} failed, nothing of it was stored: {message}")]
    Commit { path: PathBuf, message: String },
    #[error(
        "the store {path} is in use by another process (another `virtplug apiserver` or `virtplug up` with the same \
         --data-dir?); stop that one, or give this one another --data-dir"
    )]
    InUse { path: PathBuf },
    #[error("cannot start the store's writer thread")]
    Thread(#[source] std::io::Error),
    #[error("the store's writer thread has stopped")]
    WriterGone,
    #[error(
        "the filesystem of the data dir {dir} is nearly full: {} free, this write needs about {} and {} are kept free \
         (--store-reserve); nothing was stored. Free space there and writes resume by themselves",
        space::human(.free), space::human(.needed), space::human(.reserve)
    )]
    NoSpace { dir: PathBuf, free: u64, needed: u64, reserve: u64 },
    #[error(
        "the store {path} is full ({message}); nothing of the write was stored. Free space on its filesystem \
         and writes resume by themselves"
    )]
    Full { path: PathBuf, message: String },
}

impl StoreError {
    /// Whether the write was refused for lack of space (507 Insufficient Storage).
    #[must_use]
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. } | StoreError::Full { .. })
    }
}

/// A compare-and-swap write.
#[derive(Debug)]
pub enum Op {
    /// Create `key`; fails with `Exists` if it is there.
    Create { key: String, object: Value },
    /// Replace `key` if it is at revision `expected`.
    Update { key: String, expected: u64, object: Value },
    /// Delete `key` if it is at revision `expected`.
    Delete { key: String, expected: u64 },
}

struct Write {
    op: Op,
    reply: oneshot::Sender<Result<Event, StoreError>>,
}

struct State {
    objects: BTreeMap<String, Stored>,
    revision: u64,
    log: VecDeque<Event>,
    /// The oldest revision a watch may start from (events after it are all in `log`).
    oldest: u64,
    /// [`Store::subscribe`]'s channels.
    subscriptions: Vec<Subscription>,
}

/// A channel of the events its task wants ([`Store::subscribe`]).
struct Subscription {
    wants: Box<dyn Fn(&Event) -> bool + Send + Sync>,
    tx: broadcast::Sender<Event>,
}

/// Tunables.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// How many events the changelog keeps for watch resumption (etcd's compaction window).
    pub watch_window: usize,
    /// Capacity of the live event broadcast; a watcher further behind is sent 410.
    pub broadcast_capacity: usize,
    /// Bytes kept free on the data dir's filesystem: a write that would leave less is refused
    /// with [`StoreError::NoSpace`]. `None` (default): the larger of 64 MiB and 1 % of the
    /// filesystem; `Some(0)`: no check (SQLite's own `SQLITE_FULL` is then the only guard).
    pub reserve: Option<u64>,
    /// The most the database file may grow to (SQLite's `max_page_count`); a write past it is
    /// refused with [`StoreError::Full`]. `None` (default): no bound but the filesystem's.
    pub max_size: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig { watch_window: 10_000, broadcast_capacity: 16_384, reserve: None, max_size: None }
    }
}

/// Handle to the store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    state: Arc<RwLock<State>>,
    writer: mpsc::Sender<Write>,
    /// The write connection and what says whether a write may commit inline.
    shared: Arc<Shared>,
    events: broadcast::Sender<Event>,
    /// The capacity of every event channel (`StoreConfig::broadcast_capacity`).
    capacity: usize,
    /// Why the writer thread stopped, once it has (see [`Store::writer_stopped`]).
    writer_exit: tokio::sync::watch::Receiver<Option<String>>,
}

/// How long [`Store::open`] waits for another connection to let go of the store.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects (key TEXT PRIMARY KEY, rv INTEGER NOT NULL, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS log (rv INTEGER PRIMARY KEY, key TEXT NOT NULL, type INTEGER NOT NULL, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
";

impl Store {
    /// Opens (or creates) the store at `path`.
    ///
    /// # Errors
    /// `Sqlite` when the file cannot be opened, is not a virtplug store, or a read fails.
    pub fn open(path: &Path, config: &StoreConfig) -> Result<Store, StoreError> {
        let sql = |source| StoreError::Sqlite { path: path.to_owned(), source };
        let conn = Connection::open(path).map_err(sql)?;
        // One process owns the store (module docs): the lock is taken here, before WAL mode is
        // entered (so the WAL index lives in this process's memory, not in a -shm file), and held
        // until the connection closes. Another holder is waited for briefly (a store reopened in
        // the same process right after its last handle dropped), then refused by name.
        conn.busy_timeout(LOCK_WAIT).map_err(sql)?;
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE").map_err(sql)?;
        let locked = conn.pragma_update(None, "journal_mode", "WAL").and_then(|()| conn.execute_batch("BEGIN EXCLUSIVE; COMMIT;"));
        match locked {
            Err(rusqlite::Error::SqliteFailure(e, _)) if e.code == rusqlite::ErrorCode::DatabaseBusy => {
                return Err(StoreError::InUse { path: path.to_owned() });
            }
            other => other.map_err(sql)?,
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(sql)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        if let Some(max) = config.max_size {
            let page: u64 = conn.pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0)).map_err(sql)?.try_into().unwrap_or(4096);
            let pages = i64::try_from(max / page.max(1)).unwrap_or(i64::MAX).max(1);
            conn.pragma_update(None, "max_page_count", pages).map_err(sql)?;
        }

        // The revision is the newest log row's: every write adds one in its transaction, and
        // trimming keeps the newest. Stores written before that also kept it in `meta` (one more
        // page in every commit), still read so that such a store never goes back.
        let newest = |query: &str| {
            conn.query_row(query, [], |r| r.get::<_, Option<i64>>(0))
                .optional()
                .map(|v| v.flatten().map_or(0, |v| u64::try_from(v).unwrap_or(0)))
        };
        let revision = newest("SELECT max(rv) FROM log").map_err(sql)?.max(newest("SELECT v FROM meta WHERE k = 'revision'").map_err(sql)?);
        let mut objects = BTreeMap::new();
        {
            let mut stmt = conn.prepare("SELECT key, rv, value FROM objects").map_err(sql)?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, Vec<u8>>(2)?))).map_err(sql)?;
            for row in rows {
                let (key, rv, value) = row.map_err(sql)?;
                objects.insert(key, Stored { rv: u64::try_from(rv).unwrap_or(0), object: Doc::from_stored(&value) });
            }
        }
        let mut log = VecDeque::new();
        {
            let mut stmt =
                conn.prepare("SELECT rv, key, type, value FROM (SELECT * FROM log ORDER BY rv DESC LIMIT ?1) ORDER BY rv").map_err(sql)?;
            let limit = i64::try_from(config.watch_window).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map([limit], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, Vec<u8>>(3)?)))
                .map_err(sql)?;
            for row in rows {
                let (rv, key, kind, value) = row.map_err(sql)?;
                log.push_back(Event {
                    rv: u64::try_from(rv).unwrap_or(0),
                    key,
                    kind: EventType::from_code(kind),
                    object: Doc::from_stored(&value),
                });
            }
        }
        let oldest = log.front().map_or(revision, |e| e.rv.saturating_sub(1));
        let state = Arc::new(RwLock::new(State { objects, revision, log, oldest, subscriptions: Vec::new() }));
        let (events, _) = broadcast::channel(config.broadcast_capacity);
        let (tx, rx) = mpsc::channel::<Write>();
        let shared = Arc::new(Shared {
            writer: Mutex::new(Writer {
                conn,
                path: path.to_owned(),
                state: Arc::clone(&state),
                events: events.clone(),
                window: config.watch_window,
                space: space::Space::new(path, config.reserve),
            }),
            in_flight: AtomicUsize::new(0),
            last_alone: AtomicBool::new(false),
            #[cfg(test)]
            inline_batches: AtomicUsize::new(0),
            #[cfg(test)]
            thread_batches: AtomicUsize::new(0),
        });
        let (exit, writer_exit) = tokio::sync::watch::channel(None);
        let thread_shared = Arc::clone(&shared);
        thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || crate::health::supervise_thread(crate::health::STORE_WRITER, &exit, || Shared::run(&thread_shared, &rx)))
            .map_err(StoreError::Thread)?;
        Ok(Store { state, writer: tx, shared, events, capacity: config.broadcast_capacity, writer_exit })
    }

    /// Applies one compare-and-swap write and returns its event once it is durable.
    ///
    /// # Errors
    /// `Exists`, `NotFound`, `Conflict` when the precondition fails; `Commit`, `Full` or
    /// `NoSpace` when the commit failed or was refused (nothing of it is stored); `WriterGone`
    /// after shutdown or when the batch panicked.
    pub async fn write(&self, op: Op) -> Result<Event, StoreError> {
        // Once the thread has stopped, nothing is written inline either.
        if self.writer_exit.borrow().is_some() {
            return Err(StoreError::WriterGone);
        }
        let in_flight = InFlight::enter(&self.shared);
        let (reply, rx) = oneshot::channel();
        let write = Write { op, reply };
        // Inline when this write is alone and the connection is free (module docs).
        let write = if in_flight.alone { self.shared.commit_if_idle(write) } else { Some(write) };
        if let Some(write) = write {
            self.writer.send(write).map_err(|_| StoreError::WriterGone)?;
        }
        let answer = rx.await.map_err(|_| StoreError::WriterGone)?;
        drop(in_flight);
        answer
    }

    /// The current object at `key`.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<Stored> {
        self.read().objects.get(key).cloned()
    }

    /// Objects whose key starts with `prefix` and sorts after `after` (for pagination),
    /// with the current revision.
    #[must_use]
    pub fn list(&self, prefix: &str, after: Option<&str>) -> (u64, Vec<(String, Stored)>) {
        let (rv, items, _) = self.list_page(prefix, after, usize::MAX);
        (rv, items)
    }

    /// The first `max` objects of [`Store::list`], and how many it would return in all: a page
    /// without selectors copies out only what it returns (the rest is counted, not copied).
    #[must_use]
    pub fn list_page(&self, prefix: &str, after: Option<&str>, max: usize) -> (u64, Vec<(String, Stored)>, usize) {
        let st = self.read();
        let start = after.map_or_else(|| prefix.to_owned(), |a| format!("{a}\u{0}"));
        let range = || st.objects.range(start.clone()..).take_while(|(k, _)| k.starts_with(prefix));
        let items: Vec<_> = range().take(max).map(|(k, v)| (k.clone(), v.clone())).collect();
        let total = if items.len() < max { items.len() } else { range().count() };
        (st.revision, items, total)
    }

    /// Every object (for the garbage collector's scans).
    #[must_use]
    pub fn all(&self) -> Vec<(String, Stored)> {
        self.read().objects.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// The current revision.
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// Subscribes to events after `from`: returns the backlog (events with rv > `from`, in
    /// order) and a live receiver. Events in both overlap at most; skip rv <= the last seen.
    ///
    /// # Errors
    /// `Compacted` when `from` is older than the window.
    pub fn watch(&self, from: u64) -> Result<(Vec<Event>, broadcast::Receiver<Event>), StoreError> {
        let st = self.read();
        // Subscribe under the read lock: the writer publishes under the write lock, so nothing
        // can fall between the backlog and the live stream.
        let rx = self.events.subscribe();
        if from < st.oldest {
            return Err(StoreError::Compacted { requested: from, oldest: st.oldest });
        }
        let backlog = st.log.iter().filter(|e| e.rv > from).cloned().collect();
        Ok((backlog, rx))
    }

    /// The events committed from now on that `wants` passes, for the server's own tasks that act
    /// on few of them (the garbage collector, the CRD establisher). A write none of them wants
    /// wakes none of them: on a server with one writer at a time, every task woken per write is
    /// a thread wake-up on the write's path. A receiver that falls more than the broadcast
    /// capacity behind gets `Lagged`, as a [`Store::watch`] does.
    pub fn subscribe(&self, wants: impl Fn(&Event) -> bool + Send + Sync + 'static) -> broadcast::Receiver<Event> {
        let (tx, rx) = broadcast::channel(self.capacity);
        // Under the write lock: the writer publishes under it, so every later event is seen.
        let mut st = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        st.subscriptions.push(Subscription { wants: Box::new(wants), tx });
        rx
    }

    /// Resolves with the reason once the writer thread has stopped (a panic outside a batch, or a
    /// fault injected by a test); writes then fail with `WriterGone`. Holds no `Store`.
    pub fn writer_stopped(&self) -> impl std::future::Future<Output = String> + Send + 'static {
        let mut rx = self.writer_exit.clone();
        async move { rx.wait_for(Option::is_some).await.ok().and_then(|r| r.clone()).unwrap_or_else(|| "stopped".to_owned()) }
    }

    /// The oldest revision a watch may start from.
    #[must_use]
    pub fn oldest(&self) -> u64 {
        self.read().oldest
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A writer that panicked leaves the data as consistent as it got (see `Writer::commit`).
        self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Why a batch was not stored; every writer of it gets [`Refused::error`].
enum Refused {
    Space(StoreError),
    Full(String),
    Commit(String),
}

impl Refused {
    fn error(&self, path: &Path) -> StoreError {
        match self {
            Refused::Space(StoreError::NoSpace { dir, free, needed, reserve }) => {
                StoreError::NoSpace { dir: dir.clone(), free: *free, needed: *needed, reserve: *reserve }
            }
            Refused::Full(message) => StoreError::Full { path: path.to_owned(), message: message.clone() },
            Refused::Space(other) => StoreError::Commit { path: path.to_owned(), message: other.to_string() },
            Refused::Commit(message) => StoreError::Commit { path: path.to_owned(), message: message.clone() },
        }
    }
}

/// The write connection, shared by the writer thread and inline commits ([`Store::write`]).
struct Shared {
    writer: Mutex<Writer>,
    /// Writes inside [`Store::write`] ([`InFlight`]).
    in_flight: AtomicUsize,
    /// Whether the latest write to come found no other in flight.
    last_alone: AtomicBool,
    /// Batches committed inline and by the thread (the tests' view of which path a write took).
    #[cfg(test)]
    inline_batches: AtomicUsize,
    #[cfg(test)]
    thread_batches: AtomicUsize,
}

/// A write between its entry to [`Store::write`] and its answer (dropped with a cancelled one).
struct InFlight<'a> {
    shared: &'a Shared,
    /// No other write was in flight when this one came, nor when the one before it came: one
    /// writer at a time (and nothing queued for the thread: a queued write is in flight). A
    /// cancelled caller's write may still sit in the queue and be overtaken: it was never
    /// answered, so no order was promised. With concurrent writers an inline commit would hold
    /// a runtime worker through its fsync while the others' requests wait for it (8 writers:
    /// −10 % updates/s when every lone arrival went inline), so they all go to the thread.
    alone: bool,
}

impl<'a> InFlight<'a> {
    fn enter(shared: &'a Shared) -> Self {
        let alone = shared.in_flight.fetch_add(1, Ordering::AcqRel) == 0;
        let before = shared.last_alone.swap(alone, Ordering::AcqRel);
        InFlight { shared, alone: alone && before }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Shared {
    /// Commits `write` here and now if no batch is being committed; otherwise gives it back.
    fn commit_if_idle(&self, write: Write) -> Option<Write> {
        let mut writer = match self.writer.try_lock() {
            Ok(w) => w,
            // `commit_guarded` catches a batch's panic inside the lock; a poisoned lock is still
            // a consistent connection.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return Some(write),
        };
        #[cfg(test)]
        self.inline_batches.fetch_add(1, Ordering::Relaxed);
        let answers = writer.commit_guarded(vec![write]);
        drop(writer);
        answer(answers);
        None
    }

    /// The writer thread: every request already queued is one batch (group commit).
    fn run(&self, rx: &mpsc::Receiver<Write>) {
        while let Ok(first) = rx.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(w) => batch.push(w),
                    Err(_) => break,
                }
            }
            #[cfg(test)]
            self.thread_batches.fetch_add(1, Ordering::Relaxed);
            let answers = self.writer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).commit_guarded(batch);
            // After the lock is released: an answered writer's next write may find it free.
            answer(answers);
        }
    }
}

/// The answers of a batch, sent once the connection's lock is released.
type Answers = Vec<(oneshot::Sender<Result<Event, StoreError>>, Result<Event, StoreError>)>;

/// Sends a batch's answers (a writer that went away meanwhile is no error).
fn answer(answers: Answers) {
    for (reply, result) in answers {
        let _ = reply.send(result);
    }
}

struct Writer {
    conn: Connection,
    path: PathBuf,
    state: Arc<RwLock<State>>,
    events: broadcast::Sender<Event>,
    window: usize,
    space: space::Space,
}

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 512;

impl Writer {
    /// Commits `batch` and returns its answers. A panic fails the rest of this batch (the
    /// answers decided before it are kept, the other writers' replies are dropped: they get
    /// `WriterGone`) and the store goes on with the next: it must keep serving. State is only
    /// changed after a commit, so it stays what the database holds.
    fn commit_guarded(&mut self, batch: Vec<Write>) -> Answers {
        let mut answers = Answers::new();
        if catch_unwind(AssertUnwindSafe(|| self.commit(batch, &mut answers))).is_err() {
            tracing::error!("the store's writer panicked on a batch of writes; they were refused, the store keeps serving");
        }
        answers
    }

    fn commit(&mut self, batch: Vec<Write>, answers: &mut Answers) {
        let mut revision = self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner).revision;
        // Decide every request against the current state plus earlier requests in this batch.
        let mut overlay: HashMap<String, Option<Stored>> = HashMap::new();
        let mut accepted: Vec<(Event, oneshot::Sender<Result<Event, StoreError>>)> = Vec::new();
        for w in batch {
            let key = match &w.op {
                Op::Create { key, .. } | Op::Update { key, .. } | Op::Delete { key, .. } => key.clone(),
            };
            let current = match overlay.get(&key) {
                Some(v) => v.clone(),
                None => self.state.read().unwrap_or_else(std::sync::PoisonError::into_inner).objects.get(&key).cloned(),
            };
            let decided = match (w.op, current) {
                (Op::Create { .. }, Some(_)) => Err(StoreError::Exists { key: key.clone() }),
                (Op::Create { object, .. }, None) => Ok((EventType::Added, object)),
                (Op::Update { .. } | Op::Delete { .. }, None) => Err(StoreError::NotFound { key: key.clone() }),
                (Op::Update { expected, object, .. }, Some(cur)) => {
                    if cur.rv == expected {
                        Ok((EventType::Modified, object))
                    } else {
                        Err(StoreError::Conflict { key: key.clone(), expected, actual: cur.rv })
                    }
                }
                (Op::Delete { expected, .. }, Some(cur)) => {
                    if cur.rv == expected {
                        Ok((EventType::Deleted, cur.object.value()))
                    } else {
                        Err(StoreError::Conflict { key: key.clone(), expected, actual: cur.rv })
                    }
                }
            };
            match decided {
                Err(e) => {
                    answers.push((w.reply, Err(e)));
                }
                Ok((kind, mut object)) => {
                    revision += 1;
                    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.insert("resourceVersion".into(), Value::String(revision.to_string()));
                    }
                    let object = Doc::new(&object);
                    let stored = (kind != EventType::Deleted).then(|| Stored { rv: revision, object: object.clone() });
                    overlay.insert(key.clone(), stored);
                    accepted.push((Event { rv: revision, key, kind, object }, w.reply));
                }
            }
        }
        if accepted.is_empty() {
            return;
        }
        if let Err(refused) = self.store_batch(&accepted, revision) {
            for (_, reply) in accepted {
                answers.push((reply, Err(refused.error(&self.path))));
            }
            return;
        }
        let mut st = self.state.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The committed revision first: should anything below panic (a subscription's filter),
        // later batches still number after what the database holds, instead of failing on a
        // revision it has.
        st.revision = revision;
        for (event, _) in &accepted {
            match event.kind {
                EventType::Deleted => {
                    st.objects.remove(&event.key);
                }
                _ => {
                    st.objects.insert(event.key.clone(), Stored { rv: event.rv, object: event.object.clone() });
                }
            }
            st.log.push_back(event.clone());
            // No receiver is not an error: nobody is watching.
            let _ = self.events.send(event.clone());
            for sub in st.subscriptions.iter().filter(|s| (s.wants)(event)) {
                let _ = sub.tx.send(event.clone());
            }
        }
        st.subscriptions.retain(|s| s.tx.receiver_count() > 0);
        while st.log.len() > self.window {
            if let Some(e) = st.log.pop_front() {
                st.oldest = e.rv;
            }
        }
        drop(st);
        for (event, reply) in accepted {
            answers.push((reply, Ok(event)));
        }
    }

    /// Checks the free space, then writes the batch in one transaction. On any failure nothing
    /// of it is stored and the connection is left ready for the next batch.
    fn store_batch(&mut self, accepted: &[(Event, oneshot::Sender<Result<Event, StoreError>>)], revision: u64) -> Result<(), Refused> {
        let total = accepted.iter().map(|(e, _)| e.object.bytes().len() as u64).sum::<u64>();
        if let Err(e) = self.space.check(total, accepted.len() as u64) {
            tracing::warn!("refusing {} write(s): {e}", accepted.len());
            return Err(Refused::Space(e));
        }
        let Err(source) = self.persist(accepted, revision) else { return Ok(()) };
        // A failed COMMIT may leave the transaction open (SQLite keeps it after some errors):
        // close it, or every later batch would fail to begin.
        if !self.conn.is_autocommit() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::error!("the store {}: cannot roll back a failed commit: {e}", self.path.display());
            }
        }
        let message = source.to_string();
        tracing::warn!(
            "the store {}: a commit of {} write(s) failed, nothing of it was stored: {message}",
            self.path.display(),
            accepted.len()
        );
        if source.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            Err(Refused::Full(message))
        } else {
            Err(Refused::Commit(message))
        }
    }

    fn persist(&mut self, accepted: &[(Event, oneshot::Sender<Result<Event, StoreError>>)], revision: u64) -> rusqlite::Result<()> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            // An upsert, not `INSERT OR REPLACE`: REPLACE deletes the row and inserts it under a
            // new rowid, which rewrites the key's index page too; an update in place writes only
            // the row's page (one WAL page less per commit, which a slow disk's fsync feels).
            let mut put = tx.prepare_cached(
                "INSERT INTO objects (key, rv, value) VALUES (?1, ?2, ?3) ON CONFLICT (key) DO UPDATE SET rv = excluded.rv, value = excluded.value",
            )?;
            let mut del = tx.prepare_cached("DELETE FROM objects WHERE key = ?1")?;
            let mut log = tx.prepare_cached("INSERT INTO log (rv, key, type, value) VALUES (?1, ?2, ?3, ?4)")?;
            for (e, _) in accepted {
                let bytes = &e.object.bytes()[..];
                let rv = i64::try_from(e.rv).unwrap_or(i64::MAX);
                if e.kind == EventType::Deleted {
                    del.execute([&e.key])?;
                } else {
                    put.execute(params![e.key, rv, bytes])?;
                }
                log.execute(params![rv, e.key, e.kind.code(), bytes])?;
            }
            // No `meta` row: the newest log row is the revision (see `Store::open`).
            // Keep the persisted changelog near the window; trimming in steps keeps it cheap. The
            // newest row always stays (it carries the revision), whatever the window.
            let rev = i64::try_from(revision).unwrap_or(i64::MAX);
            let window = i64::try_from(self.window.max(1)).unwrap_or(i64::MAX);
            if rev % 256 == 0 || accepted.len() > 64 {
                tx.prepare_cached("DELETE FROM log WHERE rv <= ?1")?.execute([rev - window])?;
            }
        }
        tx.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name}})
    }

    #[tokio::test]
    async fn revisions_are_global_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let cfg = StoreConfig::default();
        {
            let s = Store::open(&path, &cfg).unwrap();
            let a = s.write(Op::Create { key: "a".into(), object: obj("a") }).await.unwrap();
            let b = s.write(Op::Create { key: "b".into(), object: obj("b") }).await.unwrap();
            assert_eq!((a.rv, b.rv), (1, 2));
            let err = s.write(Op::Update { key: "a".into(), expected: 7, object: obj("a") }).await.unwrap_err();
            assert!(matches!(err, StoreError::Conflict { actual: 1, .. }));
            s.write(Op::Delete { key: "b".into(), expected: 2 }).await.unwrap();
        }
        let s = Store::open(&path, &cfg).unwrap();
        assert_eq!(s.revision(), 3);
        assert_eq!(s.get("a").unwrap().object.value()["metadata"]["resourceVersion"], "1");
        assert!(s.get("b").is_none());
        let (backlog, _) = s.watch(1).unwrap();
        assert_eq!(backlog.iter().map(|e| (e.rv, e.kind)).collect::<Vec<_>>(), [(2, EventType::Added), (3, EventType::Deleted)]);
    }

    /// A lone writer commits inline; then writers racing on one key and on their own, on two
    /// worker threads, go through the writer thread. Every acknowledged compare-and-swap counted
    /// once, none lost, revisions gapless across both paths, all of it on disk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_writers_inline_and_through_the_thread_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let s = Store::open(&path, &StoreConfig::default()).unwrap();
        let counter = |n: u64| json!({"metadata": {"name": "c"}, "n": n});
        // One writer at a time: inline from the second write on.
        let mut rv = s.write(Op::Create { key: "c".into(), object: counter(0) }).await.unwrap().rv;
        for _ in 0..3 {
            rv = s.write(Op::Update { key: "c".into(), expected: rv, object: counter(0) }).await.unwrap().rv;
        }
        assert_eq!(s.shared.inline_batches.load(Ordering::Relaxed), 3, "a lone writer commits inline, after its first write");
        let threaded = s.shared.thread_batches.load(Ordering::Relaxed);
        let (writers, each) = (16_u64, 25_u64);
        let mut tasks = Vec::new();
        for w in 0..writers {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let own = format!("own/{w}");
                let mut rv = s.write(Op::Create { key: own.clone(), object: obj("o") }).await.unwrap().rv;
                let mut conflicts = 0;
                for _ in 0..each {
                    rv = s.write(Op::Update { key: own.clone(), expected: rv, object: obj("o") }).await.unwrap().rv;
                    loop {
                        let cur = s.get("c").unwrap();
                        let n = cur.object.value()["n"].as_u64().unwrap();
                        match s.write(Op::Update { key: "c".into(), expected: cur.rv, object: counter(n + 1) }).await {
                            Ok(_) => break,
                            Err(StoreError::Conflict { .. }) => conflicts += 1,
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                conflicts
            }));
        }
        let mut conflicts = 0;
        for t in tasks {
            conflicts += t.await.unwrap();
        }
        assert!(s.shared.thread_batches.load(Ordering::Relaxed) > threaded, "racing writers go through the thread");
        let total = 4 + writers * (1 + 2 * each);
        assert_eq!(s.revision(), total, "one revision per acknowledged write");
        assert_eq!(s.get("c").unwrap().object.value()["n"], writers * each, "no increment lost ({conflicts} conflicts retried)");
        let (backlog, _) = s.watch(0).unwrap();
        assert_eq!(backlog.iter().map(|e| e.rv).collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>(), "gapless, in order");
        drop(s);
        let reopened = Store::open(&path, &StoreConfig::default()).unwrap();
        assert_eq!(reopened.revision(), total);
        assert_eq!(reopened.get("c").unwrap().object.value()["n"], writers * each);
    }

    #[tokio::test]
    async fn a_subscription_gets_the_events_it_wants_in_order_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("s.db"), &StoreConfig::default()).unwrap();
        s.write(Op::Create { key: "a/before".into(), object: obj("x") }).await.unwrap();
        let mut rx = s.subscribe(|e| e.key.starts_with("a/") || e.kind == EventType::Deleted);
        let dropped = s.subscribe(|_| true);
        drop(dropped);
        let b = s.write(Op::Create { key: "b/1".into(), object: obj("x") }).await.unwrap();
        s.write(Op::Create { key: "a/1".into(), object: obj("x") }).await.unwrap();
        s.write(Op::Update { key: "b/1".into(), expected: b.rv, object: obj("y") }).await.unwrap();
        let gone = s.get("b/1").unwrap().rv;
        s.write(Op::Delete { key: "b/1".into(), expected: gone }).await.unwrap();
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push((e.key, e.kind));
        }
        assert_eq!(
            got,
            [("a/1".to_owned(), EventType::Added), ("b/1".to_owned(), EventType::Deleted)],
            "not b's create or update, nor what came before"
        );
        assert_eq!(s.read().subscriptions.len(), 1, "a dropped subscription's channel is let go at the next write");
    }

    #[tokio::test]
    async fn a_watch_older_than_the_window_is_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("s.db"), &StoreConfig { watch_window: 3, broadcast_capacity: 16, ..StoreConfig::default() })
            .unwrap();
        for i in 0..6 {
            s.write(Op::Create { key: format!("k{i}"), object: obj("x") }).await.unwrap();
        }
        assert!(matches!(s.watch(2), Err(StoreError::Compacted { oldest: 3, .. })));
        assert_eq!(s.watch(3).unwrap().0.len(), 3);
    }

    #[tokio::test]
    async fn a_second_opener_is_refused_by_name_until_the_first_has_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let first = Store::open(&path, &StoreConfig::default()).unwrap();
        first.write(Op::Create { key: "a".into(), object: obj("a") }).await.unwrap();
        let err = Store::open(&path, &StoreConfig::default()).err().expect("a second store on the same file is refused");
        assert!(matches!(err, StoreError::InUse { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()) && msg.contains("--data-dir"), "{msg}");
        // The first store still writes; once it has closed, the file opens with both writes and
        // nothing else (revision 2).
        first.write(Op::Create { key: "b".into(), object: obj("b") }).await.unwrap();
        drop(first);
        let again = Store::open(&path, &StoreConfig::default()).expect("reopened once the first has closed");
        assert_eq!((again.revision(), again.get("a").is_some(), again.get("b").is_some()), (2, true, true));
    }

    #[tokio::test]
    async fn the_revision_survives_a_trimmed_log_and_an_older_stores_meta_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        // Window 1 with 300 writes, the last a deletion: the trim runs at revision 256 and the
        // newest log row (the deletion, whose object is gone) is all that says 301.
        let cfg = StoreConfig { watch_window: 1, ..StoreConfig::default() };
        {
            let s = Store::open(&path, &cfg).unwrap();
            for i in 0..300 {
                s.write(Op::Create { key: format!("k{i}"), object: obj("x") }).await.unwrap();
            }
            s.write(Op::Delete { key: "k299".into(), expected: 300 }).await.unwrap();
        }
        let rows: i64 = Connection::open(&path).unwrap().query_row("SELECT count(*) FROM log", [], |r| r.get(0)).unwrap();
        assert!(rows < 300, "the log was trimmed ({rows} rows)");
        let s = Store::open(&path, &cfg).unwrap();
        assert_eq!(s.revision(), 301, "the deletion's revision, from the log");
        assert_eq!(s.write(Op::Create { key: "n".into(), object: obj("n") }).await.unwrap().rv, 302);
        drop(s);

        // A store from before: its revision in `meta`, newer than any row left.
        let old = dir.path().join("old.db");
        {
            let c = Connection::open(&old).unwrap();
            c.execute_batch(SCHEMA).unwrap();
            c.execute(
                "INSERT INTO objects (key, rv, value) VALUES ('a', 4, ?1)",
                [br#"{"metadata":{"name":"a","resourceVersion":"4"}}"#.as_slice()],
            )
            .unwrap();
            c.execute("INSERT INTO meta (k, v) VALUES ('revision', 9)", []).unwrap();
        }
        let s = Store::open(&old, &cfg).unwrap();
        assert_eq!(s.revision(), 9);
        assert_eq!(
            s.write(Op::Update { key: "a".into(), expected: 4, object: obj("a") }).await.unwrap().rv,
            10,
            "never an older revision again"
        );
    }
}
