//! Passwords: stored only as salted argon2 hashes (PHC strings); checked off the async threads.
//!
//! HTTP Basic sends the password with every request, and an argon2 check is deliberately slow
//! (tens of milliseconds). So a successful check is remembered as a keyed digest —
//! HMAC-SHA-256 under a key drawn at process start — of user name and password, together with
//! the account's version: the next request with the same credentials costs one HMAC and a
//! constant-time compare. A changed password, role or account (a new Secret resourceVersion)
//! forgets it. Nothing in memory or on disk holds a password in clear.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Why a password could not be hashed (never for a valid password and a working RNG).
#[derive(Debug, thiserror::Error)]
#[error("cannot hash the password: {0}")]
pub struct HashError(String);

impl HashError {
    pub(crate) fn new(why: String) -> HashError {
        HashError(why)
    }
}

/// A salted argon2id hash of `password` (default parameters: 19 MiB, 2 passes).
///
/// # Errors
/// When argon2 refuses its input (it does not for passwords within the length limits).
pub fn hash(password: &str) -> Result<String, HashError> {
    let salt_bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes).map_err(|e| HashError(e.to_string()))?;
    Argon2::default().hash_password(password.as_bytes(), &salt).map(|h| h.to_string()).map_err(|e| HashError(e.to_string()))
}

/// Whether `password` matches the PHC string `hash` (a malformed hash matches nothing).
#[must_use]
pub fn verify(hash: &str, password: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|h| Argon2::default().verify_password(password.as_bytes(), &h).is_ok())
}

/// A hash of a random password: checked against when the user does not exist, so an unknown
/// user name costs the same time as a wrong password (no user enumeration by timing).
pub static DUMMY: LazyLock<String> = LazyLock::new(|| {
    let random: [u8; 16] = rand::random();
    hash(&format!("{random:?}")).unwrap_or_default()
});

/// A random password for the first `admin` (24 characters, ~143 bits).
#[must_use]
pub fn random_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    (0..24).map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())])).collect()
}

/// The keyed digests of credentials already verified (see the module docs).
pub struct Verified {
    key: [u8; 32],
    /// user name -> (account version, digest).
    entries: Mutex<HashMap<String, (String, [u8; 32])>>,
}

impl Default for Verified {
    fn default() -> Self {
        Verified { key: rand::random(), entries: Mutex::new(HashMap::new()) }
    }
}

impl Verified {
    fn digest(&self, user: &str, password: &str) -> [u8; 32] {
        // An HMAC takes a key of any length: `new_from_slice` cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(user.as_bytes());
        mac.update(&[0]);
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Whether these credentials were verified for this version of the account.
    #[must_use]
    pub fn known(&self, user: &str, version: &str, password: &str) -> bool {
        let d = self.digest(user, password);
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(user).is_some_and(|(v, known)| v == version && bool::from(known.ct_eq(&d)))
    }

    /// Remembers credentials that argon2 accepted.
    pub fn remember(&self, user: &str, version: &str, password: &str) {
        let d = self.digest(user, password);
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).insert(user.to_owned(), (version.to_owned(), d));
    }

    /// Forgets an account's credentials (a changed or deleted account). Never called for a failed
    /// attempt: a wrong password does not match the digest anyway, and forgetting it would let
    /// anyone push the legitimate client into the throttled slow path.
    pub fn forget(&self, user: &str) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).remove(user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_verifies_its_password_only() {
        let h = hash("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify(&h, "correct horse"));
        assert!(!verify(&h, "correct horsf"));
        assert!(!verify("not a hash", "correct horse"));
        assert_ne!(hash("correct horse").unwrap(), h, "salted");
    }

    #[test]
    fn verified_credentials_are_forgotten_when_the_account_changes() {
        let v = Verified::default();
        v.remember("admin", "7", "pw");
        assert!(v.known("admin", "7", "pw"));
        assert!(!v.known("admin", "7", "other"));
        assert!(!v.known("admin", "8", "pw"), "a new account version");
        assert!(!v.known("root", "7", "pw"));
        v.forget("admin");
        assert!(!v.known("admin", "7", "pw"));
    }

    #[test]
    fn random_passwords_are_long_and_differ() {
        let (a, b) = (random_password(), random_password());
        assert_eq!(a.len(), 24);
        assert_ne!(a, b);
    }
}
