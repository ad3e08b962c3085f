//! Redfish sessions (DSP0266 §13.3.4): `POST /redfish/v1/SessionService/Sessions` with
//! `UserName`/`Password` gives a token (`X-Auth-Token`) and a session resource (`Location`);
//! `DELETE` of that resource logs out; a session unused for `SessionTimeout` seconds ends.
//!
//! # Guarantees
//! - Tokens are 256 random bits; only their SHA-256 digest is kept (a lookup never compares a
//!   token byte by byte, and a memory dump shows no usable token).
//! - A session is checked against its account on every use ([`crate::auth`]): a deleted or
//!   disabled account's sessions stop working at once, and so do they when the account's
//!   password changes or the account is deleted and recreated under the same name (the session
//!   remembers the account's [identity](crate::accounts::Account::identity), not just its name).
//!   Changing one's own password through a session thus ends that session too.
//! - At most [`MAX_SESSIONS`] sessions exist, and at most [`MAX_PER_ACCOUNT`] of one account (so
//!   one account cannot use up the sessions of everyone); beyond either a login is refused with
//!   `SessionLimitExceeded`. Expired sessions are swept first, and so are the account's sessions
//!   of an earlier identity (they can never be used again).
//!
//! # Caveats
//! Sessions live in the service's memory: after a restart of the service (or of `up`) every
//! token from before is refused with 401, and the client logs in again — as sushy and Ironic do
//! on a 401 (they re-authenticate once and retry).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// Most sessions at once.
pub const MAX_SESSIONS: usize = 1024;
/// Most sessions of one account at once.
pub const MAX_PER_ACCOUNT: usize = 64;
/// Default and limits of `SessionTimeout` (seconds; the schema's range is 30..=86400).
pub const DEFAULT_TIMEOUT: u64 = 1800;
pub const MIN_TIMEOUT: u64 = 30;
pub const MAX_TIMEOUT: u64 = 86400;

/// A session as the resource shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub user: String,
    /// The [identity](crate::accounts::Account::identity) of the account it was opened for.
    pub account: [u8; 32],
    /// RFC 3339.
    pub created: String,
}

struct Entry {
    session: Session,
    last_used: Instant,
}

/// The live sessions.
pub struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Entry>>,
    timeout_secs: AtomicU64,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    #[must_use]
    pub fn new(timeout_secs: u64) -> Sessions {
        Sessions { by_digest: Mutex::new(HashMap::new()), timeout_secs: AtomicU64::new(timeout_secs.clamp(MIN_TIMEOUT, MAX_TIMEOUT)) }
    }

    /// The idle timeout.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.load(Ordering::Relaxed))
    }

    /// Sets the idle timeout (callers validate the range).
    pub fn set_timeout(&self, secs: u64) {
        self.timeout_secs.store(secs.clamp(MIN_TIMEOUT, MAX_TIMEOUT), Ordering::Relaxed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Entry>> {
        self.by_digest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a session for `user`, whose account has `identity`: its token, and the session.
    /// `None` when the service's or the account's limit is reached.
    #[must_use]
    pub fn create(&self, user: &str, identity: [u8; 32]) -> Option<(String, Session)> {
        let token = hex(&rand::random::<[u8; 32]>());
        let id = hex(&rand::random::<[u8; 12]>());
        let now = Instant::now();
        let timeout = self.timeout();
        let mut map = self.lock();
        let of_account = |map: &HashMap<[u8; 32], Entry>| map.values().filter(|e| e.session.user == user).count();
        if map.len() >= MAX_SESSIONS || of_account(&map) >= MAX_PER_ACCOUNT {
            map.retain(|_, e| now.duration_since(e.last_used) < timeout && (e.session.user != user || e.session.account == identity));
            if map.len() >= MAX_SESSIONS || of_account(&map) >= MAX_PER_ACCOUNT {
                return None;
            }
        }
        let session = Session { id, user: user.to_owned(), account: identity, created: jiff::Timestamp::now().to_string() };
        map.insert(digest(&token), Entry { session: session.clone(), last_used: now });
        Some((token, session))
    }

    /// The session of `token`, if it is live (its idle clock restarts); an expired one is
    /// removed.
    #[must_use]
    pub fn authenticate(&self, token: &str) -> Option<Session> {
        let d = digest(token);
        let now = Instant::now();
        let timeout = self.timeout();
        let mut map = self.lock();
        let expired = map.get(&d).is_some_and(|e| now.duration_since(e.last_used) >= timeout);
        if expired {
            map.remove(&d);
            return None;
        }
        let e = map.get_mut(&d)?;
        e.last_used = now;
        Some(e.session.clone())
    }

    /// Ends the session of `token` (its account is gone, disabled or not the same account).
    pub fn end_token(&self, token: &str) {
        self.lock().remove(&digest(token));
    }

    /// The live sessions, ordered by id.
    #[must_use]
    pub fn list(&self) -> Vec<Session> {
        let now = Instant::now();
        let timeout = self.timeout();
        let mut out: Vec<Session> =
            self.lock().values().filter(|e| now.duration_since(e.last_used) < timeout).map(|e| e.session.clone()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The live session `id`.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Session> {
        self.list().into_iter().find(|s| s.id == id)
    }

    /// Ends session `id`; whether it existed.
    pub fn delete(&self, id: &str) -> bool {
        let mut map = self.lock();
        let before = map.len();
        map.retain(|_, e| e.session.id != id);
        map.len() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: [u8; 32] = [1; 32];

    #[tokio::test(start_paused = true)]
    async fn a_session_expires_after_its_idle_timeout() {
        let s = Sessions::new(60);
        let (token, session) = s.create("admin", ID).unwrap();
        assert_eq!(s.authenticate(&token).unwrap(), session);
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(s.authenticate(&token).is_some(), "use restarts the idle clock");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(s.authenticate(&token).is_some());
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(s.authenticate(&token).is_none());
        assert!(s.list().is_empty());
    }

    #[tokio::test]
    async fn delete_logs_out_and_tokens_are_distinct() {
        let s = Sessions::new(DEFAULT_TIMEOUT);
        let (t1, a) = s.create("admin", ID).unwrap();
        let (t2, b) = s.create("admin", ID).unwrap();
        assert_ne!(t1, t2);
        assert_ne!(a.id, b.id);
        assert!(s.delete(&a.id));
        assert!(!s.delete(&a.id));
        assert!(s.authenticate(&t1).is_none());
        assert!(s.authenticate(&t2).is_some());
        assert!(s.authenticate("not a token").is_none());
    }

    #[test]
    fn the_timeout_stays_in_the_schema_range() {
        let s = Sessions::new(5);
        assert_eq!(s.timeout(), Duration::from_secs(MIN_TIMEOUT));
        s.set_timeout(1_000_000);
        assert_eq!(s.timeout(), Duration::from_secs(MAX_TIMEOUT));
    }

    #[tokio::test(start_paused = true)]
    async fn one_account_cannot_take_every_session() {
        let s = Sessions::new(60);
        let mine: Vec<_> = (0..MAX_PER_ACCOUNT).map(|_| s.create("greedy", ID).unwrap()).collect();
        assert!(s.create("greedy", ID).is_none(), "the account's limit");
        assert!(s.create("other", ID).is_some(), "another account still logs in");
        assert!(s.delete(&mine[0].1.id));
        assert!(s.create("greedy", ID).is_some(), "a logout makes room");
        assert!(s.create("greedy", ID).is_none());
        // Expired sessions are swept before the account is refused.
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(s.create("greedy", ID).is_some());
    }

    #[tokio::test]
    async fn sessions_of_an_earlier_identity_do_not_count() {
        let s = Sessions::new(DEFAULT_TIMEOUT);
        for _ in 0..MAX_PER_ACCOUNT {
            s.create("recreated", ID).unwrap();
        }
        assert!(s.create("recreated", ID).is_none());
        let (_, fresh) = s.create("recreated", [2; 32]).expect("the old account's sessions are swept");
        assert_eq!(s.list().iter().filter(|x| x.user == "recreated").collect::<Vec<_>>(), [&fresh]);
    }
}
