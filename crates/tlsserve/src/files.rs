//! Who may read the data dir: the API server's store and credentials are private to the user
//! that runs it.
//!
//! # Decisions
//! - The data dir and `pki/` are created with mode 0700. If they exist with group or other
//!   permissions they are tightened to 0700 (with a warning): they hold the store, the CA key and
//!   the token, and nothing else should read them.
//! - A data dir owned by another user is refused with an error naming the owner and the fix: a
//!   directory someone else controls could be swapped or read under us (and `root` would
//!   otherwise write its credentials into a user's directory).
//! - The store file is created 0600 before SQLite opens it: SQLite gives its `-wal` and `-shm`
//!   files the mode of the database file, so they are 0600 too. Existing ones are tightened.
//!
//! # Caveats
//! Files are created with `mode & !umask`, so a stricter umask makes them stricter still.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Errors preparing the data dir.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read the metadata of {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a directory: give --data-dir a directory (or a path that does not exist yet)")]
    NotADir { path: PathBuf },
    #[error(
        "the data dir {p} is owned by {owner}, not by {me} who runs virtplug: it holds the store, the CA key and the \
         token, so virtplug only uses a directory of its own user. Use another data dir (--data-dir), or, if this one \
         should be yours, run `chown -R {me_uid} {p}`",
        p = .path.display()
    )]
    Foreign { path: PathBuf, owner: String, me: String, me_uid: u32 },
    #[error("cannot restrict the permissions of {path} to {mode:o}")]
    Chmod {
        path: PathBuf,
        mode: u32,
        #[source]
        source: io::Error,
    },
}

/// Makes sure `path` is a directory of this user with mode 0700: creates it so (its missing
/// parents with the default mode), refuses one owned by another user, tightens a looser one.
///
/// # Errors
/// `Create`, `Stat`, `NotADir`, `Foreign` (with the owner and the fix) or `Chmod`.
pub fn private_dir(path: &Path) -> Result<(), FileError> {
    let create = |source| FileError::Create { path: path.to_owned(), source };
    if !path.exists() {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(create)?;
        }
        match fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            // Created meanwhile by someone else: checked below like any existing dir.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(create(e)),
        }
    }
    let meta = fs::metadata(path).map_err(|source| FileError::Stat { path: path.to_owned(), source })?;
    if !meta.is_dir() {
        return Err(FileError::NotADir { path: path.to_owned() });
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(FileError::Foreign { path: path.to_owned(), owner: describe_user(meta.uid()), me: describe_user(me), me_uid: me });
    }
    tighten(path, meta.mode(), 0o700)
}

/// Makes sure the file `path` exists with no group or other permissions: creates it empty with
/// mode 0600 (`O_CREAT|O_EXCL`), or tightens an existing one.
///
/// # Errors
/// `Create`, `Stat` or `Chmod`.
pub fn private_file(path: &Path) -> Result<(), FileError> {
    match fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => tighten_existing(path, 0o600),
        Err(source) => Err(FileError::Create { path: path.to_owned(), source }),
    }
}

/// Removes group and other permissions from `path` (to `mode`) if it exists with any.
///
/// # Errors
/// `Stat` (other than "not found") or `Chmod`.
pub fn tighten_existing(path: &Path, mode: u32) -> Result<(), FileError> {
    match fs::metadata(path) {
        Ok(meta) => tighten(path, meta.mode(), mode),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FileError::Stat { path: path.to_owned(), source }),
    }
}

fn tighten(path: &Path, current: u32, mode: u32) -> Result<(), FileError> {
    if current & 0o077 == 0 {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|source| FileError::Chmod {
        path: path.to_owned(),
        mode,
        source,
    })?;
    tracing::warn!("{} was readable by other users (mode {:o}): restricted it to {mode:o}", path.display(), current & 0o7777);
    Ok(())
}

/// `uid N (name)`, the name from `/etc/passwd` when it has one.
fn describe_user(uid: u32) -> String {
    let name = fs::read_to_string("/etc/passwd").ok().and_then(|passwd| {
        passwd.lines().find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_owned())
        })
    });
    match name {
        Some(n) => format!("uid {uid} ({n})"),
        None => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn dirs_are_created_private_and_loose_ones_tightened() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b/data");
        private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        let f = d.join("store.db");
        private_file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        private_file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        assert!(matches!(private_dir(&f), Err(FileError::NotADir { .. })));
        tighten_existing(&d.join("missing"), 0o600).unwrap();
    }

    #[test]
    fn users_are_described_by_name() {
        assert_eq!(describe_user(0), "uid 0 (root)");
        assert_eq!(describe_user(4_000_000_000), "uid 4000000000");
    }
}
